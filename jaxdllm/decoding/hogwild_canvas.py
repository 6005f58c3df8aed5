"""The Hogwild! canvas: N workers of one causal model decoding at once over a shared cache, each seeing the
others' newest tokens in the same forward (Hogwild! Inference, Rodionov et al. 2025, `generation.py`;
`assd-hogwild-multiverse.md` §2).

Per request: shared blocks (`jaxdllm.attention.shared_view`) `common` (the prompt, then the finished steps
in order of completion), `others` ("### Work in progress (others)"), `own` ("### Work in progress (own)"),
one block per worker (its current step) and a finisher block. Worker w reads

    [common, others, the other workers' steps in worker order, own, its own step]

with each block at the running sum of the lengths before it; keys stay at block-local positions and each
query is rotated per block (the published fast kernel's choice). Per step every worker feeds its pending
tokens (one sampled token, or a new step's header in one wider forward), writes them into its block, and
every worker attends with everything written in that forward: the published token-level sync.

* **Step end** (`Hogwild.step_ends`): when a worker samples a token that completes "\\n\\n" after the end of
  a sentence, its block is appended to `common` (keys rotated once by common's length: RoPE composes; the
  block's deeper-layer K/V keep the positions they were computed at, the published caveat), the block is
  cleared and the worker is fed that token + "**Name [k+1]:** " (+ the redundancy check when it wrote more
  than `check_every` tokens since the last one) next.
* **End.** A request ends when a worker samples EOS (the published `inference_lib` rule), or when its
  budget is spent: then the s1-style finisher runs in worker 0's row over the flattened state ([common,
  others, every worker's partial step, "<...>" + "Wait, given the limited time, ... \\boxed{"]) and decodes
  `finisher_tokens` tokens greedily.
* **Budget.** `gen_length` is the width of the answer: the finished steps, the partial steps and the
  finisher's tokens, in that order. The workers stop once another step could overflow it.

Where it differs from the published loop: the stop is EOS or the budget (the published main branch also
stops when a `\\boxed{}` answer parses; that needs text parsing on the host); a step that fills its block
ends there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.attention.shared_view import SharedView
from jaxdllm.decoding.canvas import Canvas, Footprint
from jaxdllm.decoding.policies.hogwild import Hogwild
from jaxdllm.decoding.state import DecodeState
from jaxdllm.errors import ConfigError
from jaxdllm.models.layers import apply_rope, rope_inv_freq

COMMON, OTHERS, OWN, FIRST_WORKER = 0, 1, 2, 3  # blocks of a request; the finisher's is FIRST_WORKER + N
WORK, FINISH, OVER = range(3)


@struct.dataclass
class Workers:
    """The canvas's carry (rows R = B * N, blocks NB = B * (N + 4), S slots each, C the widest feed).

    kv: the blocks' `KVCache`. tokens: `[NB, S]`. fill: `[R]` slots of the row's own step (worker 0's
    row in the finisher: the finisher block's). step_no: `[R]` k of the current step. since_check: `[R]`
    tokens since the last redundancy check. last: `[R]` the sampled token to feed. pending, n_pending:
    `[R, C]`, `[R]` a prefix to feed instead. tail: `[R, 2]` the two last fed tokens. common_len, phase,
    written: `[B]` (`WORK`, `FINISH`, `OVER`); answer, n_answer: `[B, finisher_tokens]`, `[B]` the
    finisher's tokens. steps_done: `[B]` finished steps.
    """

    kv: object
    tokens: jax.Array
    fill: jax.Array
    step_no: jax.Array
    since_check: jax.Array
    last: jax.Array
    pending: jax.Array
    n_pending: jax.Array
    tail: jax.Array
    common_len: jax.Array
    phase: jax.Array
    written: jax.Array
    answer: jax.Array
    n_answer: jax.Array
    steps_done: jax.Array


def _concat(pieces, width: int):
    """Row-wise concatenation of `(ids [R, Wi], lengths [R])` pieces into `(ids [R, width], lengths [R])`."""
    r = pieces[0][0].shape[0]
    out = jnp.zeros((r, width), jnp.int32)
    at = jnp.zeros((r,), jnp.int32)
    for ids, length in pieces:
        cols = at[:, None] + jnp.arange(ids.shape[1])[None]
        cols = jnp.where(jnp.arange(ids.shape[1])[None] < length[:, None], cols, width)
        out = out.at[jnp.arange(r)[:, None], cols].set(ids.astype(jnp.int32), mode="drop")
        at = at + length
    return out, at


def _padded(rows, width: int | None = None):
    """`(ids [n, W], lengths [n])` of a tuple of id tuples."""
    width = width or max(1, max(len(x) for x in rows))
    return (jnp.asarray([list(x) + [0] * (width - len(x)) for x in rows], jnp.int32),
            jnp.asarray([len(x) for x in rows], jnp.int32))


class HogwildCanvas(Canvas):
    """N workers over shared cache blocks, token-level sync (causal models of the shared Transformer)."""

    name = "hogwild_canvas"
    policy_base = Hogwild
    diffusion_blocks = False

    def check_config(self, config) -> None:
        if config.cache.keeps_kv:
            raise ConfigError("policy='hogwild' keeps its own shared cache blocks: leave cache='none'")
        if config.stop_at_eos == "block":
            raise ConfigError("stop_at_eos='block' finishes a diffusion block; Hogwild! decodes token by token")
        policy = config.policy
        if policy.first_steps and config.gen_length < policy.workers * policy.chunk + policy.finisher_tokens + 1:
            raise ConfigError(f"gen_length {config.gen_length} cannot hold one step of {policy.workers} workers "
                              f"({policy.chunk} tokens each) and the finisher's {policy.finisher_tokens}")

    def check_model(self, model_config, config) -> None:
        from jaxdllm.models.transformer import _MODELS, Transformer  # a family's own model has no SharedView path
        if (model_config.attention != "causal" or model_config.shift_logits
                or _MODELS.get(type(model_config), Transformer) is not Transformer):
            raise ConfigError("policy='hogwild' decodes causal models of the shared Transformer (Qwen2/Llama "
                              f"families); this model has attention={model_config.attention!r}")

    def max_steps(self, config, lay=None) -> int:
        return config.gen_length + config.policy.finisher_tokens + 2  # every work step writes a token per worker

    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """Per request: N + 4 blocks of `Lp + G` slots, N rows of the widest feed."""
        policy = config.policy
        slots = prompt_len + config.gen_length
        blocks = policy.workers + 4
        return Footprint(canvas=slots, kv_slots=blocks * slots,
                         widest=max(prompt_len, policy.workers * policy.chunk), attended=blocks * slots,
                         logits=policy.workers)

    # -- the loop ------------------------------------------------------------------------------
    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None) -> DecodeState:
        """`common` prefilled with the prompt (the formatted problem), the two header blocks written, each
        worker's first step pending."""
        policy: Hogwild = config.policy
        b, lp = prompt.shape
        n, c = policy.workers, policy.chunk
        blocks_per, slots = n + 4, lp + config.gen_length
        kv = model.init_cache(b * blocks_per, slots)
        base = jnp.arange(b, dtype=jnp.int32) * blocks_per
        seg = view.seg[:, :lp]
        pad = lp - seg.sum(1)
        # the prompt into `common` (left padding not written), then both headers in one forward
        one = lambda blocks, offsets, valid_: SharedView(view_blocks=blocks[:, None], view_offsets=offsets[:, None],
                                                          write_block=blocks, write_slot=jnp.zeros_like(blocks),
                                                          q_valid=valid_)
        kv = model(prompt.astype(jnp.int32), view.positions[:, :lp], one(base + COMMON, -pad, seg > 0), kv,
                   logits_slice=(lp - 1, 1)).cache
        headers, lengths = _padded((policy.others_header, policy.own_header))
        hb = jnp.stack([base + OTHERS, base + OWN], 1).reshape(-1)
        ids = jnp.tile(headers, (b, 1))
        valid_h = jnp.arange(ids.shape[1])[None] < jnp.tile(lengths, b)[:, None]
        kv = model(ids, jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape), one(hb, jnp.zeros_like(hb), valid_h),
                   kv, logits_slice=(0, 1)).cache
        tokens = jnp.zeros((b * blocks_per, slots), jnp.int32).at[base + COMMON, :lp].set(prompt.astype(jnp.int32))
        tokens = tokens.at[hb, :ids.shape[1]].set(jnp.where(valid_h, ids, 0))
        first, first_len = _padded(policy.first_steps, c)
        r = b * n
        zeros = jnp.zeros((r,), jnp.int32)
        workers = Workers(kv=kv, tokens=tokens, fill=zeros, step_no=jnp.ones((r,), jnp.int32), since_check=zeros,
                          last=zeros, pending=jnp.tile(first, (b, 1)), n_pending=jnp.tile(first_len, b),
                          tail=jnp.zeros((r, 2), jnp.int32), common_len=jnp.full((b,), lp, jnp.int32),
                          phase=jnp.where(valid, WORK, OVER).astype(jnp.int32), written=jnp.zeros((b,), jnp.int32),
                          answer=jnp.zeros((b, policy.finisher_tokens), jnp.int32),
                          n_answer=jnp.zeros((b,), jnp.int32), steps_done=jnp.zeros((b,), jnp.int32))
        canvas = jnp.concatenate([prompt, jnp.full((b, config.gen_length), lay.eos_id, prompt.dtype)], 1)
        return DecodeState.start(canvas, jnp.zeros_like(canvas, bool), done=~valid, key=key, cache=workers,
                                 policy_state=jnp.zeros((), jnp.float32), max_trajectory=config.max_trajectory)

    def _views(self, w: Workers, lengths, n: int, b: int):
        """`(view_blocks [R, V], view_offsets [R, V], write entry offset [R])` of every row (V = N + 3), from
        the blocks' lengths `[B, N + 4]` after this forward's writes; worker 0's row in the finisher reads
        every worker's step and writes the finisher block."""
        entries = []
        for wk in range(n):
            others = [FIRST_WORKER + u for u in range(n) if u != wk]
            work = [COMMON, OTHERS] + others + [OWN, FIRST_WORKER + wk]
            finish = [COMMON, OTHERS] + [FIRST_WORKER + u for u in range(n)] + [FIRST_WORKER + n]
            entries.append((work, finish))
        work = jnp.asarray([e[0] for e in entries], jnp.int32)                 # [N, V] local block ids
        finish = jnp.asarray([e[1] for e in entries], jnp.int32)
        finishing = jnp.repeat(w.phase == FINISH, n) & (jnp.arange(b * n) % n == 0)
        local = jnp.where(finishing[:, None], jnp.tile(finish, (b, 1)), jnp.tile(work, (b, 1)))   # [R, V]
        request = jnp.arange(b * n) // n
        length = jnp.take_along_axis(lengths[request], local, 1)
        offsets = jnp.cumsum(length, 1) - length
        return local + (request * (n + 4))[:, None], offsets.astype(jnp.int32)

    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        policy: Hogwild = config.policy
        w: Workers = state.cache
        b, lp = state.canvas.shape[0], lay.prompt_len
        n, c = policy.workers, policy.chunk
        r = b * n
        slots = w.tokens.shape[1]
        worker = jnp.arange(r) % n
        phase = jnp.repeat(w.phase, n)
        feeding = (phase == WORK) | ((phase == FINISH) & (worker == 0))
        fed = jnp.where(w.n_pending > 0, w.n_pending, 1) * feeding
        # the blocks' lengths after this forward's writes: headers fixed, steps + what each worker feeds
        header_len = jnp.asarray([len(policy.others_header), len(policy.own_header)], jnp.int32)
        step_len = (w.fill + fed).reshape(b, n)
        fin_len = jnp.where(w.phase == FINISH, (w.fill + fed).reshape(b, n)[:, 0], 0)
        lengths = jnp.concatenate([w.common_len[:, None], jnp.tile(header_len, (b, 1)),
                                   jnp.where(w.phase[:, None] == FINISH, _own_fill(w, b, n), step_len),
                                   fin_len[:, None]], 1)
        blocks, offsets = self._views(w, lengths, n, b)

        def forward(width):
            ids = jnp.where(w.n_pending[:, None] > 0, w.pending[:, :width], 0).at[:, 0].set(
                jnp.where(w.n_pending > 0, w.pending[:, 0], w.last))
            valid = jnp.arange(width)[None] < fed[:, None]
            shared = SharedView(view_blocks=blocks, view_offsets=offsets, write_block=blocks[:, -1],
                                write_slot=w.fill, q_valid=valid)
            positions = offsets[:, -1:] + w.fill[:, None] + jnp.arange(width, dtype=jnp.int32)[None]
            out = model(ids, positions, shared, w.kv)
            logits = jnp.take_along_axis(out.logits, jnp.maximum(fed - 1, 0)[:, None, None], 1)[:, 0]
            where = shared.write_targets(slots)[1]
            pad = lambda x, v: jnp.concatenate([x, jnp.full((r, c - width), v, x.dtype)], 1)
            return out.cache, logits.astype(jnp.float32), pad(ids, 0), pad(where, slots)

        if c > 1:
            kv, logits, ids, where = jax.lax.cond((feeding & (w.n_pending > 0)).any(), lambda _: forward(c),
                                                  lambda _: forward(1), None)
        else:
            kv, logits, ids, where = forward(1)
        tokens = w.tokens.at[jnp.broadcast_to(blocks[:, -1:], where.shape), where].set(ids, mode="drop")
        nfe = state.nfe + (w.phase != OVER).astype(jnp.int32)
        key = jax.random.fold_in(state.key, state.step)
        sampled = policy.choose(logits, key, config.temperature, worker=worker, step=state.step)
        greedy = policy.choose(logits, key, 0.0, worker=worker, step=state.step)
        # the two last fed tokens
        last_fed = jnp.take_along_axis(ids, jnp.maximum(fed - 1, 0)[:, None], 1)[:, 0]
        before = jnp.where(fed >= 2, jnp.take_along_axis(ids, jnp.maximum(fed - 2, 0)[:, None], 1)[:, 0], w.tail[:, 1])
        tail = jnp.where(feeding[:, None], jnp.stack([before, last_fed], 1), w.tail)
        fill = w.fill + fed
        working = feeding & (phase == WORK)
        w = w.replace(kv=kv, tokens=tokens, fill=fill, tail=tail, n_pending=jnp.where(feeding, 0, w.n_pending),
                      since_check=w.since_check + jnp.where(working, fed, 0),
                      written=w.written + jnp.where(working, fed, 0).reshape(b, n).sum(1))
        w = self._finisher(w, jnp.where(phase == FINISH, greedy, sampled), feeding & (phase == FINISH), policy, lay, b, n)
        w = self._work(w, sampled, working, policy, lay, config, model, b, n)
        done = state.done | (w.phase == OVER)
        canvas = jnp.where((done & ~state.done)[:, None], self._answer(w, state.canvas, lp, b, n), state.canvas)
        return state.replace(canvas=canvas, nfe=nfe, done=done, cache=w)

    def _work(self, w: Workers, t, working, policy: Hogwild, lay, config, model, b: int, n: int) -> Workers:
        """The workers' samples: a step that ends moves into `common` and the worker is fed its next header;
        EOS ends the request; a spent budget starts the finisher."""
        slots = w.tokens.shape[1]
        ends = working & (policy.step_ends(w.tail[:, 0], w.tail[:, 1], t) | (w.fill + policy.chunk + 1 >= slots))
        eos = (working & (t == lay.eos_id)).reshape(b, n).any(1)
        w = _move_into_common(w, ends, model, b, n)
        k = w.step_no + ends.astype(jnp.int32)
        check = ends & (w.since_check > policy.check_every)
        prefixes, prefix_len = _padded(policy.header_prefixes)
        worker = jnp.arange(b * n) % n
        digits = jnp.stack([k // 100 % 10, k // 10 % 10, k % 10], 1)
        n_digits = 1 + (k >= 10) + (k >= 100)
        digit_ids = jnp.asarray(policy.digit_ids, jnp.int32)[digits]
        digit_ids = jnp.take_along_axis(digit_ids, jnp.clip(jnp.arange(3)[None] + 3 - n_digits[:, None], 0, 2), 1)
        suffix, suffix_len = _padded((policy.header_suffix,))
        check_ids, check_len = _padded((policy.check_ids,))
        r = b * n
        header, header_len = _concat([(t[:, None], jnp.ones((r,), jnp.int32)), (prefixes[worker], prefix_len[worker]),
                                      (digit_ids, n_digits), (jnp.tile(suffix, (r, 1)), jnp.tile(suffix_len, r)),
                                      (jnp.tile(check_ids, (r, 1)), jnp.where(check, jnp.tile(check_len, r), 0))],
                                     policy.chunk)
        over_budget = w.written + n * policy.chunk > config.gen_length - policy.finisher_tokens
        phase = jnp.where((w.phase == WORK) & eos, OVER, jnp.where((w.phase == WORK) & over_budget, FINISH, w.phase))
        fin, fin_len = _padded((policy.finisher_ids,), policy.chunk)
        starts_finish = jnp.repeat((w.phase == WORK) & (phase == FINISH), n) & (worker == 0)
        return w.replace(last=jnp.where(working, t, w.last), step_no=k,
                         since_check=jnp.where(check, 0, w.since_check),
                         pending=jnp.where(starts_finish[:, None], jnp.tile(fin, (r, 1)),
                                           jnp.where(ends[:, None], header, w.pending)),
                         n_pending=jnp.where(starts_finish, fin_len[0], jnp.where(ends, header_len, w.n_pending)),
                         fill=jnp.where(starts_finish, 0, w.fill), phase=phase)

    def _finisher(self, w: Workers, t, fed, policy: Hogwild, lay, b: int, n: int) -> Workers:
        """Worker 0's row in the finisher: collect its greedy tokens; `finisher_tokens` of them or EOS end it."""
        fed_b = fed.reshape(b, n)[:, 0]
        t_b = t.reshape(b, n)[:, 0]
        answer = w.answer.at[jnp.arange(b), jnp.where(fed_b, w.n_answer, policy.finisher_tokens)].set(t_b, mode="drop")
        n_answer = w.n_answer + fed_b.astype(jnp.int32)
        over = fed_b & ((t_b == lay.eos_id) | (n_answer >= policy.finisher_tokens))
        last = jnp.where(jnp.repeat(fed_b, n) & (jnp.arange(b * n) % n == 0), t, w.last)
        return w.replace(answer=answer, n_answer=n_answer, phase=jnp.where(over, OVER, w.phase), last=last)

    def _answer(self, w: Workers, canvas, lp: int, b: int, n: int) -> jax.Array:
        """`[B, Lp + G]`: the prompt, then the finished steps, each worker's partial step, the finisher's tokens."""
        g = canvas.shape[1] - lp
        blocks_per = n + 4
        own = _own_fill(w, b, n)                                                # [B, N]
        pieces = [(w.tokens[jnp.arange(b) * blocks_per + COMMON, lp:], w.common_len - lp)]
        for u in range(n):
            pieces.append((w.tokens[jnp.arange(b) * blocks_per + FIRST_WORKER + u], own[:, u]))
        pieces.append((w.answer, w.n_answer))
        text, length = _concat(pieces, g)
        answer = jnp.where(jnp.arange(g)[None] < length[:, None], text, canvas[:, lp:])
        return jnp.concatenate([canvas[:, :lp], answer.astype(canvas.dtype)], 1)


def _own_fill(w: Workers, b: int, n: int) -> jax.Array:
    """`[B, N]` each worker's step length (in the finisher worker 0's `fill` counts the finisher block, so
    its step length is read from the block's written slots)."""
    blocks_per = n + 4
    ids = (jnp.arange(b)[:, None] * blocks_per + FIRST_WORKER + jnp.arange(n)[None]).reshape(-1)
    written = w.kv.segment_ids[ids] > 0
    s = written.shape[1]
    return jnp.where(written.any(1), s - jnp.argmax(written[:, ::-1], axis=1), 0).reshape(b, n)


def _move_into_common(w: Workers, ends, model, b: int, n: int) -> Workers:
    """Append each ending step's block to its request's `common` (worker order), keys rotated by common's
    length; the block is cleared."""
    config = model.config
    inv_freq = rope_inv_freq(config.rope_dim, config.rope_theta, config.rope_scaling)
    kv, tokens, common_len = w.kv, w.tokens, w.common_len
    blocks_per = n + 4
    stacked = kv.stacked
    slots = tokens.shape[1]
    fill = w.fill
    for u in range(n):
        moving = ends.reshape(b, n)[:, u]                                        # [B]
        src = jnp.arange(b) * blocks_per + FIRST_WORKER + u
        dst = jnp.arange(b) * blocks_per + COMMON
        length = fill.reshape(b, n)[:, u]
        j = jnp.arange(slots)[None]
        target = jnp.where(moving[:, None] & (j < length[:, None]), common_len[:, None] + j, slots)   # [B, S]

        def move(x, rotate):
            def one(layer):
                piece = layer[src]                                               # [B, S, Hkv, D]
                if rotate:
                    piece = apply_rope(piece, jnp.broadcast_to(common_len[:, None], piece.shape[:2]), inv_freq)
                return layer.at[dst[:, None], target].set(piece.astype(layer.dtype), mode="drop")
            return jax.vmap(one)(x) if stacked else tuple(one(layer) for layer in x)

        seg = kv.segment_ids.at[dst[:, None], target].set(1, mode="drop")
        seg = seg.at[src].set(jnp.where(moving[:, None], 0, seg[src]))
        kv = kv.replace(k=move(kv.k, True), v=move(kv.v, False), segment_ids=seg)
        tokens = tokens.at[dst[:, None], target].set(tokens[src], mode="drop")
        common_len = common_len + jnp.where(moving, length, 0)
    w_fill = jnp.where(ends, 0, fill)
    steps_done = w.steps_done + ends.reshape(b, n).sum(1)
    return w.replace(kv=kv, tokens=tokens, common_len=common_len, fill=w_fill, steps_done=steps_done)
