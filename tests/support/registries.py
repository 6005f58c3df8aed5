"""The pieces jaxdllm registers itself, for contract tests parametrized over its registries.

Tests may register pieces of their own into the same registries (a policy written in a test
file); those are not the library's, and a contract test must not depend on which test file
pytest imported first, so they are left out here.
"""

from __future__ import annotations


def own(registry) -> list[str]:
    """Names in `registry` (a `jaxdllm.registry.Registry`) whose class lives in the package."""
    return [name for name, cls in registry.items() if cls.__module__.startswith("jaxdllm.")]


def policies() -> list[str]:
    from jaxdllm.decoding.policies import POLICIES
    return own(POLICIES)


def caches() -> list[str]:
    from jaxdllm.decoding.caches import CACHES
    return own(CACHES)


def canvases() -> list[str]:
    from jaxdllm.decoding.canvases import CANVASES
    return own(CANVASES)


def objectives() -> list[str]:
    from jaxdllm.train.objectives import OBJECTIVES
    return own(OBJECTIVES)


def data_sources() -> list[str]:
    from jaxdllm.train.data_sources import DATA_SOURCES
    return own(DATA_SOURCES)


def attention_backends() -> list[str]:
    """Every registered backend name (`auto` is a choice among them, not a backend)."""
    from jaxdllm.attention import implementations
    return [name for name in implementations() if name != "auto"]


# How each attention backend runs in the CPU tests: its `attend` options (the Pallas kernels run in
# interpret mode), or the platforms it needs (cuDNN has no CPU lowering). A backend registered
# without an entry here fails `test_every_attention_backend_agrees_with_the_reference`.
BACKEND_OPTIONS: dict[str, dict] = {
    "reference": {},
    "xla": {},
    "pallas": {"interpret": True},
    "splash": {"interpret": True},
    "cudnn": {"platforms": ("gpu", "cuda")},
}


def backend_options(name: str) -> dict:
    """`attend` options for backend `name` in tests; skips the test on a platform it cannot run on,
    and fails it (naming the table) for a backend without an entry."""
    import jax
    import pytest

    if name not in BACKEND_OPTIONS:
        pytest.fail(f"attention backend {name!r} is registered but has no entry in BACKEND_OPTIONS "
                    "(tests/support/registries.py): add one so the contract tests can run it")
    options = dict(BACKEND_OPTIONS[name])
    platforms = options.pop("platforms", None)
    if platforms is not None and jax.default_backend() not in platforms:
        pytest.skip(f"attention backend {name!r} runs on {platforms} only")
    return options
