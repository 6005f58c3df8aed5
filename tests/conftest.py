"""Test session setup: 8 fake CPU devices for mesh tests and exact fp32 matmuls."""

import os

# Must happen before jax is imported anywhere.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The command line turns on JAX's persistent compilation cache; tests that call it in this process
# or in children keep it off unless they name a folder themselves (tests/test_compilation_cache.py).
os.environ.setdefault("JAXDLLM_COMPILATION_CACHE", "off")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(autouse=True)
def _seed_torch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)


_COMPILES: list[str] = []
_LISTENING = False


@pytest.fixture
def compiles() -> list[str]:
    """A list that collects the name of every XLA backend compile from now until the test ends."""
    global _LISTENING
    if not _LISTENING:  # jax keeps listeners for the process: register one, once
        jax.monitoring.register_event_duration_secs_listener(
            lambda name, *_a, **_k: _COMPILES.append(name) if "backend_compile" in name else None)
        _LISTENING = True
    _COMPILES.clear()
    return _COMPILES
