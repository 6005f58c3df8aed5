"""Attention over shared cache blocks, each row reading its own view of them (Hogwild! Inference's shared
KV cache, Rodionov et al. 2025; Multiverse's forked paths, Yang et al. 2025).

K/V live in blocks `[NB, S, Hkv, D]`, each block stored once. Its keys are rotated at block-local
positions (slot j at RoPE position j). A row's view is a list of entries `(block, offset)`: the row
reads slot j of that block at logical position `offset + j`. Hogwild! lays a worker's view out as
`[common history, header, the other workers' steps, header, its own step]` (offsets are running sums of
the lengths before); Multiverse gives every path of a `<Parallel>` the same offset (paths start at the
same position) and a merged conclusion reads all of them.

Nothing is re-rotated. RoPE rotations compose, `<R_p q, R_(o+j) k> = <R_(p-o) q, R_j k>`, so the
query at position p is rotated once per view entry, to `p - o` (the published fast kernel's choice), or,
where a forward is wider than a block, the gathered keys by their entry's offset; the caller (the model's
attention layer, which owns RoPE) passes RoPE as `rotate`. A slot is visible to a query iff it is
written (segment id != 0) and `o + j <= p`: causal by logical position. Views therefore equal a plain
causal forward over the view's text laid out contiguously at those positions
(`tests/attention/test_shared_view.py` and the model tests check exactly that).

Two paths, chosen by the attention backend (`view_attention`, `impl` resolved as `attend` does):

* dense (`reference`, `xla`): every view entry's scores, one softmax over all of them;
* merge (`pallas`, `splash`; Hogwild!'s recommended JAX form: static-capacity blocks, query-side rotation,
  a segment-wise logsumexp merge): each (row, entry) pair is one causal call of the kernel's lse variant
  (`q_offset` = the row's first query position minus the entry's offset, vmapped over the pairs), then
  `merge_partials` combines the entries by their log-sum-exps. It needs each row's valid queries at
  consecutive positions (query i at `p0 + i`), as every decoding step and prefill here lays them out.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxdllm.attention.mask import MaskSpec
from jaxdllm.errors import ConfigError

Rotate = Callable[[jax.Array, jax.Array], jax.Array]


@struct.dataclass
class SharedView:
    """Which shared blocks each row of a forward reads and where its new tokens are written.

    Attributes:
      view_blocks: `[R, V]` int32 block ids of each row's view, in view order; -1 marks an unused entry.
      view_offsets: `[R, V]` int32 logical position of each entry's slot 0.
      write_block: `[R]` int32 the block this forward's tokens of the row are written to (one of its view's),
        or `[R, L]` one per token (a row whose tokens fill one page and go on in the next).
      write_slot: `[R]` int32 the first slot written (token i of the row goes to slot `write_slot + i`), or
        `[R, L]` each token's slot. A key is rotated at its slot (its block-local position).
      q_valid: `[R, L]` bool, tokens to write (False: padding of a shorter row; not written, output unused).
      kv_segment_ids: `[NB, S]` int32 segment ids of the blocks after this forward's writes (0 = empty);
        the model fills it in from its cache (`written`).
    """

    view_blocks: jax.Array
    view_offsets: jax.Array
    write_block: jax.Array
    write_slot: jax.Array
    q_valid: jax.Array
    kv_segment_ids: jax.Array | None = None

    def write_targets(self, num_slots: int) -> tuple[jax.Array, jax.Array]:
        """`(blocks [R, L], slots [R, L])` where this forward's tokens go; padding tokens get slot
        `num_slots` (out of range: a scatter with `mode="drop"` skips them)."""
        r, length = self.q_valid.shape
        slots = jnp.where(self.q_valid & (self.key_slots() < num_slots), self.key_slots(), num_slots)
        block = self.write_block if self.write_block.ndim == 2 else self.write_block[:, None]
        return jnp.broadcast_to(block, (r, length)), slots

    def key_slots(self) -> jax.Array:
        """`[R, L]` the slot of each of this forward's tokens (the position its key is rotated at)."""
        if self.write_slot.ndim == 2:
            return self.write_slot
        return self.write_slot[:, None] + jnp.arange(self.q_valid.shape[1], dtype=jnp.int32)[None]

    def written(self, segment_ids: jax.Array) -> "SharedView":
        """This view with `kv_segment_ids` = the blocks' `segment_ids [NB, S]` plus this forward's tokens."""
        blocks, slots = self.write_targets(segment_ids.shape[1])
        seg = segment_ids.at[blocks, slots].set(1, mode="drop")
        return self.replace(kv_segment_ids=seg)


