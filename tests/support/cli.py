"""The jaxdllm command line as a user runs it: a fresh process on one CPU device."""

from __future__ import annotations

import os
import subprocess
import sys

MODULE = "jaxdllm.cli"


def children_cache() -> str:
    """The command line's compilation cache folder for the test processes' children: `cli/` in the test
    processes' own cache folder (tests/conftest.py; its programs have other XLA flags), so children that
    run the same command load what an earlier one compiled (a user's second command does: the command
    line's cache is on by default), in this run and the next; `off` where the test processes' cache is off."""
    import jax

    folder = jax.config.jax_compilation_cache_dir
    return os.path.join(folder, "cli") if folder else "off"


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a child process: CPU, one device (no fake-device XLA_FLAGS), the command
    line's persistent compilation cache in `children_cache()` unless `extra` names another folder or
    `off`; `extra` is applied last."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXDLLM_COMPILATION_CACHE=children_cache())
    env.pop("XLA_FLAGS", None)
    env.update(extra)
    return env


def cli_command(*args) -> list[str]:
    """`python -m jaxdllm.cli ARGS...` (arguments converted with `str`)."""
    return [sys.executable, "-m", MODULE, *map(str, args)]


def run_cli(*args, timeout: float | None = None, cwd=None, env: dict[str, str] | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
    """Run the command line to the end; text stdout/stderr captured."""
    return subprocess.run(cli_command(*args), capture_output=True, text=True, env=env or cli_env(), cwd=cwd,
                          timeout=timeout, check=check)


def start_cli(*args, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """Start the command line in the background (e.g. to stop it mid-run); text pipes by default."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(cli_command(*args), text=True, env=env or cli_env(), **popen)
