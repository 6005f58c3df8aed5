"""The Multiverse canvas: a causal model that forks into parallel paths and merges them, in the one loop
(Multiverse, Yang et al. 2025; the engine's scheduler, `assd-hogwild-multiverse.md` §3d).

Each request owns `K = 1 + max_paths` rows and `max_blocks` shared cache blocks
(`jaxdllm.attention.shared_view`); row 0 is the request itself. A row reads a view, a list of
(block, offset), and writes its tokens into the view's last block. Per step every active row feeds its
pending tokens (one sampled token, or a fork's / merge's prefix in one wider forward), all rows of all
requests in one batch, and samples its next token. K/V are written before any row attends (per layer),
so a row sees what another wrote in the same forward.

* **Fork.** A row that samples `</Goal>` after `n` `<Outline>`s forks: `n` free rows of the request
  join the loop, path k's view = the parent's view + a new block at offset `goal_end + 1` (every path
  starts at the same position, as training places them), fed `<Path>k:` (the policy's prefix) in the
  same forward in which the parent feeds `</Goal>` (the children see it: no extra forward). The
  parent's prefix is never copied: it is one block in every child's view. The parent then waits.
* **Path end.** A path row samples `</Path>`, feeds it, and is done (its row is free again; its blocks
  stay). A path that samples EOS or fills its block is closed with `</Path>`.
* **Merge.** When every path of a parent has its `</Path>`, the parent's view becomes its own view +
  each path's blocks in path order (nested paths included) + a new block at `max(pos </Path>) + 1`,
  the position training gives `<Conclusion>` (goal_end + max path length + 1), and it is fed the
  conclusion prefix in the same forward as the last `</Path>`. Nothing is copied or recomputed.
* **Positions.** Training puts `<Path>` at goal_end + 1 and `<Conclusion>` right after the longest
  path (`multiverse_layout`); so does this canvas. The published engine feeds "\\n<Path>\\n{k}:" and
  "<Conclusion>\\n" with the newline at goal_end + 1, one position after training's; this canvas places
  whatever the policy's prefix is at the training positions (the engine's shift is fixed, not copied).

Capacity: a fork that needs more rows than are free waits for rows; one that can never get them (more
outlines than `max_paths`, no block or view entry left, or no other row running) is not made and the
row goes on sequentially (`forks_refused`). One fork and one merge per request per step.

Sequential forwards (`nfe`) count the steps in which some row of the request fed tokens: the longest
chain of forwards. The answer (`state.canvas`) is the merged text in order: the request's view's
blocks after the prompt, cut at `gen_length`. Each block holds `Lp + gen_length` slots.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.attention.shared_view import SharedView
from jaxdllm.decoding.canvas import Canvas, Footprint
from jaxdllm.decoding.policies.multiverse import TAGS, Multiverse
from jaxdllm.decoding.state import DecodeState
from jaxdllm.errors import ConfigError

FREE, ACTIVE, WAITING, NEED_FORK, PATH_DONE, FINISHED = range(6)
# what a row does after feeding this step's tokens
GO_ON, THEN_WAIT, THEN_FORK, THEN_PATH_DONE, THEN_FREE = range(5)


@struct.dataclass
class Forks:
    """The canvas's carry beside `DecodeState` (rows R = B * K; blocks NB = B * max_blocks; V view entries).

    kv: the shared blocks' `KVCache` (`[NB, S]` slots). tokens, fed_at: `[NB, S]` each slot's token and the
    request's forward count when it was fed. status, after: `[R]` the row's state and what it does after
    its next feed. view_blocks, view_offsets: `[R, V]`; n_view: `[R]`. fill: `[R]` slots used in the row's
    write block (its last view entry); pos: `[R]` position of its next fed token. pending, n_pending:
    `[R, C]`, `[R]` a prefix to feed; last: `[R]` its sampled token. parent, path: `[R]` the forking row
    (-1: none) and the path number. outlines, goal_end, path_end: `[R]`. children: `[R]` paths a waiting
    row forked. next_block, forks, forks_refused, tokens_written: `[B]`.
    """

    kv: object
    tokens: jax.Array
    fed_at: jax.Array
    status: jax.Array
    after: jax.Array
    view_blocks: jax.Array
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
    next_block: jax.Array
    forks: jax.Array
    forks_refused: jax.Array
    tokens_written: jax.Array


def _prefix_width(policy: Multiverse) -> int:
    feeds = [policy.path_feed(k) for k in range(1, policy.max_paths + 1)] + [tuple(policy.conclusion_prefix)]
    return max(len(f) for f in feeds)


def _prefix_table(policy: Multiverse, width: int):
    """`(ids [P + 1, C], lengths [P + 1])`: row k - 1 is path k's prefix, row P the conclusion's."""
    feeds = [policy.path_feed(k) for k in range(1, policy.max_paths + 1)] + [tuple(policy.conclusion_prefix)]
    ids = jnp.asarray([list(f) + [0] * (width - len(f)) for f in feeds], jnp.int32)
    return ids, jnp.asarray([len(f) for f in feeds], jnp.int32)


class MultiverseCanvas(Canvas):
    """Fork at `</Goal>`, paths in parallel rows over shared blocks, merge without copying (causal models)."""

    name = "multiverse_canvas"
    policy_base = Multiverse
    diffusion_blocks = False

    def check_config(self, config) -> None:
        if config.cache.keeps_kv:
            raise ConfigError("policy='multiverse' keeps its own shared cache blocks: leave cache='none'")
        if config.stop_at_eos == "block":
            raise ConfigError("stop_at_eos='block' finishes a diffusion block; Multiverse decodes token by token")

    def check_model(self, model_config, config) -> None:
        from jaxdllm.models.transformer import _MODELS, Transformer  # a family's own model has no SharedView path
        if (model_config.attention != "causal" or model_config.shift_logits
                or _MODELS.get(type(model_config), Transformer) is not Transformer):
            raise ConfigError("policy='multiverse' decodes causal models of the shared Transformer (Qwen2/Llama "
                              f"families); this model has attention={model_config.attention!r}")
        policy = config.policy
        if policy.tag_base is not None and policy.tag_base + len(TAGS) > model_config.vocab_size:
            raise ConfigError(f"tag_base {policy.tag_base} + 12 tags is past the vocabulary ({model_config.vocab_size})")

    def max_steps(self, config, lay=None) -> int:
        slots = (0 if lay is None else lay.prompt_len) + config.gen_length
        return config.policy.blocks * (slots + 2)  # every step feeds a token of some row of every running request

    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """Per request: `max_blocks` blocks of `Lp + G` slots, `1 + max_paths` rows of the widest prefix."""
        policy = config.policy
        slots = prompt_len + config.gen_length
        rows = 1 + policy.max_paths
        return Footprint(canvas=slots, kv_slots=policy.blocks * slots, widest=max(prompt_len, rows * _prefix_width(policy)),
                         attended=policy.blocks * slots, logits=rows)

    def comparison_presets(self, preset: str, gen_length: int, defaults: dict) -> dict:
        """The model's own next-token decoding of the Multiverse text (Jacobi with a window of 1) and the
        fork-and-merge decoding."""
        return {"sequential": ("jacobi", dict(gen_length=gen_length, window=1)),
                "multiverse": (preset, dict(gen_length=gen_length))}

    # -- the loop ------------------------------------------------------------------------------
    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None) -> DecodeState:
        """Row 0 of each request prefilled with its prompt (block 0 of the request), its first token sampled."""
        policy: Multiverse = config.policy
        b, lp = prompt.shape
        k, nb = 1 + policy.max_paths, policy.blocks
        r, blocks, slots, v = b * k, b * nb, lp + config.gen_length, policy.blocks
        width = _prefix_width(policy)
        kv = model.init_cache(blocks, slots)
        seg = view.seg[:, :lp]
        pad = lp - seg.sum(1)                                                    # left padding per request
        root_block = jnp.arange(b, dtype=jnp.int32) * nb
        prefill = SharedView(view_blocks=root_block[:, None], view_offsets=-pad[:, None].astype(jnp.int32),
                             write_block=root_block, write_slot=jnp.zeros((b,), jnp.int32), q_valid=seg > 0)
        out = model(prompt.astype(jnp.int32), view.positions[:, :lp], prefill, kv, logits_slice=(lp - 1, 1))
        first = policy.choose(out.logits[:, 0], jax.random.fold_in(key, 2**31 - 1), config.temperature,
                              path=jnp.zeros((b,), jnp.int32), position=(lp - pad).astype(jnp.int32))
        tokens = jnp.zeros((blocks, slots), jnp.int32).at[root_block, :lp].set(prompt.astype(jnp.int32))
        root = jnp.arange(r) % k == 0
        rows_of = lambda per_request: jnp.repeat(per_request, k)
        view_blocks = jnp.full((r, v), -1, jnp.int32).at[:, 0].set(jnp.where(root, rows_of(root_block), -1))
        view_offsets = jnp.zeros((r, v), jnp.int32).at[:, 0].set(jnp.where(root, -rows_of(pad), 0))
        zeros = jnp.zeros((r,), jnp.int32)
        forks = Forks(kv=out.cache, tokens=tokens, fed_at=jnp.zeros((blocks, slots), jnp.int32),
                      status=jnp.where(root & rows_of(valid), ACTIVE, FREE).astype(jnp.int32), after=zeros,
                      view_blocks=view_blocks, view_offsets=view_offsets, n_view=root.astype(jnp.int32),
                      fill=jnp.where(root, lp, 0), pos=jnp.where(root, rows_of(lp - pad), 0),
                      pending=jnp.zeros((r, width), jnp.int32), n_pending=zeros, last=rows_of(first),
                      parent=jnp.full((r,), -1, jnp.int32), path=zeros, outlines=zeros, goal_end=zeros,
                      path_end=zeros, children=zeros, next_block=jnp.ones((b,), jnp.int32),
                      forks=jnp.zeros((b,), jnp.int32), forks_refused=jnp.zeros((b,), jnp.int32),
                      tokens_written=jnp.zeros((b,), jnp.int32))
        forks = self._sampled(forks, rows_of(first), forks.status == ACTIVE, policy, lay, slots)
        forks = self._fork_and_merge(forks, policy, b, k)
        canvas = jnp.concatenate([prompt, jnp.full((b, config.gen_length), lay.eos_id, prompt.dtype)], 1)
        state = DecodeState.start(canvas, jnp.zeros_like(canvas, bool), done=~valid, key=key, cache=forks,
                                  policy_state=jnp.zeros((), jnp.float32), max_trajectory=config.max_trajectory)
        return state

    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        policy: Multiverse = config.policy
        f: Forks = state.cache
        b, lp = state.canvas.shape[0], lay.prompt_len
        k = 1 + policy.max_paths
        slots = f.tokens.shape[1]
        feeding = f.status == ACTIVE
        width = f.pending.shape[1]

        def forward(c):  # all rows, `c` tokens each (1, or a prefix's width)
            n = jnp.where(f.n_pending > 0, f.n_pending, 1) * feeding
            ids = jnp.where(f.n_pending[:, None] > 0, f.pending[:, :c], 0).at[:, 0].set(
                jnp.where(f.n_pending > 0, f.pending[:, 0], f.last))
            valid = jnp.arange(c)[None] < n[:, None]
            entries = jnp.arange(f.view_blocks.shape[1])[None] < f.n_view[:, None]
            write_block = jnp.take_along_axis(f.view_blocks, jnp.maximum(f.n_view - 1, 0)[:, None], 1)[:, 0]
            shared = SharedView(view_blocks=jnp.where(entries, f.view_blocks, -1), view_offsets=f.view_offsets,
                                write_block=write_block, write_slot=f.fill, q_valid=valid)
            positions = f.pos[:, None] + jnp.arange(c, dtype=jnp.int32)[None]
            out = model(ids, positions, shared, f.kv)
            logits = jnp.take_along_axis(out.logits, jnp.maximum(n - 1, 0)[:, None, None], 1)[:, 0]
            blocks, where = shared.write_targets(slots)
            return out.cache, logits.astype(jnp.float32), ids, blocks, where, n

        def wide(_):
            kv, logits, ids, blocks, where, n = forward(width)
            return kv, logits, blocks[:, :1], where[:, :1], ids[:, :1], n, ids, blocks, where

        def narrow(_):
            kv, logits, ids, blocks, where, n = forward(1)
            pad = lambda x, v: jnp.concatenate([x, jnp.full((x.shape[0], width - 1), v, x.dtype)], 1)
            return kv, logits, blocks, where, ids, n, pad(ids, 0), pad(blocks, 0), pad(where, slots)

        if width > 1:
            kv, logits, _, _, _, n, ids, blocks, where = jax.lax.cond((f.n_pending > 0).any() & feeding.any(),
                                                                     wide, narrow, None)
        else:
            kv, logits, _, _, _, n, ids, blocks, where = narrow(None)
        request = jnp.arange(f.status.shape[0]) // k
        fed_request = jax.ops.segment_sum(feeding.astype(jnp.int32), request, b) > 0
        nfe = state.nfe + (fed_request & ~state.done).astype(jnp.int32)
        f = f.replace(kv=kv, tokens=f.tokens.at[blocks, where].set(ids, mode="drop"),
                      fed_at=f.fed_at.at[blocks, where].set(jnp.repeat(nfe, k)[:, None], mode="drop"),
                      fill=f.fill + n, pos=f.pos + n, n_pending=jnp.where(feeding, 0, f.n_pending),
                      tokens_written=f.tokens_written + jax.ops.segment_sum(n, request, b))
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
        f = self._sampled(f, sampled, takes, policy, lay, slots)
        f = self._fork_and_merge(f, policy, b, k)
        root_status = f.status[::k]
        stuck = ~(f.status == ACTIVE).reshape(b, k).any(1)  # nothing left to run (a capacity dead end)
        done = state.done | (root_status == FINISHED) | (root_status == FREE) | stuck
        canvas = jnp.where((done & ~state.done)[:, None], self._answer(f, state.canvas, lp, k, policy), state.canvas)
        return state.replace(canvas=canvas, nfe=nfe, done=done, cache=f)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _sampled(self, f: Forks, token, takes, policy: Multiverse, lay, slots: int) -> Forks:
        """Rows `takes` sampled `token`: count outlines, mark a fork at `</Goal>`, a path's end at `</Path>`
        (or EOS / a full block: the path is closed with `</Path>`), a request's end at EOS."""
        is_path = f.parent >= 0
        full = f.fill + f.n_pending >= slots - 1
        ends = (token == lay.eos_id) | full
        close = takes & is_path & ((token == policy.tag("</Path>")) | ends)
        token = jnp.where(close, policy.tag("</Path>"), token)
        finish = takes & ~is_path & ends
        goal = takes & (token == policy.tag("</Goal>")) & ~full
        outlines = jnp.where(takes & (token == policy.tag("<Goal>")), 0, f.outlines)
        outlines = outlines + (takes & (token == policy.tag("<Outline>"))).astype(jnp.int32)
        after = jnp.where(close, THEN_PATH_DONE, jnp.where(goal, THEN_FORK, f.after))
        return f.replace(last=jnp.where(takes, token, f.last), outlines=outlines, after=after,
                         status=jnp.where(finish, FINISHED, f.status),
                         goal_end=jnp.where(goal, f.pos, f.goal_end), path_end=jnp.where(close, f.pos, f.path_end))

    def _fork_and_merge(self, f: Forks, policy: Multiverse, b: int, k: int) -> Forks:
        """At most one fork and one merge per request, each request's rows apart (vmapped over requests)."""
        ids, lengths = _prefix_table(policy, f.pending.shape[1])
        nb = policy.blocks
        row_fields = ("status", "after", "view_blocks", "view_offsets", "n_view", "fill", "pos", "pending",
                      "n_pending", "last", "parent", "path", "outlines", "goal_end", "path_end", "children")
        rows = {name: getattr(f, name).reshape(b, k, *getattr(f, name).shape[1:]) for name in row_fields}
        per_request = (f.next_block, f.forks, f.forks_refused, jnp.arange(b, dtype=jnp.int32) * nb)

        def one(rows, next_block, forks, refused, base):
            rows, next_block, forks, refused = _fork(rows, next_block, forks, refused, base, ids, lengths, policy)
            rows, next_block = _merge(rows, next_block, base, ids[-1], lengths[-1], policy)
            return rows, next_block, forks, refused

        rows, next_block, forks, refused = jax.vmap(one)(rows, *per_request)
        flat = {name: x.reshape(b * k, *x.shape[2:]) for name, x in rows.items()}
        return f.replace(**flat, next_block=next_block, forks=forks, forks_refused=refused)

    def _answer(self, f: Forks, canvas, lp: int, k: int, policy: Multiverse) -> jax.Array:
        """`[B, Lp + G]` each request's prompt then its merged text (its view's blocks in order after the
        prompt), EOS after it."""
        g = canvas.shape[1] - lp
        blocks, n_view = f.view_blocks[::k], f.n_view[::k]                          # the requests' own rows
        lengths = jnp.where(jnp.arange(blocks.shape[1])[None] < n_view[:, None], _block_fill(f)[jnp.maximum(blocks, 0)], 0)
        lengths = lengths.at[:, 0].add(-lp)                                         # the prompt's slots
        ends = jnp.cumsum(lengths, 1)
        col = jnp.arange(g)[None, :, None]
        entry = (col >= ends[:, None, :]).sum(-1)                                   # [B, G]
        entry_c = jnp.minimum(entry, blocks.shape[1] - 1)
        start = jnp.take_along_axis(ends - lengths, entry_c, 1)
        slot = jnp.arange(g)[None] - start + jnp.where(entry_c == 0, lp, 0)
        block = jnp.take_along_axis(blocks, entry_c, 1)
        inside = jnp.arange(g)[None] < ends[:, -1:]
        text = f.tokens[jnp.maximum(block, 0), jnp.clip(slot, 0, f.tokens.shape[1] - 1)]
        answer = jnp.where(inside, text, canvas[:, lp:])
        return jnp.concatenate([canvas[:, :lp], answer.astype(canvas.dtype)], 1)