def check_view(q: jax.Array, positions: jax.Array, k_blocks: jax.Array, view: SharedView) -> None:
    """Raise `ConfigError` unless the shapes of a `view_attention` call agree."""
    r, length, h, d = q.shape
    nb, s, hkv, dk = k_blocks.shape
    v = view.view_blocks.shape[1]
    if view.view_blocks.shape != (r, v) or view.view_offsets.shape != (r, v):
        raise ConfigError(f"view_blocks/view_offsets must be [R={r}, V]; got {view.view_blocks.shape} and "
                          f"{view.view_offsets.shape}")
    if positions.shape != (r, length):
        raise ConfigError(f"query positions must be [R, L] = {(r, length)}; got {positions.shape}")
    if dk != d or h % hkv:
        raise ConfigError(f"queries [.., H={h}, D={d}] do not fit keys [.., Hkv={hkv}, D={dk}]")
    if view.kv_segment_ids is None or view.kv_segment_ids.shape != (nb, s):
        raise ConfigError(f"the view's kv_segment_ids must be the blocks' [NB={nb}, S={s}] segment ids "
                          "(SharedView.written)")


def view_visible(rel: jax.Array, view: SharedView, num_slots: int) -> jax.Array:
    """`[R, V, L, S]` bool: slot j of view entry e is visible to query i of row r (written, an entry in
    use, and `j <= rel[r, e, i]`, the query's position relative to the entry's slot 0)."""
    used = view.view_blocks >= 0
    seg = view.kv_segment_ids[jnp.maximum(view.view_blocks, 0)]                     # [R, V, S]
    j = jnp.arange(num_slots, dtype=jnp.int32)
    return (used[:, :, None, None] & (seg[:, :, None, :] != 0)
            & (j[None, None, None, :] <= rel[:, :, :, None]))


