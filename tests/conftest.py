"""Test session setup: 8 fake CPU devices for mesh tests and exact fp32 matmuls."""

import os

# Must happen before jax is imported anywhere.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(autouse=True)
def _seed_torch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
