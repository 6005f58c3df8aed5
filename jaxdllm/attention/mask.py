"""Structured attention masks: a small description instead of an `[Lq, Lk]` matrix.

Indices are *physical* positions in the key/value sequence: query row `i` sits at physical
index `q_offset + i` (queries offset into a cached prefix), key column `j` at index `j`.
RoPE positions are separate (the model takes explicit `positions`), so left padding or the
block-diffusion `[x_t; x_0]` layout never changes the mask rules.

Kinds (block diffusion is BD3-LM's training layout, Arriola et al. 2025; Jacobi Forcing is Hu et al.
2025's noisy/clean packing):
  * `bidirectional`: every key is visible.
  * `causal`: key j is visible to query i iff j <= i.
  * `block_causal`: iff j // block_size <= i // block_size.
  * `block_diffusion`: BD3-LM training on `[x_t ; x_0]` with `n = Lk // 2`, block of index
    p is `(p mod n) // block_size`; visible iff (same half and same block) or (q in x_t,
    k in x_0, block(q) > block(k)) or (both in x_0, block(q) >= block(k)).
  * `set_block`: Set Block Decoding training (Gat et al. 2025) on `[x_hat ; x]` with `n = Lk // 2`
    (a masked copy, then the clean sequence); the block of index p is `((p mod n) - prefix_len) //
    block_size` (`prefix_len` 0, or per row: blocks counted from each row's answer, negative before
    it); visible iff (both in x_hat and same block) or (q in x_hat, k in x, block(q) > block(k)) or
    (both in x, k <= q): the clean half is plainly causal (next-token prediction), a masked block
    sees the clean tokens of earlier blocks and its own block both ways.
  * `wedlm`: WeDLM training (Tencent WeDLM, arXiv 2512.22737, `finetune/src/masking.py`) on `[x0 ; xt]` with
    `n = Lk // 2` (the clean sequence, then its masked and reordered copy, both at the rows' logical
    positions through the positions array); the block of index p is `(p mod n) // block_size`, counted
    from each stream's start as the published `blk = idx // B`; visible iff (both in x0, k <= q) or
    (q in xt, k in x0, block(k) < block(q)) or (both in xt, same block, k <= q): the clean stream is
    causal (next-token prediction), an xt block sees the clean tokens of the blocks before it (never its
    own block's) and, causally in its physical (reordered: observed tokens first) order, its own block.
  * `jacobi_forcing`: `prompt ++ [noisy_0 | clean_0 | noisy_1 | clean_1 | ...]`, blocks of
    `block_size`, prompt length `prefix_len`; the prompt is causal; a block token sees the
    whole prompt, earlier blocks of its own stream and, inside its block, itself and earlier
    tokens; nothing crosses between the noisy and the clean stream.
  * `lookahead`: one draft-and-verify forward (Lookahead decoding, Fu et al. 2024). Keys before
    `prefix_len` (the decided text) are causal; from `prefix_len` on, `window_shape = (levels,
    width, branch_len)` lays out `[current | lookahead window: levels x width | branches of
    branch_len]`. Every window token sees the prefix and the current token (the last decided
    one). A lookahead token at (level l, column j) sees the first level's earlier columns and
    its own column's levels up to l (one Jacobi trajectory per column). A branch token sees its
    own branch up to itself. With `levels = 0` it is the plain multi-branch verification layout.

  * `tree`: one forward over a tree of drafts (Medusa, Token Recycling, FreeDave's drafts over a
    cache). Keys before `prefix_len` (the decided text) are causal; from `prefix_len` on, `tree =
    (p_0, p_1, ...)` lays out nodes of `block_size` tokens each (1 by default): node i is the
    physical span `[prefix_len + i * block_size, prefix_len + (i + 1) * block_size)` and `p_i` its
    parent (`-1`: none, or an earlier node, `p_i < i`). A node's tokens see the prefix, every token
    of their own node (bidirectionally) and of its ancestors; nothing after the tree is visible
    to a node.

  * `denoise_canvas`: DiffusionGemma's training denoiser. Noisy queries `[0, n)` over keys
    `[noisy ; clean]` (`n = Lk // 2`; the clean half holds the encoder's K/V). Per row, canvases
    of `block_size` start at `prefix_len` (the prompt length P): a noisy token of canvas b sees
    the clean keys before the canvas's start `P + b * block_size` and the noisy tokens of its own
    canvas; a noisy prompt token (i < P, never scored) sees only itself.

  * `multiverse`: Multiverse Attention (Yang et al. 2025, arXiv 2506.09991, the published training mask):
    causal, except that a query and a key inside two different `<Path>...</Path>` spans (markers
    included) of the same `<Parallel>` block never see each other, at any nesting depth. The structure
    is per token, over the keys' physical indices: `parallel_ids [B, Lk, D]` and `path_ids [B, Lk, D]`
    (D = the largest nesting depth): at depth d, `parallel_ids` is the id (>= 1, unique in the row) of
    the enclosing `<Parallel>` block of depth d (0: none) and `path_ids` the number (>= 1) of the path
    of that block the token lies in (0: not in a path: the Goal, the Conclusion, text between spans).
    A query at physical index i reads row i of both arrays (so they cover the queries too). Key j is
    hidden from query i iff, at some depth d, both lie in paths of the same block and the paths
    differ. `jaxdllm.attention.multiverse.multiverse_layout` builds the arrays (and the position ids)
    from token ids. Only the dense backends (`reference`, `xla`) take this kind.

A sliding window (`window=W`, with `causal`, `bidirectional` or `denoise_canvas`; Gemma 4's sliding layers) also
hides keys W or more positions back: a causal query i sees keys j with i - W < j <= i; a
bidirectional call (a DiffusionGemma canvas over its cache) sees its own keys and the W - 1 keys
before its first query (`q_offset`), i.e. keys j > q_offset - W; a `denoise_canvas` query sees the
W - 1 clean keys before its canvas's start.

Segment ids (optional, `[B, Lq]` and `[B, Lk]`) further restrict visibility to equal ids. Use
0 for padding: real tokens (ids >= 1) never see padding keys; padding queries see only
padding keys, so their rows stay finite.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxdllm.errors import ConfigError

MaskKind = Literal["bidirectional", "causal", "block_causal", "block_diffusion", "set_block", "jacobi_forcing",
                   "lookahead", "denoise_canvas", "tree", "wedlm", "multiverse"]
MASK_KINDS = ("bidirectional", "causal", "block_causal", "block_diffusion", "set_block", "jacobi_forcing", "lookahead",
              "denoise_canvas", "tree", "wedlm", "multiverse")
DENSE_ONLY_KINDS = ("multiverse",)  # per-token structure: the tile kernels (pallas, splash) refuse these
DENSE_BACKENDS = ("reference", "xla")
_NEEDS_BLOCK = ("block_causal", "block_diffusion", "set_block", "jacobi_forcing", "denoise_canvas", "wedlm")
_HALVES = ("block_diffusion", "set_block", "denoise_canvas", "wedlm")  # the rule needs the key length (two halves)
_PER_ROW_PREFIX = ("jacobi_forcing", "lookahead", "denoise_canvas", "tree", "set_block")
_WINDOWED = ("causal", "bidirectional", "denoise_canvas")


@struct.dataclass
class MaskSpec:
    """Which keys each query may attend to.

    Attributes:
      kind: one of `MASK_KINDS` (static).
      block_size: block length for the block kinds (static).
      q_offset: physical index of the first query in the key sequence; int or traced int32
        scalar (a sampler step over a cache).
      prefix_len: prompt length for `jacobi_forcing` and `denoise_canvas`, the window's first index
        for `lookahead`, the first node's first index for `tree`, the first block's start for
        `set_block`; int, scalar or `[B]` int32.
      window_shape: `(levels, width, branch_len)` of the `lookahead` layout (static).
      q_segment_ids: optional `[B, Lq]` int32; 0 marks padding.
      kv_segment_ids: optional `[B, Lk]` int32; 0 marks padding or an unwritten cache slot.
      window: sliding window W (static; `causal` and `bidirectional` only): see the module notes.
      tree: parents of the `tree` kind's nodes (static tuple; -1 = no parent); `block_size` (default
        1) is the tokens per node.
      parallel_ids, path_ids: `[B, Lk, D]` int32, the `multiverse` kind's per-token structure (module
        notes); None for every other kind.
    """

    kind: str = struct.field(pytree_node=False, default="bidirectional")
    block_size: int | None = struct.field(pytree_node=False, default=None)
    q_offset: jax.Array | int = 0
    prefix_len: jax.Array | int = 0
    q_segment_ids: jax.Array | None = None
    kv_segment_ids: jax.Array | None = None
    window_shape: tuple[int, int, int] | None = struct.field(pytree_node=False, default=None)
    window: int | None = struct.field(pytree_node=False, default=None)
    tree: tuple[int, ...] | None = struct.field(pytree_node=False, default=None)
    parallel_ids: jax.Array | None = None
    path_ids: jax.Array | None = None

    def __post_init__(self):
        if self.kind not in MASK_KINDS:
            raise ConfigError(f"mask kind must be one of {MASK_KINDS}, got {self.kind!r}")
        if self.kind in _NEEDS_BLOCK and (self.block_size is None or self.block_size <= 0):
            raise ConfigError(f"mask kind {self.kind!r} needs a positive block_size")
        if self.window is not None and (self.kind not in _WINDOWED or not isinstance(self.window, int)
                                        or self.window < 1):
            raise ConfigError(f"a sliding window must be a positive int on a {_WINDOWED} mask; got window="
                              f"{self.window!r} on {self.kind!r}")
        if self.kind == "tree":
            check_tree(self.tree)
            if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 1):
                raise ConfigError(f"mask kind 'tree' takes block_size = tokens per node >= 1, got {self.block_size!r}")
        if (self.kind == "multiverse") != (self.parallel_ids is not None and self.path_ids is not None):
            raise ConfigError("mask kind 'multiverse' needs both parallel_ids and path_ids [B, Lk, D] (build them with "
                              "jaxdllm.attention.multiverse.multiverse_layout), and no other kind takes them")
        if self.kind == "lookahead":
            shape = self.window_shape
            if (not isinstance(shape, tuple) or len(shape) != 3 or any(not isinstance(x, int) or x < 0 for x in shape)
                    or (shape[0] > 0) != (shape[1] > 0)):
                raise ConfigError("mask kind 'lookahead' needs window_shape = (levels, width, branch_len), integers "
                                  f">= 0 with levels and width both 0 or both positive; got {shape!r}")

    def replace(self, **changes) -> "MaskSpec":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_padding(cls, attention_mask: jax.Array, kind: str = "bidirectional",
                     block_size: int | None = None) -> "MaskSpec":
        """From an HF-style `[B, L]` 0/1 mask (1 = real token) over the same queries and keys."""
        seg = jnp.asarray(attention_mask, jnp.int32)
        return cls(kind=kind, block_size=block_size, q_segment_ids=seg, kv_segment_ids=seg)

    def check_inputs(self, q: jax.Array, k: jax.Array) -> None:
        """Raise `ValueError` unless `q [B, Lq, H, D]` and `k [B, Lk, Hkv, D]` suit this mask (every
        kernel checks the same)."""
        if q.shape[2] % k.shape[2]:
            raise ConfigError(f"query heads {q.shape[2]} must be a multiple of kv heads {k.shape[2]}")
        if self.kind in DENSE_ONLY_KINDS:
            raise ConfigError(f"mask kind {self.kind!r} has a per-token structure the tile kernels cannot read; "
                              f"run it on attention_impl {DENSE_BACKENDS} (impl='auto' picks one)")
        if self.kind in _HALVES and k.shape[1] % 2:
            raise ConfigError(f"{self.kind} needs an even [noisy; clean] length, got {k.shape[1]}")
        if (self.q_segment_ids is None) != (self.kv_segment_ids is None):
            raise ConfigError("give both q_segment_ids and kv_segment_ids, or neither")

    # -- the rule, elementwise on broadcastable physical indices --------------------------------
    def visible(self, q_idx: jax.Array, k_idx: jax.Array) -> jax.Array:
        """Structural visibility (no segment ids) for physical indices; broadcasting bool.

        `q_idx` and `k_idx` are int arrays that broadcast against each other (e.g. `[Lq, 1]`
        and `[1, Lk]`), or against `[B, 1, 1]` when `prefix_len` is per row.
        """
        bs = self.block_size
        if self.window is not None:  # Gemma 4's sliding layers
            anchor = q_idx if self.kind == "causal" else jnp.asarray(self.q_offset, jnp.int32)
            near = k_idx > anchor - self.window
            return near & (k_idx <= q_idx) if self.kind == "causal" else jnp.broadcast_to(
                near, jnp.broadcast_shapes(jnp.shape(q_idx), jnp.shape(k_idx)))
        if self.kind == "bidirectional":
            return jnp.ones(jnp.broadcast_shapes(jnp.shape(q_idx), jnp.shape(k_idx)), bool)
        if self.kind == "causal":
            return k_idx <= q_idx
        if self.kind == "block_causal":
            return k_idx // bs <= q_idx // bs
        if self.kind in _HALVES:
            raise ConfigError(f"{self.kind} visibility needs the half length; use visible_at() or dense()")
        if self.kind in DENSE_ONLY_KINDS:
            raise ConfigError(f"{self.kind} visibility needs the per-token structure; use dense()")
        if self.kind == "lookahead":
            return self._lookahead_visible(q_idx, k_idx)
        if self.kind == "tree":
            return self._tree_visible(q_idx, k_idx)
        # jacobi_forcing
        p = self.prefix_len
        q_prompt, k_prompt = q_idx < p, k_idx < p
        qr, kr = q_idx - p, k_idx - p
        same_stream = (qr // bs) % 2 == (kr // bs) % 2
        q_blk, k_blk = qr // (2 * bs), kr // (2 * bs)
        in_order = (k_blk < q_blk) | ((k_blk == q_blk) & (kr % bs <= qr % bs))
        return (k_prompt & (k_idx <= q_idx)) | (~q_prompt & ~k_prompt & same_stream & in_order)

    def _lookahead_visible(self, q_idx, k_idx):
        levels, width, branch_len = self.window_shape
        start = self.prefix_len
        rq, rk = q_idx - start, k_idx - start         # index in the window (< 0: the prefix)
        span = levels * width
        w, n = max(width, 1), max(branch_len, 1)
        q_look, k_look = (rq >= 1) & (rq <= span), (rk >= 1) & (rk <= span)
        q_level, q_col, k_level, k_col = (rq - 1) // w, (rq - 1) % w, (rk - 1) // w, (rk - 1) % w
        lookahead = q_look & k_look & (((k_level == 0) & (k_col < q_col)) | ((k_col == q_col) & (k_level <= q_level)))
        q_branch, k_branch = rq > span, rk > span
        same_branch = (rq - 1 - span) // n == (rk - 1 - span) // n
        branch = q_branch & k_branch & same_branch & (rk <= rq)
        return ((rk < 0) & (k_idx <= q_idx)) | ((rk == 0) & (rq >= 0)) | lookahead | branch

    def _tree_visible(self, q_idx, k_idx):
        n, size = len(self.tree), self.block_size or 1
        rq, rk = q_idx - self.prefix_len, k_idx - self.prefix_len
        q_node, k_node = (rq, rk) if size == 1 else (rq // size, rk // size)
        in_q, in_k = (rq >= 0) & (q_node < n), (rk >= 0) & (k_node < n)
        # k's node is q's or an ancestor of it iff q's node lies in k's subtree, an interval of the
        # depth-first preorder; the static per-node numbers are selected by comparisons, not
        # gathered from a table, so a kernel evaluates this on a tile's indices (Triton, Mosaic).
        start, end = tree_preorder(self.tree)
        q_pre = _select_static(start, q_node)
        related = (_select_static(start, k_node) <= q_pre) & (q_pre < _select_static(end, k_node))
        return ((rk < 0) & ((rq >= 0) | (k_idx <= q_idx))) | (in_q & in_k & related)

    def _block_diffusion_visible(self, q_idx, k_idx, n):
        bs = self.block_size
        q_clean, k_clean = q_idx >= n, k_idx >= n
        q_blk, k_blk = (q_idx % n) // bs, (k_idx % n) // bs
        noisy_sees_clean = ~q_clean & k_clean & (q_blk > k_blk)
        if self.kind == "set_block":  # blocks from prefix_len; the clean half is causal
            q_blk, k_blk = (q_idx % n - self.prefix_len) // bs, (k_idx % n - self.prefix_len) // bs
            noisy_sees_clean = ~q_clean & k_clean & (q_blk > k_blk)
            same = ~q_clean & ~k_clean & (q_blk == k_blk)
            return same | noisy_sees_clean | (q_clean & k_clean & (k_idx <= q_idx))
        same = (q_clean == k_clean) & (q_blk == k_blk)
        clean_causal = q_clean & k_clean & (q_blk >= k_blk)
        return same | noisy_sees_clean | clean_causal

    def _wedlm_visible(self, q_idx, k_idx, n):
        q_xt, k_xt = q_idx >= n, k_idx >= n
        q_blk, k_blk = (q_idx % n) // self.block_size, (k_idx % n) // self.block_size
        in_order = k_idx <= q_idx
        return ((~q_xt & ~k_xt & in_order) | (q_xt & ~k_xt & (k_blk < q_blk))
                | (q_xt & k_xt & (k_blk == q_blk) & in_order))

    def _denoise_canvas_visible(self, q_idx, k_idx, n):
        bs, p = self.block_size, self.prefix_len
        canvas = (q_idx - p) // bs
        start = p + canvas * bs  # the first position of the query's canvas
        clean, at = k_idx >= n, k_idx - n
        context = clean & (at < start)
        if self.window is not None:
            context = context & (at > start - self.window)
        own = ~clean & (k_idx >= p) & ((k_idx - p) // bs == canvas)
        return jnp.where(q_idx < p, k_idx == q_idx, context | own)

    def _multiverse_hidden(self, q_idx: jax.Array, kv_len: int) -> jax.Array:
        """`[B, Lq, Lk]` bool: the pairs in different paths of one block (`multiverse`, module notes)."""
        par, path = jnp.asarray(self.parallel_ids, jnp.int32), jnp.asarray(self.path_ids, jnp.int32)
        if par.ndim != 3 or par.shape != path.shape or par.shape[1] != kv_len:
            raise ConfigError(f"multiverse parallel_ids {par.shape} and path_ids {path.shape} must both be [B, Lk={kv_len}, D]")
        q_par, q_path = jnp.take(par, q_idx, axis=1), jnp.take(path, q_idx, axis=1)  # [B, Lq, D]
        same_block = (q_par[:, :, None] == par[:, None]) & (q_par[:, :, None] > 0)  # [B, Lq, Lk, D]
        other_path = (q_path[:, :, None] != path[:, None]) & (q_path[:, :, None] > 0) & (path[:, None] > 0)
        return (same_block & other_path).any(-1)

    def visible_at(self, q_idx: jax.Array, k_idx: jax.Array, kv_len: int) -> jax.Array:
        """`visible` for every kind, block_diffusion, set_block, wedlm and denoise_canvas included (their
        halves need `kv_len`).

        Elementwise on broadcastable int arrays; kernels call this on one tile's indices.
        """
        if self.kind in ("block_diffusion", "set_block"):
            return self._block_diffusion_visible(q_idx, k_idx, kv_len // 2)
        if self.kind == "denoise_canvas":
            return self._denoise_canvas_visible(q_idx, k_idx, kv_len // 2)
        if self.kind == "wedlm":
            return self._wedlm_visible(q_idx, k_idx, kv_len // 2)
        return self.visible(q_idx, k_idx)

    def dense(self, q_len: int, kv_len: int) -> jax.Array:
        """The mask as a boolean `[B or 1, q_len, kv_len]` array (True = may attend)."""
        q_idx = (jnp.asarray(self.q_offset, jnp.int32) + jnp.arange(q_len, dtype=jnp.int32))[:, None]
        k_idx = jnp.arange(kv_len, dtype=jnp.int32)[None, :]
        if self.kind in _HALVES and kv_len % 2:
            raise ConfigError(f"{self.kind} needs an even [noisy; clean] length, got {kv_len}")
        if self.kind in _PER_ROW_PREFIX and jnp.ndim(self.prefix_len) == 1:
            per_row = self.replace(prefix_len=jnp.asarray(self.prefix_len)[:, None, None])
            mask = per_row.visible_at(q_idx[None], k_idx[None], kv_len)
        elif self.kind in _HALVES:
            mask = self.visible_at(q_idx, k_idx, kv_len)[None]
        elif self.kind == "multiverse":
            mask = (k_idx <= q_idx)[None] & ~self._multiverse_hidden(q_idx[:, 0], kv_len)
        else:
            mask = self.visible(q_idx, k_idx)[None]
        if self.q_segment_ids is not None or self.kv_segment_ids is not None:
            if self.q_segment_ids is None or self.kv_segment_ids is None:
                raise ConfigError("give both q_segment_ids and kv_segment_ids, or neither")
            qs, ks = jnp.asarray(self.q_segment_ids), jnp.asarray(self.kv_segment_ids)
            if qs.shape[-1] != q_len or ks.shape[-1] != kv_len:
                raise ConfigError(
                    f"segment ids {qs.shape} / {ks.shape} do not match q_len {q_len} / kv_len {kv_len}")
            mask = mask & (qs[:, :, None] == ks[:, None, :])
        return mask


def check_tree(parents) -> None:
    """Raise `ConfigError` unless `parents` is a non-empty tuple of ints with `-1 <= p_i < i`."""
    if (not isinstance(parents, tuple) or not parents
            or any(not isinstance(p, int) or isinstance(p, bool) or not -1 <= p < i for i, p in enumerate(parents))):
        raise ConfigError("a tree is a non-empty tuple of parent indices p_i with -1 <= p_i < i (-1: no parent), "
                          f"got {parents!r}")


def tree_ancestry(parents: tuple[int, ...]) -> np.ndarray:
    """`[n, n]` bool: `[a, b]` is True when node b is node a or one of its ancestors."""
    n = len(parents)
    table = np.eye(n, dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            table[i] |= table[p]
    return table


@functools.lru_cache(maxsize=256)
def tree_preorder(parents: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`(start, end)`: node i's subtree is the preorder interval `[start[i], end[i])` of a depth-first
    walk (children in index order, roots too), so node b is node a or one of its ancestors iff
    `start[b] <= start[a] < end[b]`."""
    n = len(parents)
    children = [[] for _ in range(n)]
    for i, p in enumerate(parents):
        if p >= 0:
            children[p].append(i)
    start, end, counter = [0] * n, [0] * n, 0
    stack = [(i, False) for i in reversed(range(n)) if parents[i] < 0]
    while stack:
        node, done = stack.pop()
        if done:
            end[node] = counter
            continue
        start[node], counter = counter, counter + 1
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(children[node]))
    return tuple(start), tuple(end)


def _select_static(values: tuple[int, ...], idx):
    """`values[idx]` for `0 <= idx < len(values)` (anything elsewhere), elementwise on an int array: a
    chain of compare-and-selects over the static `values`, one per run of equal or consecutive values."""
    out, i, n = None, 0, len(values)
    while i < n:
        step = 1 if i + 1 < n and values[i + 1] == values[i] + 1 else 0
        j = i + 1
        while j < n and values[j] == values[j - 1] + step:
            j += 1
        piece = idx + (values[i] - i) if step else jnp.zeros_like(idx) + values[i]
        out = piece if out is None else jnp.where(idx >= i, piece, out)
        i = j
    return out


def tree_depths(parents: tuple[int, ...]) -> np.ndarray:
    """`[n]` int32: each node's depth (0 for a node without parent)."""
    depth = np.zeros(len(parents), np.int32)
    for i, p in enumerate(parents):
        depth[i] = 0 if p < 0 else depth[p] + 1
    return depth