def view_attention_dense(q: jax.Array, positions: jax.Array, k_blocks: jax.Array, v_blocks: jax.Array,
                         view: SharedView, rotate: Rotate, *, scale: float | None = None) -> jax.Array:
    """The definition: every view entry's scores, one float32 softmax over all of them.

    Where a forward has more query rows than an entry has keys (a wide prefill over pages), the gathered
    keys are rotated by their entry's offset instead of the queries per entry: the same scores
    (`<R_p q, R_(o+j) k>`), fewer rotated values; the stored keys are never changed.

    Args:
      q: `[R, L, H, D]` each row's queries before RoPE.
      positions: `[R, L]` int32 their logical positions.
      k_blocks, v_blocks: `[NB, S, Hkv, D]` the shared blocks (keys at block-local positions).
      view: the rows' views (`kv_segment_ids` filled in).
      rotate: RoPE, `(x [N, L, heads, D], positions [N, L]) -> x rotated`.

    Returns:
      `[R, L, H, D]` in `q.dtype`; a query with no visible slot returns zeros.
    """
    check_view(q, positions, k_blocks, view)
    r, length, h, d = q.shape
    v = view.view_blocks.shape[1]
    s, hkv = k_blocks.shape[1], k_blocks.shape[2]
    scale = d ** -0.5 if scale is None else scale
    rel = positions[:, None, :] - view.view_offsets[:, :, None]                    # [R, V, L]
    blocks = jnp.maximum(view.view_blocks, 0)
    k, vals = k_blocks[blocks].astype(q.dtype), v_blocks[blocks]                   # [R, V, S, Hkv, D]
    if length * h > s * hkv:  # rotate the gathered keys by their entry's offset, the queries once
        offsets = jnp.broadcast_to(view.view_offsets[:, :, None], (r, v, s)).reshape(r * v, s)
        k = rotate(k.reshape(r * v, s, hkv, d), offsets).reshape(r, v, s, hkv, d)
        qg = rotate(q, positions).reshape(r, length, hkv, h // hkv, d)
        scores = jnp.einsum("rlhgd,reshd->rhgles", qg, k, preferred_element_type=jnp.float32) * scale
    else:  # rotate each query once per entry, to its position relative to the entry's slot 0
        q_rep = jnp.broadcast_to(q[:, None], (r, v, length, h, d)).reshape(r * v, length, h, d)
        qg = rotate(q_rep, rel.reshape(r * v, length)).reshape(r, v, length, hkv, h // hkv, d)
        scores = jnp.einsum("relhgd,reshd->rhgles", qg, k, preferred_element_type=jnp.float32) * scale
    visible = jnp.moveaxis(view_visible(rel, view, s), 1, 2)[:, None, None]         # [R, 1, 1, L, V, S]
    scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min).reshape(r, hkv, h // hkv, length, v * s)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(visible.reshape(r, 1, 1, length, v * s).any(-1, keepdims=True), probs, 0.0)
    out = jnp.einsum("rhgln,rnhd->rlhgd", probs.astype(v_blocks.dtype), vals.reshape(r, v * s, hkv, d),
                     preferred_element_type=jnp.float32)
    return out.reshape(r, length, h, d).astype(q.dtype)


def check_consecutive(positions: jax.Array, q_valid: jax.Array) -> None:
    """Raise `ConfigError` unless each row's valid queries sit at consecutive positions by column (query i at
    `p0 + i`), which the kernel path (`view_attention_merged`) needs; checked only on concrete arrays (under
    `jit` the caller's layout is trusted)."""
    if isinstance(positions, jax.core.Tracer) or isinstance(q_valid, jax.core.Tracer):
        return
    pos, ok = np.asarray(positions), np.asarray(q_valid, bool)
    anchor = pos - np.arange(pos.shape[1])[None]
    first = anchor[np.arange(pos.shape[0]), ok.argmax(1)]
    bad = ok & (anchor != first[:, None])
    if bad.any():
        row = int(np.nonzero(bad.any(1))[0][0])
        raise ConfigError("shared-view attention on the kernels needs each row's valid queries at consecutive "
                          f"positions (query i at p0 + i); row {row} has positions {pos[row].tolist()} "
                          f"(valid {ok[row].tolist()})")


def merge_partials(outs: jax.Array, lses: jax.Array) -> jax.Array:
    """Merge attentions over disjoint key sets by their log-sum-exps (the segment-wise softmax merge).

    Args:
      outs: `[E, ...rows, D]` each part's normalised output (zeros where it saw no key).
      lses: `[E, ...rows]` each part's natural-log log-sum-exp of its scaled visible scores, `-inf` where it saw
        no key.

    Returns:
      `[...rows, D]` float32: `sum_e exp(lse_e - m) out_e / sum_e exp(lse_e - m)` with `m` the largest finite
      lse; a part with `lse = -inf` weighs exactly 0, and a row where every part is empty returns zeros (no
      `inf - inf`, no 0/0: the shift is 0 there and the denominator is replaced by 1).
    """
    lses = lses.astype(jnp.float32)
    top = lses.max(0)
    top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))   # the shift cancels; no gradient through it
    weights = jnp.exp(lses - top)                                           # exp(-inf) = 0 for empty parts
    total = weights.sum(0)
    num = (weights[..., None] * outs.astype(jnp.float32)).sum(0)
    seen = total > 0
    return jnp.where(seen[..., None], num / jnp.where(seen, total, 1.0)[..., None], 0.0)


def _lse_backend(name: str):
    """`fn(q, k, v, mask, *, scale, **options) -> (out, lse)` of a backend (imported lazily: the kernels)."""
    if name == "reference":
        from jaxdllm.attention.reference import reference_attention_lse
        return reference_attention_lse
    if name == "pallas":
        from jaxdllm.attention.triton_flash import flash_attention_lse
        return flash_attention_lse
    if name == "splash":
        from jaxdllm.attention.tpu_splash import splash_attention_lse
        return splash_attention_lse
    raise ConfigError(f"no log-sum-exp variant of attention backend {name!r}; merge backends: {MERGE_BACKENDS}")


MERGE_BACKENDS = ("reference", "pallas", "splash")