def _block_fill(f: Forks) -> jax.Array:
    """`[NB]` slots written in each block (its last written slot + 1)."""
    written = f.kv.segment_ids > 0
    s = written.shape[1]
    return jnp.where(written.any(1), s - jnp.argmax(written[:, ::-1], axis=1), 0)


def _fork(rows, next_block, forks, refused, base, ids, lengths, policy: Multiverse):
    """One request: the first row that is ready to fork forks, waits, or goes on sequentially."""
    status, after = rows["status"], rows["after"]
    k, v = status.shape[0], rows["view_blocks"].shape[1]
    ready = (status == NEED_FORK) | ((status == ACTIVE) & (after == THEN_FORK))
    r = jnp.argmax(ready)
    any_ready = ready.any()
    n = rows["outlines"][r]
    free = status == FREE
    possible = ((n >= 1) & (n <= policy.max_paths) & (next_block + n <= policy.blocks)
                & (rows["n_view"][r] + 1 <= v))
    running = ((status == ACTIVE) & (after != THEN_FORK)).any()  # rows that will end and free themselves
    enough = free.sum() >= n
    do_fork = any_ready & possible & enough
    give_up = any_ready & (~possible | (~enough & ~running))
    # the fork: children are the first n free rows, path k the k-th
    rank = jnp.cumsum(free) - 1
    child = do_fork & free & (rank < n)
    path = rank + 1
    new_block = base + next_block + rank
    entry = rows["n_view"][r]
    offset = rows["goal_end"][r] + 1
    vb = jnp.where(child[:, None], rows["view_blocks"][r][None], rows["view_blocks"])
    vb = jnp.where(child[:, None] & (jnp.arange(v)[None] == entry), new_block[:, None], vb)
    vo = jnp.where(child[:, None], rows["view_offsets"][r][None], rows["view_offsets"])
    vo = jnp.where(child[:, None] & (jnp.arange(v)[None] == entry), offset, vo)
    feed = ids[jnp.clip(path - 1, 0, ids.shape[0] - 2)]
    is_r = jnp.arange(k) == r
    parent_fed = status[r] == NEED_FORK  # it fed </Goal> already
    new_status = jnp.where(child, ACTIVE, status)
    new_status = jnp.where(do_fork & is_r & parent_fed, WAITING, new_status)
    new_status = jnp.where(give_up & is_r & parent_fed, ACTIVE, new_status)
    new_after = jnp.where(do_fork & is_r & ~parent_fed, THEN_WAIT, after)
    new_after = jnp.where(give_up & is_r & ~parent_fed, 0, new_after)
    new_after = jnp.where(child, 0, new_after)
    rows = dict(rows, status=new_status, after=new_after, view_blocks=vb, view_offsets=vo,
                n_view=jnp.where(child, entry + 1, rows["n_view"]), fill=jnp.where(child, 0, rows["fill"]),
                pos=jnp.where(child, offset, rows["pos"]),
                pending=jnp.where(child[:, None], feed, rows["pending"]),
                n_pending=jnp.where(child, lengths[jnp.clip(path - 1, 0, ids.shape[0] - 2)], rows["n_pending"]),
                parent=jnp.where(child, r, rows["parent"]), path=jnp.where(child, path, rows["path"]),
                outlines=jnp.where(child, 0, rows["outlines"]),
                children=jnp.where(do_fork & is_r, n, rows["children"]))
    return (rows, next_block + jnp.where(do_fork, n, 0), forks + do_fork.astype(jnp.int32),
            refused + give_up.astype(jnp.int32))


