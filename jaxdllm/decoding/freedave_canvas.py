"""The FreeDave canvas: the masked canvas decoded by draft and verification (`policies/freedave.py`,
`algorithms.md` §10), with the output of a greedy reference sampler (LLaDA one token per step by
default) in fewer forwards.

The carry holds the logits of the current canvas (the *seed*, `Seed`). Each step, per row:

* drafting (a valid seed, and the reference's step from it leaves masks in the block): the K drafts
  built from the seed go through one forward; the chained verification picks draft `best`, which is
  committed, and its logits become the next seed (no extra forward for verification).
* a free commit (a valid seed whose reference step completes the block): that step is the
  reference's own, so it is committed without a forward; the seed is then stale.
* seeding (no valid seed: the first step, after a free commit, or a block change where the seed does
  not cover the new block): one forward of the canvas itself (the draft "0", which commits nothing)
  makes the seed.

NFE counts the forwards a row takes part in (drafting and seeding); a step where no row drafts runs
one canvas instead of K, and a step where no row needs a forward runs none. With the project's
convention for caches, the block cache's prompt prefill and its rewrite of a finished window are
not counted (as for every other method). The seed covers the current block and, where the same
forward also gives it, the next one: the whole canvas (cache='none') or a later decoding block of
the same model-block window (cache='block' with `block_length` < the model's block); a draft that
completes the block then seeds the next block too.

Rows are independent (ragged batches decode each row as alone): every row decodes the same block at
a time (as on the masked canvas), forwards are per row, and a row that waits for the others keeps its
seed (its canvas does not change). Blocks advance once no row has a mask left in the current one.

Layouts of the K drafts in one forward (`FreeDave.draft_layout`): `batch`, B*K rows (cache='none':
whole canvases; cache='block': windows, each row reading its own copy of the cache, whose outputs
are dropped), and `tree`, cache='block' only: per row, the token before the window (token-shifted
models) and K windows after the cached prefix under `MaskSpec(kind="tree")`, each window one chain
of nodes of one model block (`draft_tree`), so it is block-causal inside and sees no other draft.
Their K/V land in K consecutive windows of slots (the cache has K - 1 spare windows past the canvas);
slots past a window are never visible to a later window under block-causal attention, and the
finished window is rewritten from its final tokens.

`sequential` runs the K drafts one after another (`lax.map`), each with the reference's shapes.

Ties and numerics: drafts and targets rank positions with the reference's own functions (ties to
the lower position), so exact ties break as the reference breaks them. Batched-vs-single numerics:
the batch layout runs B*K rows where the reference runs B, and the tree layout attends over a longer
key axis (spare slots, K windows); where the model's arithmetic depends on those shapes (bf16 on
CPU: the reference itself then decodes a row differently alone and in a batch), two confidences
within rounding of each other can rank differently and the output leave the reference's. The
`sequential` layout gives each draft the reference's own forward, logits bit for bit, for checking.
In float32 the tests (`tests/decoding/test_freedave.py`) find every layout's output identical.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.attention import MaskSpec
from jaxdllm.decoding import branching
from jaxdllm.decoding.caches import CACHES
from jaxdllm.decoding.canvas import Footprint
from jaxdllm.decoding.layout import put_window, slice_window
from jaxdllm.decoding.masked_canvas import MaskedCanvas
from jaxdllm.decoding.policies import StepContext
from jaxdllm.decoding.policies.freedave import FreeDave, draft_commits, target_commits, verify
from jaxdllm.decoding.state import DecodeState, commit_window, stop_after_eos_block, stop_at_eos
from jaxdllm.errors import ConfigError


@struct.dataclass
class Seed:
    """The FreeDave canvas's part of the loop carry (in `DecodeState.cache`).

    Attributes:
      kv: the block cache's `KVCache` (cache='block'), else None.
      logits: `[B, S, V]` float32 logits of the current canvas from the current block's first
        position on (S = block_length, or 2 * block_length where a forward also gives the next block).
      valid: `[B]` rows whose `logits` are those of their current canvas.
    """

    kv: object
    logits: jax.Array
    valid: jax.Array


def seed_width(config, lay) -> int:
    """S, the positions a seed covers: two decoding blocks where one forward gives the next block's
    logits too (cache='none' with several blocks; cache='block' with windows of several blocks), else one."""
    bl, window = config.block_length, config.cache.step_window(lay, config)
    if window is not None:
        return 2 * bl if window > bl else bl
    return 2 * bl if lay.num_blocks(bl) > 1 else bl


def draft_tree(drafts: int, blocks: int) -> tuple[int, ...]:
    """The tree mask's parents for `drafts` windows of `blocks` model blocks each: one chain of nodes
    per draft (a window's first model block has no parent, each later one the block before it), so a
    draft's window is block-causal inside and sees no other draft."""
    return tuple(-1 if m == 0 else j * blocks + m - 1 for j in range(drafts) for m in range(blocks))


def _repeat_rows(tree, k: int, axes):
    """Every array of `tree` with each row repeated `k` times (row r -> rows r*k .. r*k + k - 1)."""
    return jax.tree.map(lambda x, axis: jnp.repeat(x, k, axis=axis), tree, axes)


def _from_block_start(logits: jax.Array, offset) -> jax.Array:
    """`logits [N, S, V]` whose row 0 is `offset` positions before the block's start, re-indexed so
    row 0 is the block's start (rows shifted in past the end are junk: never read)."""
    return jnp.roll(logits, -offset, axis=1)


class FreedaveCanvas(MaskedCanvas):
    """The masked canvas decoded by FreeDave (policy `freedave`)."""

    name = "freedave_canvas"
    policy_base = FreeDave

    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """The K drafts in one forward: K whole canvases (or K windows of the block cache, each row over its
        own copy of the cache unless drafts share it as a tree), the seed's logits (one or two blocks)
        and the K drafts' logits."""
        policy, k, bl = config.policy, config.policy.drafts, config.block_length
        total = self.canvas_columns(model_config, config, prompt_len)
        seed = 2 * bl if (total - prompt_len) > bl else bl
        if not config.cache.keeps_kv:
            return Footprint(canvas=total, kv_slots=0, widest=k * total, attended=total, logits=(k + 1) * seed)
        window = max(bl, model_config.block_size)
        if policy.draft_layout == "tree":
            slots = total + (k - 1) * window
            return Footprint(canvas=total, kv_slots=slots, widest=k * window, attended=slots, logits=(k + 1) * seed)
        return Footprint(canvas=total, kv_slots=(k + 1) * total, widest=k * window, attended=total,
                         logits=(k + 1) * seed)

    def check_config(self, config) -> None:
        """The masked canvas's checks, and an exact cache (`none` or `block`)."""
        super().check_config(config)
        if not config.cache.exact:
            exact = ", ".join(f"cache={name!r} ({' or '.join(cls.attentions)} models)"
                              for name, cls in CACHES.items() if cls.exact)
            raise ConfigError(f"policy {config.policy.name!r} is exact and cache={config.cache.name!r} is "
                              f"approximate: use an exact cache: {exact}")

    def max_steps(self, config, lay=None) -> int:
        """A bound on the loop's steps: one per decoded column plus a seeding step per block."""
        width = 2 * config.gen_length if lay is None else lay.decode_width
        return width + 2 * (width // config.block_length) + 2

    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None) -> DecodeState:
        """The masked canvas's carry for `prompt [B, Lp]` with an (invalid) seed; rows with `valid [B]`
        False start done. The tree layout's cache has K - 1 spare windows of slots."""
        policy = config.policy
        extra = 0
        if policy.draft_layout == "tree":
            extra = (policy.drafts - 1) * config.cache.step_window(lay, config)
        canvas = jnp.concatenate([prompt, jnp.full((prompt.shape[0], lay.total - prompt.shape[1]), lay.mask_id,
                                                   prompt.dtype)], 1)
        kv = config.cache.init(model, canvas, view, lay, config, extra_slots=extra) if config.cache.keeps_kv else None
        b, v = prompt.shape[0], model.config.vocab_size
        seed = Seed(kv=kv, logits=jnp.zeros((b, seed_width(config, lay), v), jnp.float32),
                    valid=jnp.zeros((b,), bool))
        return DecodeState.start(canvas, view.answer, done=~valid, key=key, cache=seed,
                                 policy_state=policy.init_state(b, config.block_length, v),
                                 max_trajectory=config.max_trajectory)

    # -- the forward of K windows ------------------------------------------------------------------
    def _forward(self, model, state, view, lay, config, windows, seed: Seed, layout: str | None = None):
        """Logits `[B, k, S, V]` of each row's k canvases whose current block is `windows [B, k, L]`
        (row 0 = the block's first position), and the carried KV cache. `layout`: the policy's
        `draft_layout` unless given."""
        layout = layout or config.policy.draft_layout
        b, k, bl = windows.shape
        if layout == "sequential" and k > 1:  # k forwards of the reference's shapes, one after another
            def one(window):
                return self._forward(model, state, view, lay, config, window[:, None], seed, "batch")[0][:, 0]
            return jnp.swapaxes(jax.lax.map(one, jnp.swapaxes(windows, 0, 1)), 0, 1), seed.kv
        S = seed.logits.shape[1]
        start = lay.decode_start + state.block * bl
        W = config.cache.step_window(lay, config)
        if W is None:  # whole canvases, B*k rows
            canvas = put_window(jnp.repeat(state.canvas, k, axis=0), start, windows.reshape(b * k, bl))
            seg, pos = jnp.repeat(view.seg, k, axis=0), jnp.repeat(view.positions, k, axis=0)
            first = jnp.clip(start - lay.shift, 0, lay.total - S)
            logits = model(canvas, pos, lay.mask(seg, seg), logits_slice=(first, S)).logits
            logits = _from_block_start(logits, start - lay.shift - first)
            return logits.reshape(b, k, S, -1), seed.kv
        shift = lay.shift
        window_start = lay.decode_start + (state.block * bl) // W * W
        fed = window_start - shift
        offset = start - window_start                      # the block inside the window
        first = jnp.clip(offset, 0, W + shift - S)         # the logit of window position p is fed index p
        ids, pos, seg = view.window(state.canvas, fed, W + shift)
        if layout != "tree":                                # B*k rows, each over its own copy of the cache
            ids = put_window(jnp.repeat(ids, k, axis=0), offset + shift, windows.reshape(b * k, bl))
            pos, seg = jnp.repeat(pos, k, axis=0), jnp.repeat(seg, k, axis=0)
            kv = _repeat_rows(seed.kv, k, seed.kv.batch_axes())
            logits = model(ids, pos, lay.mask(seg, q_offset=fed), kv, logits_slice=(first, S)).logits
            logits = _from_block_start(logits, offset - first)
            return logits.reshape(b, k, S, -1), seed.kv
        # tree: [token before the window | node 0 | ... | node k-1], each node one window
        first = jnp.clip(offset, 0, W - S)
        nodes = put_window(jnp.repeat(ids[:, shift:], k, axis=0), offset, windows.reshape(b * k, bl))
        tree_ids = jnp.concatenate([ids[:, :shift], nodes.reshape(b, k * W)], 1)
        tree_pos = jnp.concatenate([pos[:, :shift], jnp.tile(pos[:, shift:], (1, k))], 1)
        tree_seg = jnp.concatenate([seg[:, :shift], jnp.tile(seg[:, shift:], (1, k))], 1)
        mask = MaskSpec(kind="tree", block_size=lay.block_size, q_offset=fed, prefix_len=window_start,
                        tree=draft_tree(k, W // lay.block_size), q_segment_ids=tree_seg)
        out = model(tree_ids, tree_pos, mask, seed.kv)
        # node j's logit for window position p: fed index j*W + p (shifted: p = 0 reads the token before)
        p = first + jnp.arange(S)
        index = jnp.arange(k)[:, None] * W + p[None]
        if shift:
            index = jnp.where(p[None] == 0, 0, index)
        logits = jnp.take(out.logits, index.reshape(-1), axis=1).reshape(b, k, S, -1)
        return jnp.roll(logits, -(offset - first), axis=2), out.cache

    def _forwards(self, model, state, view, lay, config, windows, seed: Seed, drafting, seeding):
        """`_forward` of the K drafts when a row drafts, of the canvas alone (k = 1) when rows only
        seed, and none when no row needs a forward. Returns `(logits [B, K, S, V], kv)`."""
        b, K, _ = windows.shape
        shape = (b, K) + seed.logits.shape[1:]

        def drafts(kv):
            return self._forward(model, state, view, lay, config, windows, seed.replace(kv=kv))

        def canvas(kv):
            logits, kv = self._forward(model, state, view, lay, config, windows[:, :1], seed.replace(kv=kv))
            return jnp.broadcast_to(logits, shape), kv

        def skip(kv):
            return jnp.zeros(shape, jnp.float32), kv

        mode = jnp.where(drafting.any(), 2, jnp.where(seeding.any(), 1, 0))
        if K == 1:
            return branching.cond(mode > 0, drafts, skip, seed.kv)
        return branching.switch(mode, [skip, canvas, drafts], seed.kv)

    # -- one step ----------------------------------------------------------------------------------
    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        """Per row: draft, verify and commit (one forward), commit the reference's step for free, or
        seed (one forward); then the masked canvas's bookkeeping."""
        policy, bl, first_col = config.policy, config.block_length, lay.decode_start
        reference = policy.reference_policy()
        seed: Seed = state.cache
        start = first_col + state.block * bl
        undecided = slice_window(state.undecided, start, bl)
        candidates = undecided & ~state.done[:, None]
        active = candidates.any(1)
        ctx = StepContext(config=policy.reference_config(config), block=state.block, block_step=state.block_step,
                          key=jax.random.fold_in(state.key, state.step), state=state.policy_state,
                          eos_eot_ids=lay.eos_eot, eos_id=lay.eos_id)
        block_tokens = slice_window(state.canvas, start, bl).astype(jnp.int32)

        commits, tokens, distinct = draft_commits(reference, seed.logits[:, :bl], candidates, ctx, policy.drafts)
        complete = ~(candidates & ~commits[:, 0]).any(1)     # the reference's step fills the block
        seeding = active & ~seed.valid
        free = active & seed.valid & complete
        drafting = active & seed.valid & ~complete
        windows = jnp.where(commits, tokens[:, None], block_tokens[:, None])              # [B, K, L]
        windows = jnp.where(seeding[:, None, None], block_tokens[:, None], windows)

        logits, kv = self._forwards(model, state, view, lay, config, windows, seed, drafting, seeding)
        logits = logits.at[..., lay.mask_id].set(-jnp.inf)  # MASK is never a prediction (as on the masked canvas)
        open_after = undecided[:, None] & ~commits                                         # [B, K, L]
        t_commit, t_tokens = target_commits(reference, logits[:, :, :bl], open_after & ~state.done[:, None, None], ctx)
        targets = jnp.where(t_commit, t_tokens, windows)
        stopped = None
        if config.stop_at_eos is True:  # the reference stops at a draft with EOS and nothing open before it
            stopped = _eos_stops(windows, open_after, slice_window(view.answer, start, bl), lay.eos_id)
        best = verify(windows, targets, ~open_after, distinct, policy.match_rule, stopped)
        best = jnp.where(drafting, best, 0)                # a free commit is draft 1; seeding reads canvas 0

        chosen = jnp.take_along_axis(commits, best[:, None, None], axis=1)[:, 0]
        commit = chosen & (drafting | free)[:, None]
        forwarded = drafting | seeding
        new_logits = jnp.take_along_axis(logits, best[:, None, None, None], axis=1)[:, 0]
        seed_logits = jnp.where(forwarded[:, None, None], new_logits, seed.logits)
        valid = forwarded | (seed.valid & ~free)
        nfe = state.nfe + forwarded.astype(jnp.int32)
        state = commit_window(state.replace(nfe=nfe), start, commit, tokens, nfe)
        if config.stop_at_eos is True:
            state = stop_at_eos(state, lay.eos_id, view.answer)
        state = state.replace(done=state.done | ~state.undecided.any(1))

        block_full = ~(slice_window(state.undecided, start, bl) & ~state.done[:, None]).any()
        if config.stop_at_eos == "block":
            state = stop_after_eos_block(state, lay.eos_id, view.answer, start + bl, block_full)
        block = state.block + block_full.astype(jnp.int32)
        seed_logits, valid = _next_block_seed(seed_logits, valid, block_full, block, lay, config)
        state = state.replace(done=state.done | (block >= lay.num_blocks(bl)), block=block,
                              block_step=jnp.where(block_full, 0, state.block_step + 1))
        if config.cache.keeps_kv:  # the block cache rewrites a finished window from its final tokens
            kv = config.cache.after_commit(model, state.replace(cache=kv), view, lay, config, block_full)
        state = state.replace(cache=Seed(kv=kv, logits=seed_logits, valid=valid))
        return state


def _eos_stops(windows: jax.Array, open_after: jax.Array, answer: jax.Array, eos_id: int) -> jax.Array:
    """`[B, K]`: drafts `windows [B, K, L]` (open positions `open_after [B, K, L]`) holding an answer
    (`answer [B, L]`) EOS with no open position before it (earlier blocks are decided)."""
    length = windows.shape[-1]
    is_eos = answer[:, None] & (windows == eos_id) & ~open_after
    first = jnp.where(is_eos.any(-1), jnp.argmax(is_eos, axis=-1), length)
    open_before = (open_after & (jnp.arange(length) < first[..., None])).any(-1)
    return is_eos.any(-1) & ~open_before


def _next_block_seed(logits: jax.Array, valid: jax.Array, block_full: jax.Array, block: jax.Array, lay,
                     config) -> tuple[jax.Array, jax.Array]:
    """The seed after the block advances (`block_full`, a bool scalar; `block` the new block): its
    next-block half moves to the front and stays valid where the forward that made it covered the new
    block (the whole canvas, or the same cache window), else the seed is stale."""
    bl = config.block_length
    if logits.shape[1] == bl:
        return logits, valid & ~block_full
    moved = jnp.concatenate([logits[:, bl:], jnp.zeros_like(logits[:, bl:])], 1)
    covered, window = jnp.bool_(True), config.cache.step_window(lay, config)
    if window is not None:
        covered = (block * bl) % window != 0
    return jnp.where(block_full, moved, logits), jnp.where(block_full, valid & covered, valid)