def view_attention_merged(q: jax.Array, positions: jax.Array, k_blocks: jax.Array, v_blocks: jax.Array,
                          view: SharedView, rotate: Rotate, *, impl: str = "pallas", scale: float | None = None,
                          **options) -> jax.Array:
    """The kernel path: each view entry attended on its own, then merged by log-sum-exp.

    Every (row, entry) pair becomes one row of a single batched call of a backend's lse variant (`impl`, one of
    `MERGE_BACKENDS`; `reference` is there to test the merge on a CPU): the entry's block as keys, slots
    written and the entry in use as `kv_segment_ids`, and `MaskSpec(kind="causal", q_offset=p0 - offset)`
    where `p0` is the row's query 0's position (vmapped over the pairs, each with its own offset). A
    negative `q_offset` (the entry lies wholly after the queries) leaves those queries no visible key: they
    get zeros and `lse = -inf`, which `merge_partials` weighs 0. Rotation is chosen as in
    `view_attention_dense` (queries per entry, or the gathered keys by their offset when that is fewer values).

    Requires each row's valid queries (`view.q_valid`) at consecutive positions (query i at `p0 + i`, `p0`
    taken from the first valid one; `check_consecutive`, on concrete inputs). A padding query's output is
    that of a query at `p0 + i` (unused: its K/V are not written).

    Same arguments and result as `view_attention_dense`; `options` go to the backend (`block_sizes`,
    `interpret`, splash's `min_query_block`). Differentiable on `reference` and `pallas`; splash's residuals
    are forward only.
    """
    check_view(q, positions, k_blocks, view)
    check_consecutive(positions, view.q_valid)
    fn = _lse_backend(impl)
    r, length, h, d = q.shape
    v = view.view_blocks.shape[1]
    nb, s, hkv, _ = k_blocks.shape
    first = jnp.argmax(view.q_valid, axis=1)                                       # 0 for a row with none
    p0 = jnp.take_along_axis(positions, first[:, None], 1)[:, 0] - first.astype(positions.dtype)
    q_offset = (p0[:, None] - view.view_offsets).astype(jnp.int32).reshape(r * v)  # query 0 relative to slot 0
    used = view.view_blocks >= 0
    blocks = jnp.maximum(view.view_blocks, 0).reshape(r * v)
    k, vals = k_blocks[blocks].astype(q.dtype), v_blocks[blocks]                   # [R*V, S, Hkv, D]
    kv_seg = ((view.kv_segment_ids[blocks] != 0) & used.reshape(r * v, 1)).astype(jnp.int32)
    if length * h > s * hkv:  # rotate the gathered keys by their entry's offset, the queries once
        offsets = jnp.broadcast_to(view.view_offsets.reshape(r * v, 1), (r * v, s))
        k = rotate(k, offsets)
        q_rot = jnp.broadcast_to(rotate(q, positions)[:, None], (r, v, length, h, d)).reshape(r * v, length, h, d)
    else:  # rotate each query once per entry, to its position relative to the entry's slot 0
        rel = (positions[:, None, :] - view.view_offsets[:, :, None]).reshape(r * v, length)
        q_rep = jnp.broadcast_to(q[:, None], (r, v, length, h, d)).reshape(r * v, length, h, d)
        q_rot = rotate(q_rep, rel)
    q_seg = jnp.ones((1, length), jnp.int32)

    def one(q1, k1, v1, offset, seg1):
        mask = MaskSpec(kind="causal", q_offset=offset, q_segment_ids=q_seg, kv_segment_ids=seg1[None])
        out, lse = fn(q1[None], k1[None], v1[None], mask, scale=scale, **options)
        return out[0], lse[0]

    outs, lses = jax.vmap(one)(q_rot, k, vals.astype(q.dtype), q_offset, kv_seg)   # [R*V, L, H, D], [R*V, L, H]
    merged = merge_partials(jnp.moveaxis(outs.reshape(r, v, length, h, d), 1, 0),
                            jnp.moveaxis(lses.reshape(r, v, length, h), 1, 0))
    return merged.astype(q.dtype)


def view_attention(q: jax.Array, positions: jax.Array, k_blocks: jax.Array, v_blocks: jax.Array, view: SharedView,
                   rotate: Rotate, *, impl: str = "auto", scale: float | None = None, **options) -> jax.Array:
    """Attention of each row over its view of the shared blocks; `[R, L, H, D]`.

    Same arguments as `view_attention_dense`. `impl`: an attention backend name (`jaxdllm.attention.backends`),
    resolved as `attend` resolves it (`auto`: per platform). The dense backends (`reference`, `xla`) take the
    dense path; the kernels (`pallas`, `splash`) the merge path (`view_attention_merged`, which needs each row's
    valid queries at consecutive positions), with `options` passed to the kernel. `cudnn` cannot express a
    view's mask.
    """
    from jaxdllm.attention.backends import resolve_impl  # backends imports the kernels; keep this module light

    chosen = resolve_impl(impl)
    if chosen in ("reference", "xla"):
        return view_attention_dense(q, positions, k_blocks, v_blocks, view, rotate, scale=scale)
    if chosen in ("pallas", "splash"):
        return view_attention_merged(q, positions, k_blocks, v_blocks, view, rotate, impl=chosen, scale=scale,
                                     **options)
    raise ConfigError(f"shared-view attention runs on 'reference', 'xla' (dense) and 'pallas', 'splash' (per-entry "
                      f"kernels merged by log-sum-exp); got impl={impl!r} ({chosen!r})")
