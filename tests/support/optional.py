"""Torch and transformers (the test extra), imported when a test first uses them.

`from support.optional import torch, transformers` gives stand-ins for the two modules: the first
attribute read imports the real module and every later one reads from it, so with the extra
installed a test runs exactly as with `import torch`. Without it, the test (or fixture) that reads
an attribute skips with the reason, and every other test of its module runs.
`lazy("sampling.torch_reference.torch_port")` does the same for a module that imports torch at
its top: only a missing torch (or transformers) skips; any other import error fails as usual.
tests/test_torch_optional.py checks that no test module imports them at its top.
"""

from __future__ import annotations

import importlib

import pytest

REASON = "needs torch and transformers, the test extra: pip install -e '.[test]'"


def require(name: str):
    """The module `name` ("torch", "transformers", ...); without it the calling test skips."""
    return pytest.importorskip(name, reason=REASON)


class LazyModule:
    """A module imported on first attribute read; without the extra that read skips the test."""

    def __init__(self, name: str, needs: tuple[str, ...]):
        self._name, self._needs, self._module = name, needs, None

    def __getattr__(self, attr: str):
        if attr.startswith("_"):
            # pytest and inspect probe objects for private and dunder names (fixture markers,
            # __wrapped__) while collecting: answer them without importing anything.
            raise AttributeError(attr)
        if self._module is None:
            for name in self._needs:
                require(name)
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self):
        return f"<lazy module {self._name!r}>"


def lazy(name: str) -> LazyModule:
    """`name` imported on first use; it needs torch, and transformers where `name` is under it."""
    needs = ("torch", "transformers") if name.split(".")[0] == "transformers" else ("torch",)
    return LazyModule(name, needs)


torch = lazy("torch")
transformers = lazy("transformers")
