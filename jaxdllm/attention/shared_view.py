"""Attention over shared cache blocks, each row reading its own view of them (Hogwild! Inference's shared
KV cache, Rodionov et al. 2025; Multiverse's forked paths, Yang et al. 2025).

K/V live in blocks `[NB, S, Hkv, D]`, each block stored once. Its keys are rotated at block-local
positions (slot j at RoPE position j). A row's view is a list of entries `(block, offset)`: the row
reads slot j of that block at logical position `offset + j`. Hogwild! lays a worker's view out as
`[common history, header, the other workers' steps, header, its own step]` (offsets are running sums of
the lengths before); Multiverse gives every path of a `<Parallel>` the same offset (paths start at the
same position) and a merged conclusion reads all of them.

Nothing is re-rotated. RoPE rotations compose, `<R_p q, R_(o+j) k> = <R_(p-o) q, R_j k>`, so the
query at position p is rotated once per view entry, to `p - o` (the published fast kernel's choice);
the caller (the model's attention layer, which owns RoPE) passes those rotated queries. A slot is
visible to a query iff it is written (segment id != 0) and `o + j <= p`: causal by logical position.
Views therefore equal a plain causal forward over the view's text laid out contiguously at those
positions (`tests/attention/test_shared_view.py` and the model tests check exactly that).

The dense path (`reference`, `xla`) scores every view entry and takes one softmax over all of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.errors import ConfigError


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


def check_view(q: jax.Array, rel: jax.Array, k_blocks: jax.Array, view: SharedView) -> None:
    """Raise `ConfigError` unless the shapes of a `view_attention` call agree."""
    r, v, length, h, d = q.shape
    nb, s, hkv, dk = k_blocks.shape
    if view.view_blocks.shape != (r, v) or view.view_offsets.shape != (r, v):
        raise ConfigError(f"view_blocks/view_offsets must be [R={r}, V={v}]; got {view.view_blocks.shape} and "
                          f"{view.view_offsets.shape}")
    if rel.shape != (r, v, length):
        raise ConfigError(f"relative positions must be [R, V, L] = {(r, v, length)}; got {rel.shape}")
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


def view_attention_dense(q: jax.Array, rel: jax.Array, k_blocks: jax.Array, v_blocks: jax.Array, view: SharedView,
                         *, scale: float | None = None) -> jax.Array:
    """The definition: every view entry's scores, one float32 softmax over all of them.

    Args:
      q: `[R, V, L, H, D]` each row's queries, rotated for each view entry (position `rel`).
      rel: `[R, V, L]` int32 query positions relative to each entry's slot 0 (`position - offset`).
      k_blocks, v_blocks: `[NB, S, Hkv, D]` the shared blocks (keys at block-local positions).
      view: the rows' views (`kv_segment_ids` filled in).

    Returns:
      `[R, L, H, D]` in `q.dtype`; a query with no visible slot returns zeros.
    """
    check_view(q, rel, k_blocks, view)
    r, v, length, h, d = q.shape
    s, hkv = k_blocks.shape[1], k_blocks.shape[2]
    scale = d ** -0.5 if scale is None else scale
    blocks = jnp.maximum(view.view_blocks, 0)
    k, vals = k_blocks[blocks], v_blocks[blocks]                                   # [R, V, S, Hkv, D]
    qg = q.reshape(r, v, length, hkv, h // hkv, d)
    scores = jnp.einsum("relhgd,reshd->rhgles", qg, k.astype(q.dtype), preferred_element_type=jnp.float32) * scale
    visible = jnp.moveaxis(view_visible(rel, view, s), 1, 2)[:, None, None]         # [R, 1, 1, L, V, S]
    scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min).reshape(r, hkv, h // hkv, length, v * s)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(visible.reshape(r, 1, 1, length, v * s).any(-1, keepdims=True), probs, 0.0)
    out = jnp.einsum("rhgln,rnhd->rlhgd", probs.astype(v_blocks.dtype), vals.reshape(r, v * s, hkv, d),
                     preferred_element_type=jnp.float32)
    return out.reshape(r, length, h, d).astype(q.dtype)


def view_attention(q: jax.Array, rel: jax.Array, k_blocks: jax.Array, v_blocks: jax.Array, view: SharedView, *,
                   impl: str = "auto", scale: float | None = None) -> jax.Array:
    """Attention of each row over its view of the shared blocks; `[R, L, H, D]`.

    Same arguments as `view_attention_dense`. `impl`: an attention backend name (`jaxdllm.attention.backends`);
    the dense backends (`reference`, `xla`) and, elsewhere than on an accelerator, `auto` take the dense path.
    """
    from jaxdllm.attention.backends import resolve_impl  # backends imports the kernels; keep this module light

    chosen = resolve_impl(impl)
    if chosen in ("reference", "xla"):
        return view_attention_dense(q, rel, k_blocks, v_blocks, view, scale=scale)
    raise ConfigError(f"shared-view attention runs on the dense backends ('reference', 'xla'); got impl={impl!r} "
                      f"({chosen!r})")
