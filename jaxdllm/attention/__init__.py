"""One attention entry point over structured masks; implementations chosen per backend."""

from __future__ import annotations

import jax

from jaxdllm.attention.mask import MASK_KINDS, MaskSpec
from jaxdllm.attention.reference import reference_attention, xla_attention

# "pallas" (tile-skipping kernels) joins this list behind the same entry point.
IMPLEMENTATIONS = ("auto", "reference", "xla")
_IMPLS = {"reference": reference_attention, "xla": xla_attention}


def resolve_impl(impl: str) -> str:
    """The concrete implementation `impl` names on the current default backend."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"attention impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if impl == "auto":
        return "reference"
    return impl


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskSpec, *,
           impl: str = "auto", scale: float | None = None) -> jax.Array:
    """Attention of `q [B, Lq, H, D]` over `k, v [B, Lk, Hkv, D]` under `mask`; `[B, Lq, H, D]`.

    Rows with no visible key return zeros on every implementation.
    """
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"query heads {q.shape[2]} must be a multiple of kv heads {k.shape[2]}")
    return _IMPLS[resolve_impl(impl)](q, k, v, mask, scale=scale)


__all__ = ["IMPLEMENTATIONS", "MASK_KINDS", "MaskSpec", "attend", "reference_attention",
           "resolve_impl", "xla_attention"]
