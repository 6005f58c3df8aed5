"""The ASSD canvas: any-subset speculative decoding of an any-order model (XLNet's two-stream
attention: `model.two_stream(ids, perm_mask, target_positions)`), `policies/assd.py` for the rule.

The answer starts as MASK, and so does every MASK token of the prompt: the positions to decode are
the prompt's MASK tokens and the `gen_length` answer columns. The order sigma is the published one
(`create_pos_to_rank`): the visible tokens first, then the masked positions in ascending column
order. So a plain prompt decodes its answer left to right, and an infill is posed by writing MASK
tokens where the middle goes (`prefix + [MASK] * m + suffix`): the suffix is visible, the middle is
decoded left to right, then the answer columns after the suffix (with `stop_at_eos` and a suffix that
ends in EOS, the masked columns after that EOS are EOS from the start, never drafted or verified, and a
row stops once the middle is decided).

Positions are data, never array indices: each row keeps its ranks (`AssdCarry.rank`: -1 on visible
tokens, the rank among the masked positions on those, `UNSEEN` on padding) and its masked positions
in order (`AssdCarry.order`). The canvas is never permuted; every forward reads the whole canvas in
its columns with a per-row `perm_mask [B, T, T]` (`perm_mask[b, i, j]`: i may not attend to j):

* i may attend to j if j is not padding and rank_i > rank_j, or both are visible (the prompt block
  is bidirectional, as published). The model clears the content stream's diagonal itself.
* draft forward: every undecided rank is moved to `UNSEEN`, so the targets (and every undecided
  position) see only the decided tokens.
* verify forward: the full sigma-causal mask over the canvas with the drafts written in.

Rows sit at different ranks (n, the row's decided masked positions, is `order`'s count less its
undecided ones) and take k' = min(drafts, ranks left) targets each: the K target slots are gathered
per row and slots past k' are ignored, so one batched forward of static shape serves every row.
The verify forward is skipped when no row has two targets left. `nfe` counts 2 forwards per
iteration of a row with k' >= 2 and 1 for its last single rank, or (with `stop_at_eos`) for a first
draft of EOS, which is kept and ends the row (the verifier's verdict on the drafts after it is not
needed), so with or without `stop_at_eos` a row's forwards never exceed its decided tokens. No KV
cache (the published main branch recomputes every forward).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.decoding.canvas import Canvas, Footprint
from jaxdllm.decoding.policies.assd import Assd, mask_removed_probs
from jaxdllm.decoding.state import DecodeState, stop_at_eos
from jaxdllm.errors import ConfigError

UNSEEN = 2**31 - 1  # the rank of padding and, in the draft forward, of undecided positions


@struct.dataclass
class AssdCarry:
    """The ASSD canvas's part of the loop carry (in `DecodeState.cache`).

    Attributes:
      rank: `[B, T]` int32 each column's rank in sigma: -1 on visible tokens (one bidirectional
        block), 0 .. M-1 on the M masked positions in column order, `UNSEEN` on padding.
      order: `[B, T]` int32 the masked positions by rank (`order[b, r]` holds rank r's column for
        r < M; then the other columns).
      masked: `[B]` int32 M, each row's masked positions.
    """

    rank: jax.Array
    order: jax.Array
    masked: jax.Array


def sigma_perm_mask(rank: jax.Array, seg: jax.Array) -> jax.Array:
    """`[B, T, T]` bool perm mask of the ranks `rank [B, T]` (`perm[b, i, j]`: i may NOT attend to j):
    i attends to j when j is no padding (`seg [B, T]` != 0) and `rank_i > rank_j`, or when both are
    visible (rank -1: the prompt block is bidirectional)."""
    ri, rj = rank[:, :, None], rank[:, None, :]
    allowed = (ri > rj) | ((ri == -1) & (rj == -1))
    return ~(allowed & (seg != 0)[:, None, :])


def order_of(masked: jax.Array, seg: jax.Array) -> AssdCarry:
    """The published order (visible ascending, then masked ascending) of `masked [B, T]` positions
    (padding `seg [B, T]` == 0 excluded), as an `AssdCarry`."""
    t = masked.shape[1]
    col = jnp.arange(t)[None]
    ahead = jnp.cumsum(masked, axis=1) - 1
    rank = jnp.where(masked, ahead, jnp.where(seg != 0, -1, UNSEEN)).astype(jnp.int32)
    order = jnp.argsort(jnp.where(masked, col, t + col), axis=1, stable=True).astype(jnp.int32)
    return AssdCarry(rank=rank, order=order, masked=masked.sum(1).astype(jnp.int32))


class AssdCanvas(Canvas):
    """The ASSD canvas (any-order models with two-stream attention: XLNet)."""

    name = "assd_canvas"
    policy_base = Assd
    diffusion_blocks = False  # one order over the canvas; the policy's `drafts` is its window
    unmasks = True

    def check_config(self, config) -> None:
        if config.cache.keeps_kv:
            raise ConfigError(f"policy={config.policy.name!r} recomputes the canvas in every forward (two-stream "
                              f"attention under a per-row perm mask): leave cache='none', got {config.cache.name!r}")
        if config.stop_at_eos == "block":
            raise ConfigError(f"stop_at_eos='block' finishes a diffusion block; policy={config.policy.name!r} "
                              "decodes in one order without blocks: use stop_at_eos=True")
        if config.cfg_scale:
            raise ConfigError(f"policy={config.policy.name!r} has no classifier-free guidance: drop cfg_scale")

    def check_model(self, model_config, config) -> None:
        from jaxdllm.models.families import family_of

        model = family_of(model_config).model
        if not callable(getattr(model, "two_stream", None)):
            raise ConfigError(f"policy={config.policy.name!r} decodes any-order models with two-stream attention "
                              f"(XLNet: model.two_stream(ids, perm_mask, targets)); {model.__name__} has none")
        if model_config.mask_token_id is None:
            raise ConfigError("the model config has no mask_token_id: set it (ModelConfig.mask_token_id), the id "
                              "undecided positions hold (6 in XLNet's published tokenizer)")

    def max_steps(self, config, lay=None) -> int:
        """Every iteration decides at least one masked position of every active row: the canvas's columns
        bound the loop (without `lay`: the answer's, for prompts without MASK tokens)."""
        return config.gen_length if lay is None else lay.total

    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """No cache: each forward reads the whole canvas (content stream) plus `drafts` query-stream
        targets. XLNet's relative attention holds, per query, the scores against the T keys, against the
        2T - 1 relative distances and those gathered back to the keys: 4T (`attended`), in float32
        whatever the attention backend. A step keeps the draft and verify logits and their two
        distributions."""
        total = prompt_len + config.gen_length
        k = config.policy.drafts
        return Footprint(canvas=total, kv_slots=0, widest=total + k, attended=4 * total, logits=k, logit_copies=4)

    def comparison_presets(self, preset: str, gen_length: int, defaults: dict) -> dict:
        """Sequential greedy decoding under the order (one draft per iteration: one forward per token), greedy
        ASSD at the published k = 5 (the same tokens in fewer forwards), and ASSD at T = 1 (the published main
        setting: the model's sequential sampling)."""
        g = gen_length
        return {"sequential": ("assd-greedy", dict(gen_length=g, drafts=1)),
                "assd-greedy": ("assd-greedy", dict(gen_length=g)),
                "assd": ("assd", dict(gen_length=g))}

    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None) -> DecodeState:
        """The carry for `prompt [B, Lp]` (its MASK tokens to decode too) followed by G MASK; rows with
        `valid [B]` False start done."""
        if not callable(getattr(model, "two_stream", None)):
            raise ConfigError(f"policy={config.policy.name!r} needs a model with two-stream attention "
                              f"(model.two_stream); {type(model).__name__} has none")
        b = prompt.shape[0]
        canvas = jnp.concatenate([prompt, jnp.full((b, config.gen_length), lay.mask_id, prompt.dtype)], 1)
        masked = (canvas == lay.mask_id) & (view.seg != 0)
        if config.stop_at_eos:  # after a written EOS that follows the first masked column (an infill's suffix)
            # everything is EOS filler at the stop: decided now, never a rank to draft or verify
            first = jnp.argmax(masked, axis=1)[:, None]
            col = jnp.arange(canvas.shape[1])[None]
            written_eos = (canvas == lay.eos_id) & ~masked & (view.seg != 0) & (col > first)
            filler = masked & (jnp.cumsum(written_eos, axis=1) > 0)
            canvas = jnp.where(filler, lay.eos_id, canvas)
            masked = masked & ~filler
        carry = order_of(masked, view.seg)
        if config.stop_at_eos:  # the filler stays out of every forward's view, as the later ranks it replaces
            carry = carry.replace(rank=jnp.where(filler, UNSEEN, carry.rank))
        return DecodeState.start(canvas, masked, done=~valid | ~masked.any(1), key=key,
                                 cache=carry, policy_state=jnp.zeros(()),
                                 max_trajectory=config.max_trajectory)

    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        """One ASSD iteration of every row: the draft forward, the verify forward (when a row has two
        targets or more), acceptance, and the bookkeeping."""
        policy, carry = config.policy, state.cache
        k, (b, t) = policy.drafts, state.canvas.shape
        n = carry.masked - state.undecided.sum(1).astype(jnp.int32)              # [B] ranks decided
        width = jnp.where(state.done, 0, jnp.minimum(k, carry.masked - n))        # [B] k'
        slot = jnp.arange(k)[None]
        valid = slot < width[:, None]                                              # [B, K]
        targets = jnp.take_along_axis(carry.order, jnp.clip(n[:, None] + slot, 0, t - 1), axis=1)
        targets = jnp.where(valid, targets, targets[:, :1])                        # a real column (ignored)
        rows = jnp.arange(b)[:, None]
        ids = state.canvas.astype(jnp.int32)
        draft_key, accept_key = jax.random.split(jax.random.fold_in(state.key, state.step))

        undecided_rank = carry.rank >= n[:, None]
        hidden = jnp.where(undecided_rank & (carry.rank != UNSEEN), UNSEEN, carry.rank)
        q = mask_removed_probs(model.two_stream(ids, sigma_perm_mask(hidden, view.seg), targets), lay.mask_id,
                               config.temperature)
        drafts = policy.draft(q, draft_key)                                          # [B, K]

        drafted = ids.at[rows, jnp.where(valid, targets, t)].set(drafts, mode="drop")
        verifies = width >= 2
        if config.stop_at_eos:  # a first draft of EOS is kept and ends the row: nothing after it needs verifying
            verifies = verifies & (drafts[:, 0] != lay.eos_id)
        p = jax.lax.cond(verifies.any(),
                         lambda: mask_removed_probs(model.two_stream(drafted, sigma_perm_mask(carry.rank, view.seg),
                                                                     targets), lay.mask_id, config.temperature),
                         lambda: jnp.zeros_like(q))
        verdict = policy.accept(drafts, q, p, valid, accept_key)
        commit = slot < verdict.written[:, None]
        if config.stop_at_eos:  # the slots follow the columns: nothing after an EOS counts
            eos = commit & (verdict.tokens == lay.eos_id)
            cut = jnp.where(eos.any(1), jnp.argmax(eos, axis=1), k)
            commit = commit & (slot <= cut[:, None])
        nfe = state.nfe + jnp.where(verifies, 2, jnp.where(width >= 1, 1, 0)).astype(jnp.int32)
        where = jnp.where(commit, targets, t)
        state = state.replace(
            nfe=nfe,
            canvas=state.canvas.at[rows, where].set(verdict.tokens.astype(state.canvas.dtype), mode="drop"),
            undecided=state.undecided.at[rows, where].set(False, mode="drop"),
            commit_step=state.commit_step.at[rows, where].set(jnp.broadcast_to(nfe[:, None], where.shape),
                                                              mode="drop"))
        if config.stop_at_eos:  # an EOS at or after the first decoded column, with nothing undecided before it
            first = jnp.take_along_axis(carry.order, jnp.zeros((b, 1), jnp.int32), axis=1)
            state = stop_at_eos(state, lay.eos_id, (view.seg != 0) & (jnp.arange(t)[None] >= first))
        return state.replace(done=state.done | ~state.undecided.any(1))
