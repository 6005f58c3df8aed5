"""Dense reference attention: materialises the structured mask. Every other path must match it."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxdllm.attention.mask import MaskSpec


def _group_queries(q: jax.Array, num_kv_heads: int) -> jax.Array:
    b, lq, h, d = q.shape
    return q.reshape(b, lq, num_kv_heads, h // num_kv_heads, d)


def reference_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskSpec,
                        *, scale: float | None = None) -> jax.Array:
    """Softmax attention with grouped-query heads; scores and softmax in float32.

    Args:
      q: `[B, Lq, H, D]` queries.
      k, v: `[B, Lk, Hkv, D]` keys and values, `H % Hkv == 0`.
      mask: which keys each query sees (physical indices, see `MaskSpec`).
      scale: score scale, default `1/sqrt(D)`.

    Returns:
      `[B, Lq, H, D]` in `q.dtype`. A query row with no visible key returns zeros.
    """
    b, lq, h, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    qg = _group_queries(q, hkv)
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k, preferred_element_type=jnp.float32) * scale
    visible = mask.dense(lq, lk)[:, None, None]  # [B|1, 1, 1, Lq, Lk]
    scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(visible.any(-1, keepdims=True), probs, 0.0)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs.astype(v.dtype), v,
                     preferred_element_type=jnp.float32)
    return out.reshape(b, lq, h, d).astype(q.dtype)


def xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskSpec,
                  *, scale: float | None = None) -> jax.Array:
    """`jax.nn.dot_product_attention(implementation="xla")` with the mask as a dense boolean.

    Same shapes and the same no-visible-key rule as `reference_attention`.
    """
    lq, lk = q.shape[1], k.shape[1]
    visible = mask.dense(lq, lk)[:, None]  # [B|1, 1, Lq, Lk]
    out = jax.nn.dot_product_attention(q, k, v, mask=visible, scale=scale, implementation="xla")
    any_visible = jnp.moveaxis(visible.any(-1), 1, -1)[..., None]  # [B|1, Lq, 1, 1]
    return jnp.where(any_visible, out, 0).astype(q.dtype)


def reference_attention_lse(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskSpec,
                            *, scale: float | None = None, **_tuning) -> tuple[jax.Array, jax.Array]:
    """`reference_attention` and the log-sum-exp of each query's visible scores.

    Returns:
      `(out [B, Lq, H, D] in q.dtype, lse [B, Lq, H] float32)`, `lse` in natural log of the scaled scores;
      a query with no visible key returns zeros and `lse = -inf` (it adds nothing to a logsumexp merge).
    """
    b, lq, h, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", _group_queries(q, hkv), k, preferred_element_type=jnp.float32) * scale
    visible = mask.dense(lq, lk)[:, None, None]  # [B|1, 1, 1, Lq, Lk]
    scores = jnp.where(visible, scores, -jnp.inf)
    any_visible = visible.any(-1)
    top = jax.lax.stop_gradient(jnp.where(any_visible, scores.max(-1), 0.0))
    weights = jnp.exp(scores - top[..., None])                        # 0 where masked
    total = weights.sum(-1)
    probs = weights / jnp.where(any_visible, total, 1.0)[..., None]
    lse = jnp.where(any_visible, top + jnp.log(jnp.where(any_visible, total, 1.0)), -jnp.inf)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
    lse = jnp.broadcast_to(lse, (b, hkv, h // hkv, lq))
    return out.reshape(b, lq, h, d).astype(q.dtype), jnp.moveaxis(lse.reshape(b, h, lq), 1, 2)
