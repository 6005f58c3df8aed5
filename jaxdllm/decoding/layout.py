"""The static layout of one compiled generation, and prompt preparation.

Prompts are left-padded to a multiple of the prompt bucket with segment id 0, and the canvas
carries logical RoPE positions, so padding changes neither the mask nor the positions a row
sees, and a new prompt in the same bucket reuses the compiled loop.

Block-causal models decode in the published layout (LLaDA2.0/2.1, Fast-dLLM v2, BD3-LM): a row's
blocks sit at absolute positions, multiples of the block from the start of its sequence, and
decoding starts in the block that holds the end of its prompt. `prepare_block_prompts` pads each
row by whole blocks, so every row's blocks are canvas blocks and the batch shares one block
schedule: the prompt tails share the first decoded block with the first answer tokens (the
layout's `lead` columns), and each row's answer starts at its own column (`answer_start`).
`gen_length` may be any length: as the published loops, a row decodes to the end of the block that
holds its last answer position, so the canvas's answer columns are `gen_length` rounded up to whole
blocks (`answer_columns`) and the positions past `gen_length` are dropped from the result.
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
      total: Lp + the answer columns (the canvas length T): `gen_length`, rounded up to whole blocks
        on a block-causal canvas (`answer_columns`).
      mask_id: the MASK token (diffusion) or None.
      shift: 1 for token-shifted models (the logit at i-1 predicts token i), else 0.
      eos_eot: the model's EOS and end-of-turn ids; eos_id: its EOS id.
      attention: the model's attention mode; block_size: its block size (block-causal models).
      lead: columns of the first decoded block that sit inside the prompt input (block-causal
        layout: the block that holds the prompt tails; 0 otherwise). Decoding starts at column
        `decode_start = prompt_len - lead`.
    """

    prompt_len: int
    total: int
    mask_id: int | None
    shift: int
    eos_eot: tuple[int, ...]
    eos_id: int | None
    attention: str = "bidirectional"
    block_size: int | None = None
    lead: int = 0

    @property
    def decode_start(self) -> int:
        """The column of the first decoded block."""
        return self.prompt_len - self.lead

    @property
    def decode_width(self) -> int:
        """Columns from `decode_start` to the end of the canvas (the answer columns + `lead`)."""
        return self.total - self.decode_start

    def num_blocks(self, block_length: int) -> int:
        """Decoding blocks of `block_length` in the decoded columns."""
        return self.decode_width // block_length

    def mask(self, q_segment_ids, kv_segment_ids=None, q_offset=0, kind: str | None = None, **structure) -> MaskSpec:
        """The model's attention over canvas positions (`kind` overrides the model's mode;
        `structure`: the kind's other `MaskSpec` fields, e.g. `prefix_len`, `window_shape`)."""
        return MaskSpec(kind=kind or self.attention, block_size=self.block_size, q_offset=q_offset,
                        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, **structure)


