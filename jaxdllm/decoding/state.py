"""The loop's carry, `DecodeState`, and the updates every decoding method makes to it.

Undecided positions are explicit (`undecided`), not inferred from the tokens: a diffusion canvas
holds MASK there, a draft canvas holds draft tokens. Every update below reads `undecided`, so
EOS stopping, trajectories and commit bookkeeping are written once for both.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.decoding.layout import put_window, slice_window


@struct.dataclass
class DecodeState:
    """The while-loop carry.

    Attributes:
      canvas: `[B, T]` tokens: the prompt, then the answer (decided tokens, or MASK / drafts).
      undecided: `[B, T]` bool, answer positions not decided yet.
      commit_step: `[B, T]` the row's NFE count at the forward that decided each token (0 for the prompt).
      nfe: `[B]` decoding forwards the row took part in (a CFG step counts 2; cache fills that
        decide nothing are not counted).
      done: `[B]` finished rows.
      step: loop iterations so far.
      block, block_step: the diffusion block schedule (current block, steps taken in it); unused
        (0) by draft-and-verify decoding, whose windows move per row.
      key: PRNG key; cache: the method's cache state (or None); policy_state: the policy's carry.
      trajectory: `[B, max_trajectory, T]` canvas after each step (-1 where not reached).
      initial: `[B, T]` the canvas before the first step (the first draft) when recording a
        trajectory, else `[B, 0]`.
    """

    canvas: jax.Array
    undecided: jax.Array
    commit_step: jax.Array
    nfe: jax.Array
    done: jax.Array
    step: jax.Array
    block: jax.Array
    block_step: jax.Array
    key: jax.Array
    cache: object
    policy_state: object
    trajectory: jax.Array
    initial: jax.Array

    @classmethod
    def start(cls, canvas, undecided, *, done, key, cache, policy_state, max_trajectory: int) -> "DecodeState":
        b, t = canvas.shape
        zero = jnp.int32(0)
        return cls(canvas=canvas, undecided=undecided, commit_step=jnp.zeros((b, t), jnp.int32),
                   nfe=jnp.zeros((b,), jnp.int32), done=done, step=zero, block=zero, block_step=zero, key=key,
                   cache=cache, policy_state=policy_state,
                   trajectory=jnp.full((b, max_trajectory, t), -1, jnp.int32),
                   initial=canvas.astype(jnp.int32) if max_trajectory else jnp.zeros((b, 0), jnp.int32))


def commit_window(state: DecodeState, start, commit: jax.Array, tokens: jax.Array, nfe: jax.Array,
                  draft: jax.Array | None = None) -> DecodeState:
    """Decide `commit [B, W]` with `tokens` in the window at canvas index `start` (scalar or `[B]`);
    positions left undecided take `draft` when given. Their commit step is the row's `nfe`."""
    width = commit.shape[1]
    old_tokens = slice_window(state.canvas, start, width)
    undecided = slice_window(state.undecided, start, width)
    new_tokens = jnp.where(commit, tokens, old_tokens if draft is None else jnp.where(undecided, draft, old_tokens))
    old_steps = slice_window(state.commit_step, start, width)
    return state.replace(
        canvas=put_window(state.canvas, start, new_tokens),
        undecided=put_window(state.undecided, start, undecided & ~commit),
        commit_step=put_window(state.commit_step, start, jnp.where(commit, nfe[:, None], old_steps)))


def fill_answer(state: DecodeState, fill: jax.Array, tokens: jax.Array, start: int, nfe: jax.Array) -> DecodeState:
    """Set positions `fill [B, W]` of the columns from `start` on to `tokens [B, W]` (decided or
    not), decided at `nfe`."""
    pad = jnp.zeros((fill.shape[0], start), bool)
    where = jnp.concatenate([pad, fill], 1)
    values = jnp.concatenate([jnp.zeros((fill.shape[0], start), state.canvas.dtype),
                              tokens.astype(state.canvas.dtype)], 1)
    return state.replace(canvas=jnp.where(where, values, state.canvas), undecided=state.undecided & ~where,
                         commit_step=jnp.where(where, nfe[:, None], state.commit_step))


def _finish_with_eos(state: DecodeState, stop: jax.Array, eos_id: int) -> DecodeState:
    """Rows `stop [B]` are done; their undecided positions become EOS, decided now (not a forward)."""
    fill = stop[:, None] & state.undecided
    return state.replace(canvas=jnp.where(fill, eos_id, state.canvas), undecided=state.undecided & ~fill,
                         commit_step=jnp.where(fill, state.nfe[:, None], state.commit_step), done=state.done | stop)


def stop_at_eos(state: DecodeState, eos_id: int, answer: jax.Array) -> DecodeState:
    """Rows that decided EOS in their `answer [B, T]` positions with nothing undecided before it
    are done; their undecided positions (all after that EOS) become EOS, decided now."""
    t = state.canvas.shape[1]
    is_eos = answer & (state.canvas == eos_id) & ~state.undecided
    first = jnp.where(is_eos.any(1), jnp.argmax(is_eos, axis=1), t)
    open_before = (state.undecided & (jnp.arange(t)[None] < first[:, None])).any(1)
    return _finish_with_eos(state, is_eos.any(1) & ~open_before & ~state.done, eos_id)


def stop_after_eos_block(state: DecodeState, eos_id: int, answer: jax.Array, closed_end, closed: jax.Array
                         ) -> DecodeState:
    """The published LLaDA2 stop: when a block closes (`closed`, a bool scalar; `closed_end` the
    column after it), rows with an EOS among their decided answer positions before `closed_end`
    are done; the rest of their answer becomes EOS, decided now."""
    before = jnp.arange(state.canvas.shape[1])[None] < closed_end
    has_eos = (answer & before & (state.canvas == eos_id) & ~state.undecided).any(1)
    return _finish_with_eos(state, closed & has_eos & ~state.done, eos_id)


def record_trajectory(state: DecodeState, max_trajectory: int) -> DecodeState:
    """Write the canvas into trajectory slot `step` (a no-op past the last slot)."""
    if not max_trajectory:
        return state
    slot = jnp.minimum(state.step, max_trajectory - 1)
    kept = jax.lax.dynamic_index_in_dim(state.trajectory, slot, axis=1, keepdims=False)
    row = jnp.where(state.step < max_trajectory, state.canvas, kept)
    return state.replace(trajectory=jax.lax.dynamic_update_index_in_dim(state.trajectory, row, slot, axis=1))
