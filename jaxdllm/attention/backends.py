"""Attention backends: a registry of implementations and the table `auto` picks from per platform.

A backend is a function `fn(q [B, Lq, H, D], k [B, Lk, Hkv, D], v, mask: MaskSpec, *, scale,
**options) -> [B, Lq, H, D]` that returns zeros for query rows with no visible key. Built in:

* `reference`: dense float32 softmax over the materialised mask (the definition).
* `xla`: `jax.nn.dot_product_attention(implementation="xla")` with a dense boolean mask.
* `pallas`: the tile-skipping flash kernel (`triton_flash.py`), Pallas on Triton for NVIDIA GPUs;
  elsewhere it runs in the Pallas interpreter (tests), which is exact but slow.

`auto` resolves by platform through `AUTO`: `pallas` on GPU (faster than `xla` on every mask
measured, see `sampling/results/attention_benchmark_h100.json`), `xla` on TPU (the Triton kernel
does not lower to Mosaic), `reference` elsewhere. A new backend is one module plus one
`register_backend` call (and an `AUTO` entry if it should be the default somewhere).
"""

from __future__ import annotations

from typing import Callable

import jax

from jaxdllm.attention.mask import MaskSpec
from jaxdllm.attention.reference import reference_attention, xla_attention
from jaxdllm.attention.triton_flash import flash_attention

Backend = Callable[..., jax.Array]

_BACKENDS: dict[str, Backend] = {}
# platform (jax.default_backend()) -> backend name used by impl="auto"
AUTO: dict[str, str] = {"gpu": "pallas", "cuda": "pallas", "rocm": "xla", "tpu": "xla"}
AUTO_FALLBACK = "reference"


def register_backend(name: str, fn: Backend) -> None:
    """Make `fn` selectable as `attend(..., impl=name)` and `ModelConfig(attention_impl=name)`."""
    if name == "auto":
        raise ValueError("'auto' is reserved: it picks a backend per platform (see AUTO)")
    _BACKENDS[name] = fn


def implementations() -> tuple[str, ...]:
    """Every accepted `impl` name: `auto` and the registered backends."""
    return ("auto", *_BACKENDS)


def resolve_impl(impl: str, backend: str | None = None) -> str:
    """The registered backend `impl` names on platform `backend` (default: JAX's default backend)."""
    if impl not in implementations():
        raise ValueError(f"attention impl must be one of {implementations()}, got {impl!r}")
    if impl == "auto":
        return AUTO.get(backend or jax.default_backend(), AUTO_FALLBACK)
    return impl


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskSpec, *,
           impl: str = "auto", scale: float | None = None, **options) -> jax.Array:
    """Attention of `q [B, Lq, H, D]` over `k, v [B, Lk, Hkv, D]` under `mask`; `[B, Lq, H, D]`.

    Rows with no visible key return zeros on every implementation. `options` are passed to the
    chosen backend (`block_sizes` tunes `pallas`; the dense paths ignore it), so a registered
    backend should accept `**options`.
    """
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads {q.shape[2]} must be a multiple of kv heads {k.shape[2]}")
    return _BACKENDS[resolve_impl(impl)](q, k, v, mask, scale=scale, **options)


def _dense(fn):
    def backend(q, k, v, mask, *, scale=None, **_tuning):  # tile settings mean nothing to a dense path
        return fn(q, k, v, mask, scale=scale)
    return backend


register_backend("reference", _dense(reference_attention))
register_backend("xla", _dense(xla_attention))
register_backend("pallas", flash_attention)
