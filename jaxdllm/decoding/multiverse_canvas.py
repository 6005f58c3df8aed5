"""The Multiverse canvas: a causal model that forks into parallel paths and merges them, in the one loop
(Multiverse, Yang et al. 2025; the engine's scheduler, `assd-hogwild-multiverse.md` §3d).

Each request owns `K = 1 + max_paths` rows and a pool of K/V pages of `page_size` slots
(`jaxdllm/decoding/pages.py`, `jaxdllm.attention.shared_view`); row 0 is the request itself. A row reads a
view, an ordered list of (page, offset), and writes its tokens into its last page, appending pages as
they fill. `max_blocks` bounds a request's text segments (its prompt's, one per path, one per merge).
Per step every active row feeds its pending tokens (one sampled token, or a fork's / merge's prefix in one wider forward), all rows of all
requests in one batch, and samples its next token. K/V are written before any row attends (per layer),
so a row sees what another wrote in the same forward.

* **Fork.** A row that samples `</Goal>` after `n` `<Outline>`s forks: `n` free rows of the request
  join the loop, path k's view = the parent's view + a new page at offset `goal_end + 1` (every path
  starts at the same position, as training places them), fed `<Path>k:` (the policy's prefix) in the
  same forward in which the parent feeds `</Goal>` (the children see it: no extra forward). The
  parent's prefix is never copied: its pages are in every child's view. The parent then waits.
* **Path end.** A path row samples `</Path>`, feeds it, and is done (its row is free again; its pages
  stay). A path that samples EOS is closed with `</Path>`.
* **Merge.** When every path of a parent has its `</Path>`, the parent's view becomes its own view +
  each path's pages in path order (nested paths included) + a new page at `max(pos </Path>) + 1`,
  the position training gives `<Conclusion>` (goal_end + max path length + 1), and it is fed the
  conclusion prefix in the same forward as the last `</Path>`. Nothing is copied or recomputed.
* **Positions.** Training puts `<Path>` at goal_end + 1 and `<Conclusion>` right after the longest
  path (`multiverse_layout`). With `newlines=False` (text without separators between tags, as
  `training/multiverse_parts_cpu.toml` trains) the canvas feeds "<Path>k:" and "<Conclusion>" at exactly
  those positions: decoding equals the training layout (`tests/decoding/test_multiverse_fork_merge.py`).
  With `newlines=True` it feeds the published engine's "\\n<Path>\\n{k}:" and "<Conclusion>\\n", the
  newline at goal_end + 1 and `<Path>` one position after training's: the engine's shift, reproduced (in
  the published data the separators between paths are outside every span, so later paths see them; a
  fork engine cannot, whatever it does with positions).

Capacity: a fork that needs more rows than are free waits for rows; one that can never get them (more
outlines than `max_paths`, no segment left, or no other row running) is not made and the row goes on
sequentially (`forks_refused`). One fork and one merge per request per step. A request whose rows have
written `gen_length` tokens together ends there (its answer is cut).

Sequential forwards (`nfe`) count the prompt's prefill (it chooses the first token) and the steps in
which some row of the request fed tokens: the longest chain of forwards, as next-token decoding counts one
forward per token. The answer (`state.canvas`) is the merged text in order: the written slots of the
request's view's pages after the prompt.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.attention.shared_view import SharedView
from jaxdllm.decoding import pages
from jaxdllm.decoding.canvas import Footprint
from jaxdllm.decoding.policies.multiverse import TAGS, Multiverse
from jaxdllm.decoding.state import DecodeState
from jaxdllm.errors import ConfigError

FREE, ACTIVE, WAITING, NEED_FORK, PATH_DONE, FINISHED = range(6)
# what a row does after feeding this step's tokens
GO_ON, THEN_WAIT, THEN_FORK, THEN_PATH_DONE, THEN_FREE = range(5)


@struct.dataclass
class Forks:
    """The canvas's carry beside `DecodeState` (rows R = B * K; NP pages of P slots per request; V = NP).

    kv: the pages' `KVCache` (`[B * NP, P]` slots). tokens, fed_at: `[B * NP, P]` each slot's token and the
    request's forward count when it was fed. status, after: `[R]` the row's
    state and what it does after its next feed. view_pages, view_offsets: `[R, V]` (-1: unused); n_view:
    `[R]`. fill: `[R]` slots used in the row's last page; pos: `[R]` position of its next fed token. pending,
    n_pending: `[R, C]`, `[R]` a prefix to feed; last: `[R]` its sampled token. parent, path: `[R]` the
    forking row (-1: none) and the path number. outlines, goal_end, path_end: `[R]`. children: `[R]` paths a
    waiting row forked. next_page, segments, forks, forks_refused, written, skip: `[B]` (written: tokens fed
    after the prompt; skip: the prompt's length).
    """

    kv: object
    tokens: jax.Array
    fed_at: jax.Array
    status: jax.Array
    after: jax.Array
    view_pages: jax.Array
    view_offsets: jax.Array
    n_view: jax.Array
    fill: jax.Array
    pos: jax.Array
    pending: jax.Array
    n_pending: jax.Array
    last: jax.Array
    parent: jax.Array
    path: jax.Array
    outlines: jax.Array
    goal_end: jax.Array
    path_end: jax.Array
    children: jax.Array
    next_page: jax.Array
    segments: jax.Array
    forks: jax.Array
    forks_refused: jax.Array
    written: jax.Array
    skip: jax.Array


def _feeds(policy: Multiverse):
    return [policy.path_feed(k) for k in range(1, policy.max_paths + 1)] + [policy.conclusion_feed()]


def _prefix_width(policy: Multiverse) -> int:
    return max(len(f) for f in _feeds(policy))


def _prefix_table(policy: Multiverse, width: int):
    """`(ids [P + 1, C], lengths [P + 1])`: row k - 1 is path k's prefix, row P the conclusion's."""
    feeds = _feeds(policy)
    ids = jnp.asarray([list(f) + [0] * (width - len(f)) for f in feeds], jnp.int32)
    return ids, jnp.asarray([len(f) for f in feeds], jnp.int32)


def _num_pages(policy: Multiverse, prompt_len: int, gen_length: int) -> int:
    """Pages per request: the text's slots, plus a partly filled last page per segment."""
    size = policy.page_size
    return -(-(prompt_len + gen_length) // size) + policy.blocks + 1


class MultiverseCanvas(pages.SharedPagesCanvas):
    """Fork at `</Goal>`, paths in parallel rows over shared pages, merge without copying (causal models)."""

    name = "multiverse_canvas"
    policy_base = Multiverse

    def check_model(self, model_config, config) -> None:
        super().check_model(model_config, config)
        policy = config.policy
        policy.check_ids()
        if policy.tag_base + len(TAGS) > model_config.vocab_size:
            raise ConfigError(f"tag_base {policy.tag_base} + 12 tags is past the vocabulary ({model_config.vocab_size})")

    def max_steps(self, config, lay=None) -> int:
        return config.gen_length + 2  # every step feeds a token of some row of every running request

    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """Per request: its pages, `1 + max_paths` rows of the widest prefix, each gathering every page."""
        policy = config.policy
        slots = _num_pages(policy, prompt_len, config.gen_length) * policy.page_size
        rows = 1 + policy.max_paths
        return Footprint(canvas=prompt_len + config.gen_length, kv_slots=slots,
                         widest=max(prompt_len, rows * _prefix_width(policy)), attended=slots, logits=rows,
                         gathered=rows * slots)

    def comparison_presets(self, preset: str, gen_length: int, defaults: dict) -> dict:
        """The model's own next-token decoding of the Multiverse text (Jacobi with a window of 1) and the
        fork-and-merge decoding."""
        return {"sequential": ("jacobi", dict(gen_length=gen_length, window=1)),
                "multiverse": (preset, dict(gen_length=gen_length))}

    # -- the loop ------------------------------------------------------------------------------
    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None) -> DecodeState:
        """Row 0 of each request prefilled with its prompt (its first pages), its first token sampled."""
        policy: Multiverse = config.policy
        b, lp = prompt.shape
        k, size = 1 + policy.max_paths, policy.page_size
        n_pages = _num_pages(policy, lp, config.gen_length)
        r, width = b * k, _prefix_width(policy)
        kv = model.init_cache(b * n_pages, size)
        seg = view.seg[:, :lp]
        real = seg.sum(1).astype(jnp.int32)
        pad = lp - real                                                          # left padding per request
        base = jnp.arange(b, dtype=jnp.int32) * n_pages
        prompt_pages = -(-lp // size)
        # the prompt's real tokens from slot 0 of the request's first pages (position c - pad at column c)
        at = jnp.arange(lp)[None] - pad[:, None]
        views = base[:, None] + jnp.arange(prompt_pages)[None]
        prefill = SharedView(view_blocks=views, view_offsets=jnp.broadcast_to(jnp.arange(prompt_pages) * size, views.shape),
                             write_block=base[:, None] + jnp.maximum(at, 0) // size,
                             write_slot=jnp.maximum(at, 0) % size, q_valid=seg > 0)
        out = model(prompt.astype(jnp.int32), view.positions[:, :lp], prefill, kv, logits_slice=(lp - 1, 1))
        first = policy.choose(out.logits[:, 0], jax.random.fold_in(key, 2**31 - 1), config.temperature,
                              path=jnp.zeros((b,), jnp.int32), position=real)
        blocks, slots = prefill.write_targets(size)
        tokens = jnp.zeros((b * n_pages, size), jnp.int32).at[blocks, slots].set(prompt.astype(jnp.int32), mode="drop")
        root = jnp.arange(r) % k == 0
        rows_of = lambda per_request: jnp.repeat(per_request, k)
        used = -(-real // size)                                                  # the prompt's pages
        entry = jnp.arange(n_pages)[None]
        view_pages = jnp.where(root[:, None] & (entry < rows_of(used)[:, None]), rows_of(base)[:, None] + entry, -1)
        view_offsets = jnp.where(view_pages >= 0, entry * size, 0)
        zeros = jnp.zeros((r,), jnp.int32)
        forks = Forks(kv=out.cache, tokens=tokens, fed_at=jnp.zeros_like(tokens), status=jnp.where(root & rows_of(valid), ACTIVE, FREE).astype(jnp.int32),
                      after=zeros, view_pages=view_pages, view_offsets=view_offsets,
                      n_view=jnp.where(root, rows_of(used), 0), fill=jnp.where(root, rows_of(real - (used - 1) * size), 0),
                      pos=jnp.where(root, rows_of(real), 0), pending=jnp.zeros((r, width), jnp.int32), n_pending=zeros,
                      last=rows_of(first), parent=jnp.full((r,), -1, jnp.int32), path=zeros, outlines=zeros,
                      goal_end=zeros, path_end=zeros, children=zeros,
                      next_page=jnp.full((b,), prompt_pages, jnp.int32), segments=jnp.ones((b,), jnp.int32),
                      forks=jnp.zeros((b,), jnp.int32), forks_refused=jnp.zeros((b,), jnp.int32),
                      written=jnp.zeros((b,), jnp.int32), skip=real)
        forks = self._sampled(forks, rows_of(first), forks.status == ACTIVE, policy, lay)
        forks = self._fork_and_merge(forks, policy, b, k)
        canvas = jnp.concatenate([prompt, jnp.full((b, config.gen_length), lay.eos_id, prompt.dtype)], 1)
        state = DecodeState.start(canvas, view.answer & valid[:, None], done=~valid, key=key, cache=forks,
                                  policy_state=jnp.zeros((), jnp.float32), max_trajectory=config.max_trajectory)
        return state.replace(nfe=valid.astype(jnp.int32))  # the prefill chose the first token: one forward

    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        policy: Multiverse = config.policy
        f: Forks = state.cache
        b, lp = state.canvas.shape[0], lay.prompt_len
        k, size = 1 + policy.max_paths, policy.page_size
        width = f.pending.shape[1]
        n_pages = f.tokens.shape[0] // b
        feeding = f.status == ACTIVE
        n = jnp.where(f.n_pending > 0, f.n_pending, 1) * feeding
        # pages for what the rows write: appended to their views before the forward
        need = pages.pages_needed(f.fill, n, size)
        first, next_page = pages.allocate(need.reshape(b, k), f.next_page)
        request = jnp.arange(b * k) // k
        first = first.reshape(-1) + request * n_pages
        view_pages, view_offsets, n_view = pages.append_pages(f.view_pages, f.view_offsets, f.n_view, first, need,
                                                              size, -(-width // size) + 1)

        def forward(c):  # all rows, `c` tokens each (1, or a prefix's width)
            ids = jnp.where(f.n_pending[:, None] > 0, f.pending[:, :c], 0).at[:, 0].set(
                jnp.where(f.n_pending > 0, f.pending[:, 0], f.last))
            write_page, slot, valid = pages.write_targets(view_pages, f.n_view, f.fill, n, c, size)
            shared = SharedView(view_blocks=view_pages, view_offsets=view_offsets, write_block=write_page,
                                write_slot=slot, q_valid=valid)
            positions = f.pos[:, None] + jnp.arange(c, dtype=jnp.int32)[None]
            out = model(ids, positions, shared, f.kv)
            logits = jnp.take_along_axis(out.logits, jnp.maximum(n - 1, 0)[:, None, None], 1)[:, 0]
            blocks, where = shared.write_targets(size)
            pad = lambda x, v: jnp.concatenate([x, jnp.full((x.shape[0], width - c), v, x.dtype)], 1)
            return out.cache, logits.astype(jnp.float32), pad(ids, 0), pad(blocks, 0), pad(where, size)

        if width > 1:
            kv, logits, ids, blocks, where = jax.lax.cond((f.n_pending > 0).any() & feeding.any(),
                                                          lambda _: forward(width), lambda _: forward(1), None)
        else:
            kv, logits, ids, blocks, where = forward(1)
        fed_request = jax.ops.segment_sum(feeding.astype(jnp.int32), request, b) > 0
        nfe = state.nfe + (fed_request & ~state.done).astype(jnp.int32)
        f = f.replace(kv=kv, tokens=f.tokens.at[blocks, where].set(ids, mode="drop"), view_pages=view_pages,
                      fed_at=f.fed_at.at[blocks, where].set(jnp.repeat(nfe, k)[:, None], mode="drop"),
                      view_offsets=view_offsets, n_view=n_view, next_page=next_page,
                      fill=pages.after_write(f.fill, n, size), pos=f.pos + n,
                      n_pending=jnp.where(feeding, 0, f.n_pending),
                      written=f.written + jax.ops.segment_sum(n, request, b))
        # what the rows that fed do now: park, or take their sample
        parked = {THEN_WAIT: WAITING, THEN_FORK: NEED_FORK, THEN_PATH_DONE: PATH_DONE, THEN_FREE: FREE}
        status = f.status
        for after, new in parked.items():
            status = jnp.where(feeding & (f.after == after), new, status)
        key = jax.random.fold_in(state.key, state.step)
        sampled = policy.choose(logits, key, config.temperature, path=f.path, position=f.pos)
        takes = feeding & (f.after == GO_ON)
        f = f.replace(status=status, after=jnp.where(feeding, GO_ON, f.after),
                      last=jnp.where(feeding, sampled, f.last))  # a parked row keeps its next token
        f = self._sampled(f, sampled, takes, policy, lay)
        f = self._fork_and_merge(f, policy, b, k)
        root_status = f.status[::k]
        stuck = ~(f.status == ACTIVE).reshape(b, k).any(1)   # nothing left to run (a capacity dead end)
        spent = f.written + k * width > config.gen_length    # another step could overflow the answer
        done = state.done | (root_status == FINISHED) | (root_status == FREE) | stuck | spent
        def answers(outputs):  # the merged text of the requests that ended now (rare: computed only then)
            canvas, steps = outputs
            text, length = pages.view_text(f.tokens, f.kv.segment_ids, f.view_pages[::k], f.skip, config.gen_length,
                                           lay.eos_id)
            fed, _ = pages.view_text(f.fed_at, f.kv.segment_ids, f.view_pages[::k], f.skip, config.gen_length, 0)
            # a token was chosen by the forward before the one that fed it; EOS and the filler by the last
            decided = jnp.where(jnp.arange(config.gen_length)[None] < length[:, None], fed - 1, nfe[:, None])
            now = (done & ~state.done)[:, None]
            return (jnp.where(now, jnp.concatenate([canvas[:, :lp], text.astype(canvas.dtype)], 1), canvas),
                    jnp.where(now, jnp.concatenate([steps[:, :lp], decided], 1), steps))

        canvas, commit_step = jax.lax.cond((done & ~state.done).any(), answers, lambda x: x,
                                           (state.canvas, state.commit_step))
        # the answer is undecided until its request ends (the merged text is written then)
        return state.replace(canvas=canvas, commit_step=commit_step, undecided=state.undecided & ~done[:, None],
                             nfe=nfe, done=done, cache=f)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _sampled(self, f: Forks, token, takes, policy: Multiverse, lay) -> Forks:
        """Rows `takes` sampled `token`: count outlines, mark a fork at `</Goal>`, a path's end at `</Path>`
        (or EOS: the path is closed with `</Path>`), a request's end at EOS."""
        is_path = f.parent >= 0
        ends = token == lay.eos_id
        close = takes & is_path & ((token == policy.tag("</Path>")) | ends)
        token = jnp.where(close, policy.tag("</Path>"), token)
        finish = takes & ~is_path & ends
        goal = takes & (token == policy.tag("</Goal>"))
        outlines = jnp.where(takes & (token == policy.tag("<Goal>")), 0, f.outlines)
        outlines = outlines + (takes & (token == policy.tag("<Outline>"))).astype(jnp.int32)
        after = jnp.where(close, THEN_PATH_DONE, jnp.where(goal, THEN_FORK, f.after))
        return f.replace(last=jnp.where(takes, token, f.last), outlines=outlines, after=after,
                         status=jnp.where(finish, FINISHED, f.status),
                         goal_end=jnp.where(goal, f.pos, f.goal_end), path_end=jnp.where(close, f.pos, f.path_end))

    def _fork_and_merge(self, f: Forks, policy: Multiverse, b: int, k: int) -> Forks:
        """At most one fork and one merge per request, each request's rows apart (vmapped over requests);
        skipped (a `cond`) in the steps where no row is ready to fork and none waits."""
        forking = (f.status == NEED_FORK) | ((f.status == ACTIVE) & (f.after == THEN_FORK)) | (f.status == WAITING)
        return jax.lax.cond(forking.any(), lambda f: self._fork_and_merge_now(f, policy, b, k), lambda f: f, f)

    def _fork_and_merge_now(self, f: Forks, policy: Multiverse, b: int, k: int) -> Forks:
        ids, lengths = _prefix_table(policy, f.pending.shape[1])
        n_pages = f.tokens.shape[0] // b
        row_fields = ("status", "after", "view_pages", "view_offsets", "n_view", "fill", "pos", "pending",
                      "n_pending", "last", "parent", "path", "outlines", "goal_end", "path_end", "children")
        rows = {name: getattr(f, name).reshape(b, k, *getattr(f, name).shape[1:]) for name in row_fields}
        per_request = (f.next_page, f.segments, f.forks, f.forks_refused, jnp.arange(b, dtype=jnp.int32) * n_pages)

        def one(rows, next_page, segments, forks, refused, base):
            counters = (next_page, segments)
            rows, counters, forks, refused = _fork(rows, counters, forks, refused, base, ids, lengths, policy, n_pages)
            rows, counters = _merge(rows, counters, base, ids[-1], lengths[-1], policy, n_pages)
            return rows, counters, forks, refused

        rows, (next_page, segments), forks, refused = jax.vmap(one)(rows, *per_request)
        flat = {name: x.reshape(b * k, *x.shape[2:]) for name, x in rows.items()}
        return f.replace(**flat, next_page=next_page, segments=segments, forks=forks, forks_refused=refused)


def _fork(rows, counters, forks, refused, base, ids, lengths, policy: Multiverse, n_pages: int):
    """One request: the first row that is ready to fork forks, waits, or goes on sequentially."""
    next_page, segments = counters
    status, after = rows["status"], rows["after"]
    k, v = status.shape[0], rows["view_pages"].shape[1]
    ready = (status == NEED_FORK) | ((status == ACTIVE) & (after == THEN_FORK))
    r = jnp.argmax(ready)
    any_ready = ready.any()
    n = rows["outlines"][r]
    free = status == FREE
    possible = ((n >= 1) & (n <= policy.max_paths) & (segments + n <= policy.blocks)
                & (next_page + n + 1 <= n_pages) & (rows["n_view"][r] + 2 <= v))
    running = ((status == ACTIVE) & (after != THEN_FORK)).any()  # rows that will end and free themselves
    enough = free.sum() >= n
    do_fork = any_ready & possible & enough
    give_up = any_ready & (~possible | (~enough & ~running))
    is_r = jnp.arange(k) == r
    parent_fed = status[r] == NEED_FORK  # it fed </Goal> already
    # a parent still to feed </Goal> into a full page gets its next page now: the paths must see that page
    grow = do_fork & ~parent_fed & (rows["fill"][r] == policy.page_size)
    parent_view = jnp.where((jnp.arange(v) == rows["n_view"][r]) & grow, base + next_page, rows["view_pages"][r])
    last_offset = rows["view_offsets"][r][jnp.maximum(rows["n_view"][r] - 1, 0)]
    parent_offsets = jnp.where((jnp.arange(v) == rows["n_view"][r]) & grow, last_offset + policy.page_size,
                               rows["view_offsets"][r])
    parent_entries = rows["n_view"][r] + grow.astype(jnp.int32)
    next_page = next_page + grow.astype(jnp.int32)
    # the fork: children are the first n free rows, path k the k-th, each with a page of its own
    rank = jnp.cumsum(free) - 1
    child = do_fork & free & (rank < n)
    path = rank + 1
    new_page = base + next_page + rank
    entry = parent_entries
    offset = rows["goal_end"][r] + 1
    at = child[:, None] & (jnp.arange(v)[None] == entry)
    vb = jnp.where(child[:, None] | (is_r & grow)[:, None], parent_view[None], rows["view_pages"])
    vb = jnp.where(at, new_page[:, None], vb)
    vo = jnp.where(child[:, None] | (is_r & grow)[:, None], parent_offsets[None], rows["view_offsets"])
    vo = jnp.where(at, offset, vo)
    feed = jnp.clip(path - 1, 0, ids.shape[0] - 2)
    new_status = jnp.where(child, ACTIVE, status)
    new_status = jnp.where(do_fork & is_r & parent_fed, WAITING, new_status)
    new_status = jnp.where(give_up & is_r & parent_fed, ACTIVE, new_status)
    new_after = jnp.where(do_fork & is_r & ~parent_fed, THEN_WAIT, after)
    new_after = jnp.where(give_up & is_r & ~parent_fed, GO_ON, new_after)
    new_after = jnp.where(child, GO_ON, new_after)
    rows = dict(rows, status=new_status, after=new_after, view_pages=vb, view_offsets=vo,
                n_view=jnp.where(child, entry + 1, jnp.where(is_r, parent_entries, rows["n_view"])),
                fill=jnp.where(child | (is_r & grow), 0, rows["fill"]),
                pos=jnp.where(child, offset, rows["pos"]),
                pending=jnp.where(child[:, None], ids[feed], rows["pending"]),
                n_pending=jnp.where(child, lengths[feed], rows["n_pending"]),
                parent=jnp.where(child, r, rows["parent"]), path=jnp.where(child, path, rows["path"]),
                outlines=jnp.where(child, 0, rows["outlines"]),
                children=jnp.where(do_fork & is_r, n, rows["children"]))
    grow = jnp.where(do_fork, n, 0)
    return (rows, (next_page + grow, segments + grow), forks + do_fork.astype(jnp.int32),
            refused + give_up.astype(jnp.int32))


def _merge(rows, counters, base, conclusion_ids, conclusion_len, policy: Multiverse, n_pages: int):
    """One request: the first waiting row whose paths have all ended takes their pages and a new one."""
    next_page, segments = counters
    status, after, parent = rows["status"], rows["after"], rows["parent"]
    k, v = status.shape[0], rows["view_pages"].shape[1]
    ended = (status == PATH_DONE) | ((status == ACTIVE) & (after == THEN_PATH_DONE))
    mine = parent[None, :] == jnp.arange(k)[:, None]                         # [parent, child]
    n_ended = (mine & ended[None]).sum(1)
    ready = (status == WAITING) & (rows["children"] > 0) & (n_ended == rows["children"])
    p = jnp.argmax(ready)
    own = rows["n_view"][p]
    kids = mine[p] & ended                                                    # the paths (path order by `path`)
    # a path still to feed </Path> into a full page gets its next page now: the merged view must hold it
    grow = kids & (status == ACTIVE) & (rows["fill"] == policy.page_size)
    n_grow = grow.sum()
    n_view = rows["n_view"] + grow.astype(jnp.int32)
    extra = jnp.where(kids, n_view - own, 0)                                  # entries each path adds
    before = (jnp.where(kids[None, :] & (rows["path"][None, :] < rows["path"][:, None]), extra[None, :], 0)).sum(1)
    total = extra.sum()
    do = (ready.any() & (own + total + 1 <= v) & (next_page + n_grow < n_pages) & (segments < policy.blocks))
    grow = grow & do
    last = jnp.take_along_axis(rows["view_offsets"], jnp.maximum(rows["n_view"] - 1, 0)[:, None], 1)[:, 0]
    at = grow[:, None] & (jnp.arange(v)[None] == rows["n_view"][:, None])
    rows = dict(rows, view_pages=jnp.where(at, (base + next_page + jnp.cumsum(grow) - 1)[:, None], rows["view_pages"]),
                view_offsets=jnp.where(at, (last + policy.page_size)[:, None], rows["view_offsets"]),
                n_view=jnp.where(grow, n_view, rows["n_view"]), fill=jnp.where(grow, 0, rows["fill"]))
    next_page = next_page + grow.sum()
    # the merged view: own entries, each path's entries past `own` in path order, then the conclusion's page
    target = own + before[:, None] + jnp.arange(v)[None] - own                # [child, entry] -> merged entry
    take = kids[:, None] & (jnp.arange(v)[None] >= own) & (jnp.arange(v)[None] < n_view[:, None])
    onehot = (jnp.where(take, target, v)[:, :, None] == jnp.arange(v)[None, None]).astype(jnp.int32)
    merged_pages = jnp.einsum("ce,cem->m", rows["view_pages"], onehot)
    merged_offsets = jnp.einsum("ce,cem->m", rows["view_offsets"], onehot)
    has = onehot.any((0, 1))
    conclusion_at = jnp.max(jnp.where(kids, rows["path_end"], -1)) + 1
    last_entry = jnp.arange(v) == own + total
    vb_p = jnp.where(last_entry, base + next_page, jnp.where(has, merged_pages, rows["view_pages"][p]))
    vo_p = jnp.where(last_entry, conclusion_at, jnp.where(has, merged_offsets, rows["view_offsets"][p]))
    is_p = do & (jnp.arange(k) == p)
    freed = do & kids
    rows = dict(rows,
                status=jnp.where(is_p, ACTIVE, jnp.where(freed & (status == PATH_DONE), FREE, status)),
                after=jnp.where(freed & (status == ACTIVE), THEN_FREE, jnp.where(is_p, GO_ON, after)),
                view_pages=jnp.where(is_p[:, None], vb_p[None], rows["view_pages"]),
                view_offsets=jnp.where(is_p[:, None], vo_p[None], rows["view_offsets"]),
                n_view=jnp.where(is_p, own + total + 1, rows["n_view"]), fill=jnp.where(is_p, 0, rows["fill"]),
                pos=jnp.where(is_p, conclusion_at, rows["pos"]),
                pending=jnp.where(is_p[:, None], conclusion_ids[None], rows["pending"]),
                n_pending=jnp.where(is_p, conclusion_len, rows["n_pending"]),
                children=jnp.where(is_p, 0, rows["children"]),
                parent=jnp.where(freed, jnp.where(status == PATH_DONE, -1, parent), parent))
    step = do.astype(jnp.int32)
    return rows, (next_page + step, segments + step)
