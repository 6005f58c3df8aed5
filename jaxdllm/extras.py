"""Optional dependencies, by pip extra: a missing one is one line naming the extra to install.

    pip install -e ".[eval]"        jaxdllm eval's Pareto plots, jaxdllm-lm-eval (lm-eval, matplotlib)
    pip install -e ".[notebooks]"   colab/ notebooks run locally (jupytext, nbclient, ipykernel, matplotlib)
    pip install -e ".[bench]"       sampling/ benchmarks (torch CPU, transformers, matplotlib)
    pip install -e ".[serve]"       jaxdllm serve, the OpenAI-compatible server (ray[serve], fastapi, openai)
    pip install -e ".[molecules]"   jaxdllm molecules and jaxdllm.molecules: GenMol (rdkit, safe-mol, matplotlib)
    pip install -e ".[test]"        the tests (pytest, torch CPU, transformers)

`jaxdllm generate`, `inspect`, `convert`, `train` and `distill` need no extra.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from jaxdllm.errors import ConfigError


class MissingExtraError(ConfigError, ImportError):
    """An optional dependency is not installed; the message names the pip extra that brings it."""


def missing_extra_message(module: str, extra: str, purpose: str) -> str:
    return f"{purpose} needs {module}, which is not installed: pip install -e \".[{extra}]\""


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import `module`, or raise `MissingExtraError` naming `extra` (e.g. "eval") and `purpose`."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] != module.split(".")[0]:
            raise  # the module is there but one of its own imports failed: show the real error
        raise MissingExtraError(missing_extra_message(module, extra, purpose)) from None


def exit_if_missing(modules: tuple[str, ...], extra: str, purpose: str) -> None:
    """For scripts: print one line naming `extra` and exit 2 when any of `modules` is missing."""
    import sys

    for module in modules:
        try:
            require(module, extra, purpose)
        except MissingExtraError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
