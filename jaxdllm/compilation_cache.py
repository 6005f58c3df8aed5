"""JAX's persistent compilation cache, turned on for the `jaxdllm` command line and the notebooks.

A compiled sampling loop or train step is written to a folder keyed by the program, its shapes,
the JAX version and the device, so a second process with the same shapes loads it instead of
compiling again (at 8B, the first call of a sampler otherwise spends 12-28 s compiling).

The folder, in order of precedence: the `path` argument, `$JAXDLLM_COMPILATION_CACHE`, then
`~/.cache/jaxdllm/xla`. `JAXDLLM_COMPILATION_CACHE=off` (or `0`, `false`, `none`, empty) keeps
everything in memory, as plain JAX does. A folder that JAX's own `jax_compilation_cache_dir`
already names (set by the user before) is left as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "JAXDLLM_COMPILATION_CACHE"
DEFAULT_DIR = Path("~/.cache/jaxdllm/xla")
_OFF = {"", "0", "off", "false", "none", "no"}


def compilation_cache_dir(path: str | os.PathLike | None = None) -> Path | None:
    """The folder `enable_compilation_cache(path)` would use, or None when the cache is off."""
    if path is None:
        path = os.environ.get(ENV, str(DEFAULT_DIR))
    if str(path).strip().lower() in _OFF:
        return None
    return Path(path).expanduser()


def enable_compilation_cache(path: str | os.PathLike | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache; returns the folder, or None when it is off.

    Args:
      path: the cache folder (created if missing); None reads `$JAXDLLM_COMPILATION_CACHE`, else
        `~/.cache/jaxdllm/xla`; `"off"` turns the cache off.

    Call it before the first compilation; programs compiled earlier in the process are not
    written. JAX writes only programs that took at least `jax_persistent_cache_min_compile_time_secs`
    (default 1 s; environment `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`) to compile, so small
    helper jits do not fill the folder. An uncreatable folder turns the cache off with a warning
    instead of failing the run.
    """
    import warnings

    import jax

    if jax.config.jax_compilation_cache_dir:  # the user's own JAX setting wins
        return Path(jax.config.jax_compilation_cache_dir)
    folder = compilation_cache_dir(path)
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        warnings.warn(f"compilation cache folder {folder} cannot be created ({e}); compiling without it "
                      f"(set {ENV}=off to silence this)", stacklevel=2)
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    return folder
