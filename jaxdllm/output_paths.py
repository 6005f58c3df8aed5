"""Output paths checked before any work: a command that would fail to write its results fails
first, in one line, and leaves nothing behind (nothing is created by the check)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from jaxdllm.errors import OutputPathError


def _can_write_in(folder: Path) -> bool:
    """Whether a file can be created in `folder` (tried, then removed: permission bits alone
    do not tell, e.g. for root on a read-only mount)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_creatable(path: Path, what: str, kind: str) -> None:
    """`path` does not exist: its nearest existing ancestor must be a writable folder."""
    anchor = _nearest_existing(path)
    if not anchor.is_dir():
        raise OutputPathError(f"{what} {path} cannot be created: {anchor} is a file, not a folder; "
                              f"choose a {kind} path outside it")
    if not _can_write_in(anchor):
        raise OutputPathError(f"{what} {path} cannot be created: {anchor} is not writable; choose a {kind} "
                              "where you can write, or change the permissions of that folder")


def check_output_dir(path: str | os.PathLike, what: str) -> Path:
    """`path` as a folder to write into: an existing writable folder, or creatable. Raises
    `OutputPathError` naming `what` (e.g. "--out") and the fix; creates nothing."""
    path = Path(path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise OutputPathError(f"{what} {path} is a file, but a folder is expected here: give a folder path "
                                  "(it is created if missing)")
        if not _can_write_in(path):
            raise OutputPathError(f"{what} {path} is not writable: choose a folder where you can write, or change "
                                  "its permissions")
        return path
    _check_creatable(path, what, "folder")
    return path


def check_output_file(path: str | os.PathLike, what: str) -> Path:
    """`path` as a file to write or append to (with sibling files next to it): an existing
    writable file, or creatable in a writable folder. Raises `OutputPathError`; creates nothing."""
    path = Path(path).expanduser()
    if path.exists():
        if path.is_dir():
            raise OutputPathError(f"{what} {path} is a folder, but a file is expected here: give a file path "
                                  "such as answers.jsonl")
        if not os.access(path, os.W_OK) or not _can_write_in(path.parent):
            raise OutputPathError(f"{what} {path} is not writable: choose another file, or change the permissions "
                                  "of the file and its folder")
        return path
    _check_creatable(path, what, "file")
    return path
