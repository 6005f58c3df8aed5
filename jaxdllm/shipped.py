"""The models and recipes that come with jaxdllm, found by name from any working folder.

A source checkout (`pip install -e .`, and Colab's clone) holds `checkpoints/` (small models this
project trained) and `training/` (recipes) beside the `jaxdllm` package. Paths written relative
to the repository root, such as `checkpoints/tasks-llada-small` in a recipe or a notebook, work
only when the process starts there; these functions resolve them from anywhere:

    checkpoint_dir("tasks-llada-small")                    # a shipped name
    checkpoint_dir("checkpoints/tasks-llada-small")        # the root-relative spelling, from any folder
    checkpoint_dir("/models/LLaDA-8B-Instruct")            # any existing folder, unchanged
    recipe_path("tasks_tiny_cpu")                          # training/tasks_tiny_cpu.toml

An existing path always wins over a shipped name. `$JAXDLLM_ROOT` names a copy of the
repository that is searched first (a wheel install has no `checkpoints/` of its own); each of
`checkpoints/` and `training/` comes from the first root that has it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from jaxdllm.errors import ConfigError

ROOT_ENV = "JAXDLLM_ROOT"


def _roots() -> list[Path]:
    roots = []
    if os.environ.get(ROOT_ENV):
        root = Path(os.environ[ROOT_ENV]).expanduser()
        if (root / "checkpoints").is_dir() or (root / "training").is_dir():
            roots.append(root)
        else:
            warnings.warn(f"${ROOT_ENV}={root} has neither checkpoints/ nor training/; ignored")
    return roots + [Path(__file__).resolve().parent.parent]


def shipped_folder(folder: str) -> Path | None:
    """The shipped `checkpoints` or `training` folder: from `$JAXDLLM_ROOT` if it has one, else
    from the source checkout this package was imported from; None in a wheel install."""
    return next((root / folder for root in _roots() if (root / folder).is_dir()), None)


def repository_root() -> Path | None:
    """The repository this package was imported from (or `$JAXDLLM_ROOT`): the parent of the
    shipped `checkpoints/` or `training/`; None when there is neither (a wheel install)."""
    folder = shipped_folder("checkpoints") or shipped_folder("training")
    return None if folder is None else folder.parent


def shipped_checkpoints() -> list[str]:
    """Names of the shipped checkpoints (folders of `checkpoints/` with a `config.json`)."""
    folder = shipped_folder("checkpoints")
    return [] if folder is None else sorted(p.name for p in folder.glob("*") if (p / "config.json").is_file())


def shipped_recipes() -> list[str]:
    """Names of the shipped recipes (`training/*.toml`, without the suffix)."""
    folder = shipped_folder("training")
    return [] if folder is None else sorted(p.stem for p in folder.glob("*.toml"))


def shipped_checkpoint(name: str) -> Path | None:
    """A shipped checkpoint's folder by name, whatever the working folder holds; None if absent."""
    return _shipped(name, "checkpoints")


def _shipped(reference: str, folder: str, suffix: str = "") -> Path | None:
    """`reference` as `NAME` or `folder/NAME` (with or without `suffix`) inside the repository."""
    base = shipped_folder(folder)
    if base is None:
        return None
    name = Path(reference)
    if len(name.parts) == 2 and name.parts[0] == folder:
        name = Path(name.parts[1])
    if len(name.parts) != 1:
        return None
    for candidate in (base / name, base / f"{name}{suffix}"):
        if candidate.exists():
            return candidate
    return None


def checkpoint_dir(reference: str | os.PathLike) -> Path:
    """The checkpoint folder for `reference`: an existing path as given, else a shipped name
    (`tasks-llada-small` or `checkpoints/tasks-llada-small`), else `reference` unchanged (loading
    it then fails with a `CheckpointError` that names the shipped checkpoints)."""
    path = Path(reference).expanduser()
    if path.exists():
        return path
    found = _shipped(str(reference), "checkpoints")
    return found if found is not None and found.is_dir() else path


def shipped_hint() -> str:
    """A clause for errors about a missing checkpoint: which names would have worked."""
    names = shipped_checkpoints()
    if names:
        return f"shipped checkpoints, loadable by name from any folder: {', '.join(names)}"
    return f"no shipped checkpoints here: they come with a source checkout (or set ${ROOT_ENV} to one)"


def recipe_path(reference: str | os.PathLike) -> Path:
    """The recipe file for `reference`: an existing file as given, else a shipped recipe by name
    (`tasks_tiny_cpu`, `tasks_tiny_cpu.toml` or `training/tasks_tiny_cpu.toml`). Raises
    `ConfigError` naming the shipped recipes when it is neither."""
    path = Path(reference).expanduser()
    if path.is_file():
        return path
    found = _shipped(str(reference), "training", ".toml")
    if found is not None and found.is_file():
        return found
    names = shipped_recipes()
    shipped = f"shipped recipes: {', '.join(names)}" if names else "no shipped recipes here"
    raise ConfigError(f"recipe {reference} does not exist and is not a shipped recipe's name ({shipped})")
