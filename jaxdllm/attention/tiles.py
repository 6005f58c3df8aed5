"""Tile maps of a structured mask: which (query tile, key tile) pairs are empty, partial or full.

A kernel walks, for each tile on its outer axis, the list of inner tiles worth visiting: the
full ones first (no mask arithmetic), then the partial ones (mask applied elementwise); empty
tiles are never loaded. The map is computed from the same rule as `MaskSpec.dense`, one
reduction per tile, so it costs O(Lq * Lk) cheap integer work and no `[Lq, Lk]` array.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxdllm.attention.mask import MaskSpec

EMPTY, PARTIAL, FULL = 0, 1, 2


class TileSchedule(NamedTuple):
    """Inner tiles to visit per outer tile.

    Attributes:
      order: `[Bm, n_outer, n_inner]` int32 inner-tile indices: full tiles, then partial
        tiles, then the empty ones (never visited).
      counts: `[Bm, n_outer, 2]` int32 (number of full tiles, number of partial tiles).
    `Bm` is 1 when the mask is the same for every row, else the batch size.
    """

    order: jax.Array
    counts: jax.Array


def tile_classes(mask: MaskSpec, q_len: int, kv_len: int, block_q: int, block_k: int) -> jax.Array:
    """`[Bm, ceil(q_len/block_q), ceil(kv_len/block_k)]` int32 of EMPTY / PARTIAL / FULL.

    Positions past `q_len` / `kv_len` (the padding of the last tile) count as not visible, so
    a ragged last tile is PARTIAL and the kernel masks its padding.
    """
    nq, nk = -(-q_len // block_q), -(-kv_len // block_k)
    q_local = (jnp.arange(nq, dtype=jnp.int32)[:, None] * block_q
               + jnp.arange(block_q, dtype=jnp.int32)[None, :])[None, :, :, None, None]
    k_idx = (jnp.arange(nk, dtype=jnp.int32)[:, None] * block_k
             + jnp.arange(block_k, dtype=jnp.int32)[None, :])[None, None, None]
    q_idx = q_local + jnp.asarray(mask.q_offset, jnp.int32)
    spec = mask
    if jnp.ndim(mask.prefix_len) == 1:
        spec = mask.replace(prefix_len=jnp.asarray(mask.prefix_len)[:, None, None, None, None])
    visible = spec.visible_at(q_idx, k_idx, kv_len) & (q_local < q_len) & (k_idx < kv_len)
    if mask.q_segment_ids is not None:
        qs = _pad_to(jnp.asarray(mask.q_segment_ids, jnp.int32), nq * block_q, -1)
        ks = _pad_to(jnp.asarray(mask.kv_segment_ids, jnp.int32), nk * block_k, -2)
        qs = qs.reshape(qs.shape[0], nq, block_q)[:, :, :, None, None]
        ks = ks.reshape(ks.shape[0], nk, block_k)[:, None, None]
        visible = visible & (qs == ks)
    visible = jnp.broadcast_to(visible, jnp.broadcast_shapes(visible.shape, (1, nq, block_q, nk, block_k)))
    any_visible = visible.any(axis=(2, 4))
    all_visible = visible.all(axis=(2, 4))
    return jnp.where(all_visible, FULL, jnp.where(any_visible, PARTIAL, EMPTY)).astype(jnp.int32)


def schedule(classes: jax.Array, *, transpose: bool = False) -> TileSchedule:
    """Visit lists from `tile_classes`: over key tiles per query tile, or the reverse.

    Args:
      classes: `[Bm, nq, nk]` from `tile_classes`.
      transpose: False for the forward and dq passes (outer = query tiles); True for the
        dk/dv pass (outer = key tiles).
    """
    if transpose:
        classes = jnp.swapaxes(classes, 1, 2)
    order = jnp.argsort(FULL - classes, axis=-1, stable=True).astype(jnp.int32)
    counts = jnp.stack([(classes == FULL).sum(-1), (classes == PARTIAL).sum(-1)], axis=-1)
    return TileSchedule(order=order, counts=counts.astype(jnp.int32))


def skipped_fraction(classes: jax.Array) -> jax.Array:
    """Fraction of tiles that are EMPTY (never loaded by the kernels)."""
    return (classes == EMPTY).mean()


def _pad_to(x: jax.Array, length: int, value: int) -> jax.Array:
    return jnp.pad(x, ((0, 0), (0, length - x.shape[-1])), constant_values=value)