class CanvasView(NamedTuple):
    """Per-position facts of the canvas that never change during a generation.

    Attributes:
      seg: `[B, T]` segment ids: 0 on prompt padding (and past a row's last block), 1 elsewhere.
      positions: `[B, T]` logical RoPE positions (counting real tokens only).
      answer: `[B, T]` bool, the positions a row decodes (None: every column from the prompt's end).
    """

    seg: jax.Array
    positions: jax.Array
    answer: jax.Array | None = None

    @classmethod
    def of(cls, seg_prompt: jax.Array, gen_length: int, answer_start: jax.Array | None = None,
           lead: int = 0) -> "CanvasView":
        """The view of `seg_prompt [B, Lp]` followed by the answer columns of `gen_length` tokens.

        `answer_start [B]` (default: Lp for every row): the column where each row's answer starts.
        With `lead` > 0 (block-causal layout, blocks of `lead` from column `Lp - lead`), the canvas
        has `answer_columns(gen_length, lead)` answer columns and a row decodes from its answer
        start to the end of the block that holds its last answer position (`gen_length` columns
        from its start); its columns past that are padding. A row whose prompt fills whole blocks
        thus decodes one block fewer than the rows with a prompt tail when `gen_length` is whole
        blocks.
        """
        b, lp = seg_prompt.shape
        width = answer_columns(gen_length, lead)
        col = jnp.arange(lp + width)[None]
        start = jnp.full((b,), lp, jnp.int32) if answer_start is None else answer_start.astype(jnp.int32)
        if lead:
            first = lp - lead  # the first decoded block's column
            end = (first + (start - first + gen_length + lead - 1) // lead * lead)[:, None]
        else:
            end = lp + gen_length
        seg = jnp.concatenate([seg_prompt, jnp.ones((b, width), jnp.int32)], 1) * (col < end)
        answer = (col >= start[:, None]) & (col < end)
        return cls(seg, jnp.maximum(jnp.cumsum(seg, axis=1) - 1, 0), answer)

    def window(self, canvas: jax.Array, start, width: int):
        """`(ids, positions, seg)`, each `[B, width]`, from canvas index `start` (scalar or `[B]`)."""
        return tuple(slice_window(x, start, width) for x in (canvas, self.positions, self.seg))


def answer_columns(gen_length: int, lead: int = 0) -> int:
    """The canvas columns after the prompt input for `gen_length` tokens: `gen_length` rounded up
    to whole blocks of `lead` on a block-causal canvas (its blocks of `lead` columns run from the
    block that holds the prompt's tail to the end of the one that holds the last answer position),
    `gen_length` otherwise (`lead` 0)."""
    return -(-gen_length // lead) * lead if lead else gen_length


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


def _ids_and_mask(input_ids, attention_mask) -> tuple[np.ndarray, np.ndarray]:
    """`(ids, mask)` as int32 `[B, Lp]` host arrays (the mask all ones when None)."""
    ids = np.asarray(input_ids, np.int32)
    if ids.ndim != 2:
        raise InputError(f"input_ids must be [batch, prompt_len], got shape {ids.shape}")
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, np.int32)
    if mask.shape != ids.shape:
        raise InputError(f"attention_mask shape {mask.shape} != input_ids shape {ids.shape}")
    return ids, mask


def prepare_prompts(input_ids, attention_mask, bucket: int, pad_id: int):
    """Left-pad prompts to a multiple of `bucket` on the host (numpy: no device op, no compile).

    Returns `(ids [B, Lp], seg [B, Lp], extra)` with `extra` the padding columns added.
    """
    ids, mask = _ids_and_mask(input_ids, attention_mask)
    extra = -ids.shape[1] % bucket
    return (np.pad(ids, ((0, 0), (extra, 0)), constant_values=pad_id), np.pad(mask, ((0, 0), (extra, 0))), extra)


def block_unit(model_config, config) -> int:
    """The alignment of a block-causal canvas: lcm of the decoding block and the model's block (1
    for other models). Rows are padded by multiples of it, so both grids are the same in every row."""
    if model_config.attention != "block_causal":
        return 1
    return math.lcm(config.block_length, model_config.block_size)


def block_lead(model_config, config) -> int:
    """Columns of the first decoded block that a block-causal canvas adds after the prompt's whole
    blocks (the block of the prompt tails: `block_unit`); 0 for other models."""
    return block_unit(model_config, config) if model_config.attention == "block_causal" else 0


def prompt_bucket(model_config, config, prompt_len: int) -> int:
    """The multiple prompts of `prompt_len` tokens are left-padded to.

    Normally `config.prompt_bucket` (block-causal models: its lcm with `block_unit`, so the
    context before the first decoded block is whole blocks). Where padding to it would push
    prompt + `gen_length` past the model's `max_position` although the prompt itself fits, prompts
    are padded only as far as the model needs (1, or `block_unit`): one more compiled shape instead
    of a refusal.
    """
    unit = block_unit(model_config, config)
    bucket = math.lcm(config.prompt_bucket, unit)
    context = prompt_len // unit * unit
    lead = block_lead(model_config, config)
    canvas = -(-context // bucket) * bucket + lead + answer_columns(config.gen_length, lead)
    if canvas > model_config.max_position:
        return unit
    return bucket


def prepare_block_prompts(input_ids, attention_mask, unit: int, bucket: int, pad_id: int, mask_id: int,
                          min_context: int = 0):
    """Lay prompts out for a block-causal model: each row's blocks at absolute positions.

    Row r with P_r prompt tokens decodes from the block of `unit` that holds position P_r (its
    start `s_r = P_r // unit * unit`). Rows are left-padded by `C - s_r` columns, C the largest
    `s_r` rounded up to `bucket` (a multiple of `unit`), so every row's first decoded block starts
    at column C; that block (the `lead`) holds the prompt tails followed by MASK. C is at least
    `min_context` (token-shifted models read the logit of the column before the first decoded
    block). The lead is there whatever the prompt lengths, so every prompt in a bucket gives the
    same shapes (one compiled loop); each row decodes to the end of the block that holds its last
    answer position, and its columns after it are padding (see `CanvasView.of`).

    Returns `(ids [B, C + unit], seg [B, C + unit], answer_start [B])`: seg is 1 on prompt
    tokens and on the lead's MASK columns, 0 on padding; `answer_start` is each row's first
    answer column (`C + P_r - s_r`).
    """
    ids, mask = _ids_and_mask(input_ids, attention_mask)
    lengths = mask.sum(1)
    starts = lengths // unit * unit
    context = -(-max(int(starts.max()), min_context) // bucket) * bucket
    out = np.full((ids.shape[0], context + unit), pad_id, np.int32)
    seg = np.zeros_like(out)
    answer_start = context + lengths - starts
    for r in range(ids.shape[0]):
        first = context - starts[r]
        out[r, first:answer_start[r]] = ids[r][mask[r] == 1]
        out[r, answer_start[r]:] = mask_id
        seg[r, first:] = 1
    return out, seg, answer_start.astype(np.int32)
