"""The static layout of one compiled generation, and prompt preparation.

Prompts are left-padded to a multiple of the prompt bucket with segment id 0, and the canvas
carries logical RoPE positions, so padding changes neither the mask nor the positions a row
sees, and a new prompt in the same bucket reuses the compiled loop.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdllm.attention import MaskSpec
from jaxdllm.errors import InputError


class Layout(NamedTuple):
    """Static facts of one compiled generation (hashable: a static jit argument).

    Attributes:
      prompt_len: bucketed prompt length Lp.
      total: Lp + gen_length (the canvas length T).
      mask_id: the MASK token (diffusion) or None.
      shift: 1 for token-shifted models (the logit at i-1 predicts token i), else 0.
      eos_eot: the model's EOS and end-of-turn ids; eos_id: its EOS id.
      attention: the model's attention mode; block_size: its block size (block-causal models).
    """

    prompt_len: int
    total: int
    mask_id: int | None
    shift: int
    eos_eot: tuple[int, ...]
    eos_id: int | None
    attention: str = "bidirectional"
    block_size: int | None = None

    def mask(self, q_segment_ids, kv_segment_ids=None, q_offset=0, kind: str | None = None, **structure) -> MaskSpec:
        """The model's attention over canvas positions (`kind` overrides the model's mode;
        `structure`: the kind's other `MaskSpec` fields, e.g. `prefix_len`, `window_shape`)."""
        return MaskSpec(kind=kind or self.attention, block_size=self.block_size, q_offset=q_offset,
                        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, **structure)


class CanvasView(NamedTuple):
    """Per-position facts of the canvas that never change during a generation.

    Attributes:
      seg: `[B, T]` segment ids: 0 on prompt padding, 1 elsewhere.
      positions: `[B, T]` logical RoPE positions (counting real tokens only).
    """

    seg: jax.Array
    positions: jax.Array

    @classmethod
    def of(cls, seg_prompt: jax.Array, gen_length: int) -> "CanvasView":
        seg = jnp.concatenate([seg_prompt, jnp.ones((seg_prompt.shape[0], gen_length), jnp.int32)], 1)
        return cls(seg, jnp.maximum(jnp.cumsum(seg, axis=1) - 1, 0))

    def window(self, canvas: jax.Array, start, width: int):
        """`(ids, positions, seg)`, each `[B, width]`, from canvas index `start` (scalar or `[B]`)."""
        return tuple(slice_window(x, start, width) for x in (canvas, self.positions, self.seg))


def slice_window(x: jax.Array, start, width: int) -> jax.Array:
    """`x[:, start:start + width]` for a scalar start, or row by row for a `[B]` start."""
    if jnp.ndim(start) == 0:
        return jax.lax.dynamic_slice_in_dim(x, start, width, axis=1)
    idx = start[:, None] + jnp.arange(width)  # past the end: the last element (callers mask those)
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1, mode="clip")


def put_window(x: jax.Array, start, values: jax.Array) -> jax.Array:
    """`x` with `x[:, start:start + W] = values` (scalar start, or `[B]` per row; indices past the
    end are dropped)."""
    if jnp.ndim(start) == 0:
        return jax.lax.dynamic_update_slice_in_dim(x, values.astype(x.dtype), start, axis=1)
    idx = start[:, None] + jnp.arange(values.shape[1])
    rows = jnp.broadcast_to(jnp.arange(x.shape[0])[:, None], idx.shape)
    return x.at[rows, idx].set(values.astype(x.dtype), mode="drop")


def prepare_prompts(input_ids, attention_mask, bucket: int, pad_id: int):
    """Left-pad prompts to a multiple of `bucket` on the host (numpy: no device op, no compile).

    Returns `(ids [B, Lp], seg [B, Lp], extra)` with `extra` the padding columns added.
    """
    ids = np.asarray(input_ids, np.int32)
    if ids.ndim != 2:
        raise InputError(f"input_ids must be [batch, prompt_len], got shape {ids.shape}")
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, np.int32)
    if mask.shape != ids.shape:
        raise InputError(f"attention_mask shape {mask.shape} != input_ids shape {ids.shape}")
    extra = -ids.shape[1] % bucket
    return (np.pad(ids, ((0, 0), (extra, 0)), constant_values=pad_id), np.pad(mask, ((0, 0), (extra, 0))), extra)


def prompt_bucket(model_config, config, prompt_len: int) -> int:
    """The multiple prompts of `prompt_len` tokens are left-padded to.

    Normally `config.prompt_bucket` (block-causal models: its lcm with `block_size`, so generation
    starts on a block boundary). Where padding to it would push prompt + `gen_length` past the
    model's `max_position` although the prompt itself fits, prompts are padded only as far as
    the model needs (1, or `block_size`): one more compiled shape instead of a refusal.
    """
    unit = model_config.block_size if model_config.attention == "block_causal" else 1
    bucket = math.lcm(config.prompt_bucket, unit)
    if -(-prompt_len // bucket) * bucket + config.gen_length > model_config.max_position:
        return unit
    return bucket
