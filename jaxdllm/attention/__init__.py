"""One attention entry point over structured masks; implementations chosen per backend.

* `reference`: dense float32 softmax with the materialised mask (the definition).
* `xla`: `jax.nn.dot_product_attention(implementation="xla")` with a dense boolean mask.
* `pallas`: the tile-skipping flash kernel (`flash.py`), Pallas on Triton for NVIDIA GPUs;
  elsewhere it runs in the Pallas interpreter (tests), which is correct but slow.
* `auto`: `pallas` on GPU (faster than `xla` on every mask measured, see
  `sampling/results/attention_benchmark_h100.json`), `xla` on TPU (the Triton kernel does not
  lower there), `reference` on CPU.
"""

from __future__ import annotations

import jax

from jaxdllm.attention.flash import BlockSizes, flash_attention
from jaxdllm.attention.mask import MASK_KINDS, MaskSpec
from jaxdllm.attention.reference import reference_attention, xla_attention

IMPLEMENTATIONS = ("auto", "reference", "xla", "pallas")
_AUTO = {"gpu": "pallas", "cuda": "pallas", "rocm": "xla", "tpu": "xla"}


def resolve_impl(impl: str, backend: str | None = None) -> str:
    """The concrete implementation `impl` names on `backend` (default: JAX's default backend)."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"attention impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if impl == "auto":
        return _AUTO.get(backend or jax.default_backend(), "reference")
    return impl


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskSpec, *,
           impl: str = "auto", scale: float | None = None,
           block_sizes: BlockSizes | None = None) -> jax.Array:
    """Attention of `q [B, Lq, H, D]` over `k, v [B, Lk, Hkv, D]` under `mask`; `[B, Lq, H, D]`.

    Rows with no visible key return zeros on every implementation. `block_sizes` tunes the
    `pallas` kernel and is ignored by the others.
    """
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads {q.shape[2]} must be a multiple of kv heads {k.shape[2]}")
    concrete = resolve_impl(impl)
    if concrete == "pallas":
        return flash_attention(q, k, v, mask, scale=scale, block_sizes=block_sizes)
    if concrete == "reference":
        return reference_attention(q, k, v, mask, scale=scale)
    return xla_attention(q, k, v, mask, scale=scale)


__all__ = ["BlockSizes", "IMPLEMENTATIONS", "MASK_KINDS", "MaskSpec", "attend", "flash_attention",
           "reference_attention", "resolve_impl", "xla_attention"]