def _merge(rows, next_block, base, conclusion_ids, conclusion_len, policy: Multiverse):
    """One request: the first waiting row whose paths have all ended takes their blocks and a new one."""
    status, after, parent = rows["status"], rows["after"], rows["parent"]
    k, v = status.shape[0], rows["view_blocks"].shape[1]
    ended = (status == PATH_DONE) | ((status == ACTIVE) & (after == THEN_PATH_DONE))
    mine = parent[None, :] == jnp.arange(k)[:, None]                         # [parent, child]
    n_ended = (mine & ended[None]).sum(1)
    ready = (status == WAITING) & (rows["children"] > 0) & (n_ended == rows["children"])
    p = jnp.argmax(ready)
    own = rows["n_view"][p]
    kids = mine[p] & ended                                                    # the paths (path order by `path`)
    extra = jnp.where(kids, rows["n_view"] - own, 0)                          # entries each path adds
    before = (jnp.where(kids[None, :] & (rows["path"][None, :] < rows["path"][:, None]), extra[None, :], 0)).sum(1)
    total = extra.sum()
    do = ready.any() & (own + total + 1 <= v) & (next_block < policy.blocks)
    # the merged view: own entries, each path's entries past `own` in path order, then the conclusion's block
    target = own + before[:, None] + jnp.arange(v)[None] - own                # [child, entry] -> merged entry
    take = kids[:, None] & (jnp.arange(v)[None] >= own) & (jnp.arange(v)[None] < rows["n_view"][:, None])
    slot_of = jnp.where(take, target, v)                                      # v: not taken
    onehot = slot_of[:, :, None] == jnp.arange(v)[None, None]                 # [child, entry, merged entry]
    merged_blocks = jnp.einsum("ce,cem->m", rows["view_blocks"], onehot.astype(jnp.int32))
    merged_offsets = jnp.einsum("ce,cem->m", rows["view_offsets"], onehot.astype(jnp.int32))
    has = onehot.any((0, 1))
    conclusion_at = jnp.max(jnp.where(kids, rows["path_end"], -1)) + 1
    last_entry = jnp.arange(v) == own + total
    vb_p = jnp.where(has, merged_blocks, rows["view_blocks"][p])
    vb_p = jnp.where(last_entry, base + next_block, vb_p)
    vo_p = jnp.where(has, merged_offsets, rows["view_offsets"][p])
    vo_p = jnp.where(last_entry, conclusion_at, vo_p)
    is_p = do & (jnp.arange(k) == p)
    freed = do & kids
    rows = dict(rows,
                status=jnp.where(is_p, ACTIVE, jnp.where(freed & (status == PATH_DONE), FREE, status)),
                after=jnp.where(freed & (status == ACTIVE), THEN_FREE, jnp.where(is_p, 0, after)),
                view_blocks=jnp.where(is_p[:, None], vb_p[None], rows["view_blocks"]),
                view_offsets=jnp.where(is_p[:, None], vo_p[None], rows["view_offsets"]),
                n_view=jnp.where(is_p, own + total + 1, rows["n_view"]), fill=jnp.where(is_p, 0, rows["fill"]),
                pos=jnp.where(is_p, conclusion_at, rows["pos"]),
                pending=jnp.where(is_p[:, None], conclusion_ids[None], rows["pending"]),
                n_pending=jnp.where(is_p, conclusion_len, rows["n_pending"]),
                children=jnp.where(is_p, 0, rows["children"]),
                parent=jnp.where(freed, jnp.where(status == PATH_DONE, -1, parent), parent))
    return rows, next_block + do.astype(jnp.int32)
