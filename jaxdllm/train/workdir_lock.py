"""One training run per output folder: a lock file that a second run finds taken.

Two runs writing checkpoints and `metrics.jsonl` into one folder corrupt both (orbax's temporary
directories collide, metrics interleave, and what is left may not resume). The trainer takes an
exclusive POSIX lock on `<workdir>/.jaxdllm-train.lock` before it touches anything there; a second
run refuses with the first one's pid and host. The kernel drops the lock when its process ends,
however it ends (`kill -9` included), so a crashed run never leaves the folder locked. POSIX
locks belong to the process, so a second `Trainer` in the same process (a resume in a notebook)
may take it again.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from jaxdllm.errors import TrainingError

LOCK_FILE = ".jaxdllm-train.lock"


class WorkdirLock:
    """An exclusive lock on a training output folder, held until `release()` or process exit."""

    def __init__(self, workdir: Path):
        self.path = Path(workdir) / LOCK_FILE
        self._file = None

    def acquire(self) -> "WorkdirLock":
        """Take the lock; `TrainingError` naming the holder if another process has it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = _describe(handle.read())
            handle.close()
            raise TrainingError(f"{self.path.parent} is in use by another training run ({holder}); wait for "
                                "it to finish or pass another --workdir") from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S")}))
        handle.flush()
        self._file = handle
        return self

    def release(self) -> None:
        """Drop the lock (the file stays: removing it would race with a run taking it)."""
        if self._file is not None:
            fcntl.lockf(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def _describe(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
