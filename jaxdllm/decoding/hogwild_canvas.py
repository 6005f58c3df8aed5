"""The Hogwild! canvas: N workers of one causal model decoding at once over a shared cache, each seeing the
others' newest tokens in the same forward (Hogwild! Inference, Rodionov et al. 2025, `generation.py`;
`assd-hogwild-multiverse.md` §2).

Per request, K/V live in pages of `page_size` slots (`jaxdllm/decoding/pages.py`), each page stored once
with its keys at page-local positions, and owned by one part of the text: `common` (the prompt, then the
finished steps in order of completion), the `others` header ("### Work in progress (others)"), the `own`
header ("### Work in progress (own)"), a worker's current step, or the finisher. Worker w reads

    [common, others, the other workers' steps in worker order, own, its own step]

each page at the running sum of the lengths before it; each query is rotated per page (the published fast
kernel's choice), so no key is ever re-rotated. Per step every worker feeds its pending tokens (one sampled
token, or a new step's header in one wider forward) into its own pages and attends with everything
written in that forward: the published token-level sync.

* **Step end** (`Hogwild.step_ends`): when a worker samples a token that completes "\\n\\n" after the end of
  a sentence, its step's pages become `common`'s newest pages: nothing is copied and no key rotated (the
  published code rotates the block's keys into the common cache; here the pages only change place in the
  views). Deeper-layer K/V keep the positions they were computed at: the published caveat. The worker is
  fed that token + "**Name [k+1]:** " (+ the redundancy check when it wrote more than `check_every`
  tokens since the last one) in new pages next.
* **End.** A request ends when a worker samples EOS (the published `inference_lib` rule), or when its
  budget is spent: then the s1-style finisher runs in worker 0's row over the flattened state ([common,
  others, every worker's partial step, "<...>" + "Wait, given the limited time, ... \\boxed{"]) and decodes
  `finisher_tokens` tokens greedily.
* **Budget.** `gen_length` is the width of the answer: the finished steps, the partial steps and the
  finisher's tokens, in that order. The workers stop once another step could overflow it.

Where it differs from the published loop: the stop is EOS or the budget (the published main branch also
stops when a `\\boxed{}` answer parses; that needs text parsing on the host).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.attention.shared_view import SharedView
from jaxdllm.decoding import pages
from jaxdllm.decoding.canvas import Footprint
from jaxdllm.decoding.policies.hogwild import Hogwild
from jaxdllm.decoding.state import DecodeState
from jaxdllm.errors import ConfigError

COMMON, OTHERS, OWN, FIRST_WORKER = 0, 1, 2, 3  # page owners; worker w's step is FIRST_WORKER + w, then the finisher
FREE = -1
WORK, FINISH, OVER = range(3)
_LAST = 1 << 20  # sort keys: owner group * _LAST + the page's order


@struct.dataclass
class Workers:
    """The canvas's carry (rows R = B * N; NP pages of P slots per request; C the widest feed).

    kv: the pages' `KVCache` (`[B * NP, P]`). tokens, fed_at: `[B * NP, P]` each slot's token and the request's
    forward count when it was fed. owner, order: `[B, NP]` each page's part
    of the text (`FREE`, `COMMON`, ...) and its place in it (a page's id; `NP` + a count for the pages moved
    into `common`). next_page, next_order: `[B]` the next page to hand out, the next moved page's order. last_page: `[R]`
    the row's newest page (-1: it starts a new one); fill: `[R]` slots used in it. step_no: `[R]` k of the
    current step. since_check: `[R]` tokens since the last redundancy check. last: `[R]` the sampled token to
    feed. pending, n_pending: `[R, C]`, `[R]` a prefix to feed instead. tail: `[R, 2]` the two last fed
    tokens. phase, written, skip: `[B]` (`WORK`, `FINISH`, `OVER`; tokens the workers fed; the prompt's
    length). answer, answer_at, n_answer: `[B, finisher_tokens]` (twice), `[B]` the finisher's tokens and the
    forward that chose each. steps_done: `[B]`.
    """

    kv: object
    tokens: jax.Array
    fed_at: jax.Array
    owner: jax.Array
    order: jax.Array
    next_page: jax.Array
    next_order: jax.Array
    last_page: jax.Array
    fill: jax.Array
    step_no: jax.Array
    since_check: jax.Array
    last: jax.Array
    pending: jax.Array
    n_pending: jax.Array
    tail: jax.Array
    phase: jax.Array
    written: jax.Array
    skip: jax.Array
    answer: jax.Array
    answer_at: jax.Array
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


def _num_pages(policy: Hogwild, prompt_len: int, gen_length: int) -> int:
    """Pages per request: the text's slots (prompt, headers, answer, finisher text), a partly filled last page
    per step (a step holds at least its header) and per part of the text."""
    size = policy.page_size
    fixed = len(policy.others_header) + len(policy.own_header) + len(policy.finisher_ids) + policy.finisher_tokens
    shortest_step = 1 + min(len(p) for p in policy.header_prefixes) + 1 + len(policy.header_suffix)
    return -(-(prompt_len + gen_length + fixed) // size) + gen_length // shortest_step + 2 * policy.workers + 6


class HogwildCanvas(pages.SharedPagesCanvas):
    """N workers over shared pages, token-level sync (causal models of the shared Transformer)."""

    name = "hogwild_canvas"
    policy_base = Hogwild

    def check_model(self, model_config, config) -> None:
        super().check_model(model_config, config)
        policy = config.policy
        policy.check_texts()
        if config.gen_length < policy.workers * policy.step_feed + policy.finisher_tokens + 1:
            raise ConfigError(f"gen_length {config.gen_length} cannot hold one step of {policy.workers} workers "
                              f"({policy.step_feed} tokens each) and the finisher's {policy.finisher_tokens}")

    def max_steps(self, config, lay=None) -> int:
        return config.gen_length + config.policy.finisher_tokens + 2  # every work step writes a token per worker

    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """Per request: its pages; N rows of the widest feed, each gathering every page (their scores: the feed
        against every page)."""
        policy = config.policy
        slots = _num_pages(policy, prompt_len, config.gen_length) * policy.page_size
        return Footprint(canvas=prompt_len + config.gen_length, kv_slots=slots,
                         widest=max(prompt_len, policy.workers * policy.chunk), attended=slots,
                         logits=policy.workers, gathered=policy.workers * slots)

    # -- the loop ------------------------------------------------------------------------------
    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None) -> DecodeState:
        """`common` prefilled with the prompt (the formatted problem), both headers written, each worker's first
        step pending."""
        policy: Hogwild = config.policy
        b, lp = prompt.shape
        n, c, size = policy.workers, policy.chunk, policy.page_size
        n_pages = _num_pages(policy, lp, config.gen_length)
        kv = model.init_cache(b * n_pages, size)
        base = jnp.arange(b, dtype=jnp.int32) * n_pages
        seg = view.seg[:, :lp]
        real = seg.sum(1).astype(jnp.int32)
        # the prompt's real tokens from slot 0 of the first pages, then each header in pages of its own
        prompt_pages = -(-lp // size)
        others, others_len = _padded((policy.others_header,))
        own, own_len = _padded((policy.own_header,))
        others_pages, own_pages = -(-others.shape[1] // size), -(-own.shape[1] // size)
        ids = jnp.concatenate([prompt.astype(jnp.int32), jnp.tile(others, (b, 1)), jnp.tile(own, (b, 1))], 1)
        valid_ids = jnp.concatenate([seg > 0, jnp.broadcast_to(jnp.arange(others.shape[1]) < others_len[0], (b, others.shape[1])),
                                     jnp.broadcast_to(jnp.arange(own.shape[1]) < own_len[0], (b, own.shape[1]))], 1)
        at_prompt = jnp.maximum(jnp.arange(lp)[None] - (lp - real)[:, None], 0)
        slot = jnp.concatenate([at_prompt, jnp.broadcast_to(jnp.arange(others.shape[1]) + prompt_pages * size, (b, others.shape[1])),
                                jnp.broadcast_to(jnp.arange(own.shape[1]) + (prompt_pages + others_pages) * size,
                                                 (b, own.shape[1]))], 1)
        # one forward: each part reads only itself (positions from 0 within it)
        part = jnp.concatenate([jnp.zeros((b, lp), jnp.int32), jnp.ones((b, others.shape[1]), jnp.int32),
                                jnp.full((b, own.shape[1]), 2, jnp.int32)], 1)
        first_local = jnp.asarray([0, prompt_pages, prompt_pages + others_pages], jnp.int32)
        positions = slot - first_local[part] * size
        for p_id, (first, count) in enumerate(((0, prompt_pages), (prompt_pages, others_pages),
                                               (prompt_pages + others_pages, own_pages))):
            rows = part == p_id
            views = base[:, None] + first + jnp.arange(count)[None]
            prefill = SharedView(view_blocks=views, view_offsets=jnp.broadcast_to(jnp.arange(count) * size, views.shape),
                                 write_block=base[:, None] + slot // size, write_slot=slot % size,
                                 q_valid=valid_ids & rows)
            kv = model(ids, positions, prefill, kv, logits_slice=(0, 1)).cache
        blocks, where = (base[:, None] + slot // size), jnp.where(valid_ids, slot % size, size)
        tokens = jnp.zeros((b * n_pages, size), jnp.int32).at[blocks, where].set(ids, mode="drop")
        local = jnp.arange(n_pages)[None]
        owner = jnp.where(local < prompt_pages, COMMON, jnp.where(local < prompt_pages + others_pages, OTHERS,
                                                                   jnp.where(local < prompt_pages + others_pages + own_pages,
                                                                             OWN, FREE)))
        owner = jnp.broadcast_to(owner, (b, n_pages)).astype(jnp.int32)
        first, first_len = _padded(policy.first_steps, c)
        r = b * n
        zeros = jnp.zeros((r,), jnp.int32)
        workers = Workers(kv=kv, tokens=tokens, fed_at=jnp.zeros_like(tokens), owner=owner, order=jnp.broadcast_to(local, (b, n_pages)).astype(jnp.int32),
                          next_page=jnp.full((b,), prompt_pages + others_pages + own_pages, jnp.int32),
                          next_order=jnp.full((b,), n_pages, jnp.int32), last_page=jnp.full((r,), -1, jnp.int32),
                          fill=jnp.full((r,), size, jnp.int32), step_no=jnp.ones((r,), jnp.int32), since_check=zeros,
                          last=zeros, pending=jnp.tile(first, (b, 1)), n_pending=jnp.tile(first_len, b),
                          tail=jnp.zeros((r, 2), jnp.int32), phase=jnp.where(valid, WORK, OVER).astype(jnp.int32),
                          written=jnp.zeros((b,), jnp.int32), skip=real,
                          answer=jnp.zeros((b, policy.finisher_tokens), jnp.int32),
                          answer_at=jnp.zeros((b, policy.finisher_tokens), jnp.int32),
                          n_answer=jnp.zeros((b,), jnp.int32), steps_done=jnp.zeros((b,), jnp.int32))
        canvas = jnp.concatenate([prompt, jnp.full((b, config.gen_length), lay.eos_id, prompt.dtype)], 1)
        return DecodeState.start(canvas, view.answer & valid[:, None], done=~valid, key=key, cache=workers,
                                 policy_state=jnp.zeros((), jnp.float32), max_trajectory=config.max_trajectory)

    def _views(self, w: Workers, lengths, n: int, b: int):
        """`(view_pages [R, NP], view_offsets [R, NP])` of every row, pages in view order (-1 after the used
        ones), from the pages' lengths `[B, NP]` after this forward's writes; worker 0's row in the finisher
        reads every worker's step and writes the finisher's pages."""
        n_pages = w.owner.shape[1]
        r = b * n
        request = jnp.arange(r) // n
        me = jnp.arange(r) % n
        owner, order = w.owner[request], w.order[request]                       # [R, NP]
        finishing = (w.phase[request] == FINISH) & (me == 0)
        worker = owner - FIRST_WORKER
        is_worker = (owner >= FIRST_WORKER) & (worker < n)
        big = 2 * n + 8
        work_group = jnp.select([owner == COMMON, owner == OTHERS, is_worker & (worker != me[:, None]), owner == OWN,
                                 is_worker & (worker == me[:, None])],
                                [0, 1, 2 + worker - (worker > me[:, None]), n + 1, n + 2], big)
        finish_group = jnp.select([owner == COMMON, owner == OTHERS, is_worker, owner == FIRST_WORKER + n],
                                  [0, 1, 2 + worker, n + 2], big)
        group = jnp.where(finishing[:, None], finish_group, work_group)
        key = jnp.where(group < big, group * _LAST + order, big * _LAST)
        sorted_local = jnp.argsort(key, axis=1)
        used = jnp.take_along_axis(key, sorted_local, 1) < big * _LAST
        length = jnp.where(used, jnp.take_along_axis(lengths[request], sorted_local, 1), 0)
        offsets = jnp.cumsum(length, 1) - length
        view_pages = jnp.where(used, sorted_local + (request * n_pages)[:, None], -1)
        return view_pages, offsets.astype(jnp.int32)

    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        policy: Hogwild = config.policy
        w: Workers = state.cache
        b, lp = state.canvas.shape[0], lay.prompt_len
        n, c, size = policy.workers, policy.chunk, policy.page_size
        r = b * n
        n_pages = w.owner.shape[1]
        request = jnp.arange(r) // n
        worker = jnp.arange(r) % n
        phase = w.phase[request]
        feeding = (phase == WORK) | ((phase == FINISH) & (worker == 0))
        fed = jnp.where(w.n_pending > 0, w.n_pending, 1) * feeding
        # pages for what the rows write, owned by their step (or the finisher)
        need = pages.pages_needed(w.fill, fed, size)
        first, next_page = pages.allocate(need.reshape(b, n), w.next_page)
        first = first.reshape(-1)
        row_owner = jnp.where(phase == FINISH, FIRST_WORKER + n, FIRST_WORKER + worker)
        most = -(-c // size) + 1
        owner, order = w.owner, w.order
        for i in range(most):  # a new page's order is its id: pages are handed out in order, never freed
            new = feeding & (i < need)
            page = jnp.where(new, first + i, n_pages)
            owner = owner.at[request, page].set(row_owner, mode="drop")
            order = order.at[request, page].set(first + i, mode="drop")
        new_pages = first + request * n_pages                                   # global id of each row's first new page
        g = w.fill[:, None] + jnp.arange(c, dtype=jnp.int32)[None]               # slot counted from the newest page
        target_page = jnp.where(g < size, w.last_page[:, None], new_pages[:, None] + g // size - 1)
        valid = jnp.arange(c)[None] < fed[:, None]
        # the pages' lengths after this forward's writes
        lengths = pages.page_lengths(w.kv.segment_ids).reshape(b, n_pages)
        written_now = jnp.zeros((b * n_pages,), jnp.int32).at[jnp.where(valid, target_page, b * n_pages)].add(
            1, mode="drop").reshape(b, n_pages)
        w = w.replace(owner=owner, order=order, next_page=next_page)
        view_pages, offsets = self._views(w, lengths + written_now, n, b)
        my_entry = jnp.argmax(view_pages == jnp.where(w.fill < size, w.last_page, new_pages)[:, None], axis=1)
        start = jnp.take_along_axis(offsets, my_entry[:, None], 1)[:, 0] + jnp.where(w.fill < size, w.fill, 0)

        def forward(width):
            ids = jnp.where(w.n_pending[:, None] > 0, w.pending[:, :width], 0).at[:, 0].set(
                jnp.where(w.n_pending > 0, w.pending[:, 0], w.last))
            shared = SharedView(view_blocks=view_pages, view_offsets=offsets, write_block=target_page[:, :width],
                                write_slot=g[:, :width] % size, q_valid=valid[:, :width])
            positions = start[:, None] + jnp.arange(width, dtype=jnp.int32)[None]
            out = model(ids, positions, shared, w.kv)
            logits = jnp.take_along_axis(out.logits, jnp.maximum(fed - 1, 0)[:, None, None], 1)[:, 0]
            pad = lambda x, v: jnp.concatenate([x, jnp.full((r, c - width), v, x.dtype)], 1)
            return out.cache, logits.astype(jnp.float32), pad(ids, 0)

        if c > 1:
            kv, logits, ids = jax.lax.cond((feeding & (w.n_pending > 0)).any(), lambda _: forward(c),
                                           lambda _: forward(1), None)
        else:
            kv, logits, ids = forward(1)
        nfe = state.nfe + (w.phase != OVER).astype(jnp.int32)
        where = (jnp.where(valid, target_page, b * n_pages), g % size)
        tokens = w.tokens.at[where].set(ids, mode="drop")
        fed_at = w.fed_at.at[where].set(nfe[request][:, None], mode="drop")
        key = jax.random.fold_in(state.key, state.step)
        sampled = policy.choose(logits, key, config.temperature, worker=worker, step=state.step)
        greedy = policy.choose(logits, key, 0.0, worker=worker, step=state.step)
        # the two last fed tokens
        last_fed = jnp.take_along_axis(ids, jnp.maximum(fed - 1, 0)[:, None], 1)[:, 0]
        before = jnp.where(fed >= 2, jnp.take_along_axis(ids, jnp.maximum(fed - 2, 0)[:, None], 1)[:, 0], w.tail[:, 1])
        tail = jnp.where(feeding[:, None], jnp.stack([before, last_fed], 1), w.tail)
        last_page = jnp.where(need > 0, new_pages + need - 1, w.last_page)
        working = feeding & (phase == WORK)
        w = w.replace(kv=kv, tokens=tokens, fed_at=fed_at, fill=pages.after_write(w.fill, fed, size), last_page=last_page, tail=tail,
                      n_pending=jnp.where(feeding, 0, w.n_pending),
                      since_check=w.since_check + jnp.where(working, fed, 0),
                      written=w.written + jnp.where(working, fed, 0).reshape(b, n).sum(1))
        w = self._finisher(w, greedy, feeding & (phase == FINISH), nfe, policy, lay, b, n)
        w = self._work(w, sampled, working, policy, lay, config, b, n)
        done = state.done | (w.phase == OVER)

        def answers(outputs):  # the text of the requests that ended now (rare: computed only then)
            canvas, steps = outputs
            text, decided = self._answer(w, canvas, steps, nfe, lp, b, n)
            now = (done & ~state.done)[:, None]
            return jnp.where(now, text, canvas), jnp.where(now, decided, steps)

        canvas, commit_step = jax.lax.cond((done & ~state.done).any(), answers, lambda x: x,
                                           (state.canvas, state.commit_step))
        # the answer is undecided until its request ends (the merged text is written then)
        return state.replace(canvas=canvas, commit_step=commit_step, undecided=state.undecided & ~done[:, None],
                             nfe=nfe, done=done, cache=w)

    def _work(self, w: Workers, t, working, policy: Hogwild, lay, config, b: int, n: int) -> Workers:
        """The workers' samples: a step that ends joins `common` and the worker is fed its next header; EOS ends
        the request; a spent budget starts the finisher."""
        r = b * n
        request = jnp.arange(r) // n
        worker = jnp.arange(r) % n
        ends = working & policy.step_ends(w.tail[:, 0], w.tail[:, 1], t)
        eos = (working & (t == lay.eos_id)).reshape(b, n).any(1)
        w = _into_common(w, ends, b, n)
        k = w.step_no + ends.astype(jnp.int32)
        check = ends & (w.since_check > policy.check_every)
        prefixes, prefix_len = _padded(policy.header_prefixes)
        digits = jnp.stack([k // 100 % 10, k // 10 % 10, k % 10], 1)
        n_digits = 1 + (k >= 10) + (k >= 100)
        digit_ids = jnp.asarray(policy.digit_ids, jnp.int32)[digits]
        digit_ids = jnp.take_along_axis(digit_ids, jnp.clip(jnp.arange(3)[None] + 3 - n_digits[:, None], 0, 2), 1)
        suffix, suffix_len = _padded((policy.header_suffix,))
        check_ids, check_len = _padded((policy.check_ids,))
        header, header_len = _concat([(t[:, None], jnp.ones((r,), jnp.int32)), (prefixes[worker], prefix_len[worker]),
                                      (digit_ids, n_digits), (jnp.tile(suffix, (r, 1)), jnp.tile(suffix_len, r)),
                                      (jnp.tile(check_ids, (r, 1)), jnp.where(check, jnp.tile(check_len, r), 0))],
                                     policy.chunk)
        over_budget = w.written + n * policy.step_feed > config.gen_length - policy.finisher_tokens
        phase = jnp.where((w.phase == WORK) & eos, OVER, jnp.where((w.phase == WORK) & over_budget, FINISH, w.phase))
        fin, fin_len = _padded((policy.finisher_ids,), policy.chunk)
        starts_finish = ((w.phase == WORK) & (phase == FINISH))[request] & (worker == 0)
        fresh = ends | starts_finish                                            # the row writes into new pages next
        return w.replace(last=jnp.where(working, t, w.last), step_no=k,
                         since_check=jnp.where(check, 0, w.since_check),
                         pending=jnp.where(starts_finish[:, None], jnp.tile(fin, (r, 1)),
                                           jnp.where(ends[:, None], header, w.pending)),
                         n_pending=jnp.where(starts_finish, fin_len[0], jnp.where(ends, header_len, w.n_pending)),
                         last_page=jnp.where(fresh, -1, w.last_page),
                         fill=jnp.where(fresh, policy.page_size, w.fill), phase=phase)

    def _finisher(self, w: Workers, t, fed, nfe, policy: Hogwild, lay, b: int, n: int) -> Workers:
        """Worker 0's row in the finisher: collect its greedy tokens; `finisher_tokens` of them or EOS end it."""
        fed_b = fed.reshape(b, n)[:, 0]
        t_b = t.reshape(b, n)[:, 0]
        at = (jnp.arange(b), jnp.where(fed_b, w.n_answer, policy.finisher_tokens))
        answer = w.answer.at[at].set(t_b, mode="drop")
        w = w.replace(answer_at=w.answer_at.at[at].set(nfe, mode="drop"))
        n_answer = w.n_answer + fed_b.astype(jnp.int32)
        over = fed_b & ((t_b == lay.eos_id) | (n_answer >= policy.finisher_tokens))
        last = jnp.where(jnp.repeat(fed_b, n) & (jnp.arange(b * n) % n == 0), t, w.last)
        return w.replace(answer=answer, n_answer=n_answer, phase=jnp.where(over, OVER, w.phase), last=last)

    def _answer(self, w: Workers, canvas, steps, nfe, lp: int, b: int, n: int):
        """`(tokens [B, Lp + G], commit steps)`: the prompt, then the finished steps, each worker's partial step,
        the finisher's tokens, EOS after them. A sampled token was chosen by the forward before the one that fed
        it (the workers' first steps, fed by the first forward: 1); the finisher's by the forward that chose
        it; EOS and the filler by the last."""
        g = canvas.shape[1] - lp
        n_pages = w.owner.shape[1]
        group = jnp.where(w.owner == COMMON, 0, jnp.where((w.owner >= FIRST_WORKER) & (w.owner < FIRST_WORKER + n),
                                                          1 + w.owner - FIRST_WORKER, n + 2))
        local = jnp.argsort(group * _LAST + w.order, axis=1)
        used = jnp.take_along_axis(group, local, 1) < n + 2
        view_pages = jnp.where(used, local + (jnp.arange(b) * n_pages)[:, None], -1)
        text, length = pages.view_text(w.tokens, w.kv.segment_ids, view_pages, w.skip, g, 0)
        fed, _ = pages.view_text(w.fed_at, w.kv.segment_ids, view_pages, w.skip, g, 0)
        text, total = _concat([(text, length), (w.answer, w.n_answer)], g)
        decided, _ = _concat([(jnp.maximum(fed - 1, 1), length), (w.answer_at, w.n_answer)], g)
        inside = jnp.arange(g)[None] < total[:, None]
        answer = jnp.where(inside, text, canvas[:, lp:])
        return (jnp.concatenate([canvas[:, :lp], answer.astype(canvas.dtype)], 1),
                jnp.concatenate([steps[:, :lp], jnp.where(inside, decided, nfe[:, None])], 1))


def _into_common(w: Workers, ends, b: int, n: int) -> Workers:
    """Each ending step's pages become `common`'s newest (worker order within a step), nothing copied: a moved
    page's order is `NP + ` the pages moved before it (`next_order` counts them)."""
    owner, order, next_order = w.owner, w.order, w.next_order
    for u in range(n):
        moving = ends.reshape(b, n)[:, u]
        mine = owner == FIRST_WORKER + u                                         # [B, NP]
        rank = (mine[:, None, :] & (order[:, None, :] < order[:, :, None])).sum(-1)   # its pages before each
        take = moving[:, None] & mine
        owner = jnp.where(take, COMMON, owner)
        order = jnp.where(take, next_order[:, None] + rank, order)
        next_order = next_order + jnp.where(moving, mine.sum(1), 0)
    return w.replace(owner=owner, order=order, next_order=next_order,
                     steps_done=w.steps_done + ends.reshape(b, n).sum(1))
