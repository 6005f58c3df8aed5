"""Key/value cache shared by every sampler.

One structure serves all the published cache schemes, because a step is always "write this
step's K/V at a contiguous physical offset, then attend to every cached slot under a mask":

* exact KV cache (causal decoding, Jacobi decoding, finished block-causal blocks): write at
  the current end; slots not yet written have segment id 0 and are invisible to real tokens;
  `truncate` drops the K/V of rejected tokens.
* Fast-dLLM prefix cache: a full-canvas forward fills every slot; later steps feed
  `x[:, block_start:]` at offset `block_start`, overwriting the block and what follows.
* Fast-dLLM dual cache: as above but a step feeds only the current block and overwrites its
  slots; prefix and suffix K/V stay as cached.

Keys are cached after RoPE. The schemes above never move a token to another position, so
this equals the published pre-RoPE caching.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.models.config import ModelConfig


@struct.dataclass
class KVCache:
    """Per-layer K/V slots.

    Attributes:
      k, v: per layer `[B, S, Hkv, Dh]`: a tuple of `num_layers` arrays, or (models with
        `scan_layers`) one stacked array `[num_layers, B, S, Hkv, Dh]`; `k[i]` is layer i either way.
      segment_ids: `[B, S]` int32, the segment id of the token in each slot; 0 = empty/padding.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    segment_ids: jax.Array

    @classmethod
    def init(cls, config: ModelConfig, batch_size: int, max_length: int, dtype=jnp.float32,
             stacked: bool = False) -> "KVCache":
        """An empty cache of `max_length` slots per row, in `dtype`; `stacked`: one array per K and V
        (a `scan_layers` model). `Transformer.init_cache` fills both in from the model's options."""
        if stacked:
            zeros = jnp.zeros((config.num_layers, batch_size, max_length, *config.kv_shape(0)), dtype)
        else:  # per layer: a family's layers may differ in shape (`ModelConfig.kv_shape`)
            zeros = tuple(jnp.zeros((batch_size, max_length, *config.kv_shape(i)), dtype)
                          for i in range(config.num_layers))
        return cls(k=zeros, v=zeros, segment_ids=jnp.zeros((batch_size, max_length), jnp.int32))

    @property
    def stacked(self) -> bool:
        """Whether K/V are one `[num_layers, B, S, Hkv, Dh]` array each (scanned models)."""
        return not isinstance(self.k, tuple)

    def batch_axes(self) -> "KVCache":
        """`in_axes` for `jax.vmap` over the batch (rows of every array)."""
        axis = 1 if self.stacked else 0
        per_layer = axis if self.stacked else tuple(axis for _ in self.k)
        return KVCache(k=per_layer, v=per_layer, segment_ids=0)

    @property
    def max_length(self) -> int:
        return self.segment_ids.shape[1]

    def move_slots(self, source: jax.Array, dest: jax.Array, length: int) -> "KVCache":
        """K/V with each row's `length` slots from `source [B]` copied to `dest [B]` (segment ids
        stay): a draft-and-verify step keeps the accepted branch's K/V where its tokens belong."""
        if length == 0:
            return self
        axis = 1 if self.stacked else 0

        def move(x):  # x: [.., B, S, ..] with the batch at `axis`; in a row the slots are at `axis`
            def one(row, src, dst):
                piece = jax.lax.dynamic_slice_in_dim(row, src, length, axis=axis)
                return jax.lax.dynamic_update_slice_in_dim(row, piece, dst, axis=axis)
            return jax.vmap(one, in_axes=(axis, 0, 0), out_axes=axis)(x, source, dest)

        return self.replace(k=jax.tree.map(move, self.k), v=jax.tree.map(move, self.v))

    def gather_slots(self, source: jax.Array, dest: jax.Array) -> "KVCache":
        """K/V with each row's slots `source [B, n]` (any order) copied to `dest .. dest + n` (`dest
        [B]`; segment ids stay): a tree step keeps the accepted path's K/V where its tokens belong."""
        n = source.shape[1]
        if n == 0:
            return self
        axis = 1 if self.stacked else 0

        def move(x):  # x: [.., B, S, ..] with the batch at `axis`; in a row the slots are at `axis`
            def one(row, src, dst):
                piece = jnp.take(row, src, axis=axis)
                return jax.lax.dynamic_update_slice_in_dim(row, piece, dst, axis=axis)
            return jax.vmap(one, in_axes=(axis, 0, 0), out_axes=axis)(x, source, dest)

        return self.replace(k=jax.tree.map(move, self.k), v=jax.tree.map(move, self.v))

    def truncate(self, length: jax.Array | int) -> "KVCache":
        """Mark slots at index >= `length` (scalar or `[B]`) empty; their K/V become invisible."""
        length = jnp.asarray(length, jnp.int32)
        if length.ndim == 1:
            length = length[:, None]
        keep = jnp.arange(self.max_length, dtype=jnp.int32)[None, :] < length
        return self.replace(segment_ids=jnp.where(keep, self.segment_ids, 0))
