"""The platform attention is compiled for: JAX's default backend, or the one named by
`lowering_for(platform)` while a program is lowered for another machine (`jax.export` on a CPU
for a TPU). It decides what `impl="auto"` picks and whether Pallas kernels run interpreted."""

from __future__ import annotations

import contextlib
import contextvars

import jax

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("jaxdllm_attention_platform", default=None)


def target_platform() -> str:
    """`"tpu"`, `"gpu"` or `"cpu"`: the platform the attention being traced will run on."""
    return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def lowering_for(platform: str):
    """Trace attention for `platform` ("tpu", "gpu"/"cuda" or "cpu") whatever this machine is: `auto`
    resolves as it would there, and the Pallas kernels are lowered natively (Mosaic on TPU,
    Triton on GPU), not interpreted."""
    name = {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)
    token = _TARGET.set(name)
    try:
        yield
    finally:
        _TARGET.reset(token)


# Custom calls without JAX's serialization guarantee that our kernels emit, per platform: the
# Triton kernel's call is only stable within one jaxlib, which is fine for a check of lowering.
_UNGUARANTEED = {"cuda": ("__gpu$xla.gpu.triton",)}


def exporter(fn, platform: str):
    """`jax.export.export(fn, platforms=[platform])`, accepting the Triton custom call for CUDA."""
    checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in _UNGUARANTEED.get(platform, ())]
    return jax.export.export(fn, platforms=[platform], disabled_checks=checks)
