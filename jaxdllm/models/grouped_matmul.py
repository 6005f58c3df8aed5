"""Grouped matmul in Pallas on Triton (NVIDIA GPUs; any backend with `interpret=True`): rows sorted by
group, each group multiplied by its own weight matrix, `out[i] = rows[i] @ weights[group(i)]`
(what `jax.lax.ragged_dot` computes).

Why: XLA's GPU backend may run a ragged dot as a dense batched dot over zero-padded rows (every
group over every row), `G` times the arithmetic: for a mixture of experts with 128 experts that
turns a memory-bound step into a compute-bound one. Here each group's rows are padded only to a
multiple of the row tile (`tile_layout`), every program multiplies one row tile by the weights of
the one group that tile belongs to, and programs past the last real tile do nothing. The weights
a step reads are those of the groups that have rows, each once per row tile of theirs.

Layout (`tile_layout`, computed once and shared by the three projections of a SwiGLU): group `g`
starts at row tile `first_tile[g]`; sorted row `i` (the `j`-th of its group) sits at padded row
`first_tile[g] * tile + j`; `tile_group[t]` is the group of tile `t`. Static size: at most
`ceil(R / tile) + min(G, R)` tiles (each non-empty group adds at most one partial tile).

Gradients (`jax.custom_vjp`): the backward pass is `jax.lax.ragged_dot`'s (XLA), so training through
this path is exact; only the forward runs the kernel.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl


@dataclasses.dataclass(frozen=True)
class TileLayout:
    """Where each sorted row sits in the padded tile layout (see the module docstring).

    position: `[R]` padded row of each sorted row (rows past the groups: `padded_rows`, dropped).
    tile_group: `[tiles]` the group of each row tile (the last group for tiles past the real ones).
    real_tiles: `[1]` the number of row tiles that hold rows.
    tile: rows per tile (static); tiles: the static number of tiles.
    """

    position: jax.Array
    tile_group: jax.Array
    real_tiles: jax.Array
    tile: int
    tiles: int

    @property
    def padded_rows(self) -> int:
        return self.tile * self.tiles


jax.tree_util.register_dataclass(TileLayout, data_fields=["position", "tile_group", "real_tiles"],
                                 meta_fields=["tile", "tiles"])


def row_tile(rows: int, groups: int) -> int:
    """Rows per tile: the power of two near the mean group size, between 16 (Triton's smallest dot)
    and 128."""
    mean = max(1, rows // max(groups, 1))
    return int(min(128, max(16, 1 << (mean - 1).bit_length())))


def tile_layout(group_sizes: jax.Array, rows: int, tile: int | None = None) -> TileLayout:
    """The padded layout of `rows` sorted rows in groups of `group_sizes [G]` (int; their sum at most
    `rows`; rows past it belong to no group)."""
    groups = group_sizes.shape[0]
    tile = tile or row_tile(rows, groups)
    tiles = -(-rows // tile) + min(groups, rows)
    sizes = group_sizes.astype(jnp.int32)
    group_end = jnp.cumsum(sizes)
    group_start = group_end - sizes
    tiles_of = (sizes + tile - 1) // tile
    tile_end = jnp.cumsum(tiles_of)
    first_tile = tile_end - tiles_of
    index = jnp.arange(rows, dtype=jnp.int32)
    group = jnp.minimum(jnp.searchsorted(group_end, index, side="right", method="compare_all"), groups - 1)
    inside = index < group_end[-1]
    position = jnp.where(inside, first_tile[group] * tile + index - group_start[group], tiles * tile)
    tile_group = jnp.minimum(jnp.searchsorted(tile_end, jnp.arange(tiles, dtype=jnp.int32), side="right",
                                               method="compare_all"), groups - 1)
    return TileLayout(position.astype(jnp.int32), tile_group.astype(jnp.int32), tile_end[-1:].astype(jnp.int32),
                      tile, tiles)


def to_tiles(rows: jax.Array, layout: TileLayout) -> jax.Array:
    """`[R, K]` sorted rows -> `[padded_rows, K]` (zeros in the padding)."""
    out = jnp.zeros((layout.padded_rows, rows.shape[1]), rows.dtype)
    return out.at[layout.position].set(rows, mode="drop")


def from_tiles(padded: jax.Array, layout: TileLayout) -> jax.Array:
    """`[padded_rows, N]` -> `[R, N]` in sorted-row order (zeros for rows past the groups)."""
    return padded.at[layout.position].get(mode="fill", fill_value=0)


def _block(dim: int) -> int | None:
    """The largest of 128, 64, 32, 16 dividing `dim` (None: none does)."""
    return next((b for b in (128, 64, 32, 16) if dim % b == 0), None)


def supported(k: int, n: int) -> bool:
    """Whether the kernel takes a `[K, N]` weight (both dims multiples of 16)."""
    return _block(k) is not None and _block(n) is not None


def _kernel(tile_group_ref, real_tiles_ref, x_ref, w_ref, o_ref, *, block_k: int, block_n: int):
    t = pl.program_id(0)
    columns = pl.ds(pl.program_id(1) * block_n, block_n)

    @pl.when(t < real_tiles_ref[0])
    def _():
        group = tile_group_ref[t]

        def step(i, acc):
            inner = pl.ds(i * block_k, block_k)
            return acc + lax.dot_general(x_ref[:, inner], w_ref[group, inner, columns], (((1,), (0,)), ((), ())),
                                         preferred_element_type=jnp.float32)

        acc = lax.fori_loop(0, x_ref.shape[1] // block_k, step, jnp.zeros(o_ref.shape, jnp.float32))
        o_ref[...] = acc.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("interpret", "out_dtype"))
def _tiled_matmul(padded: jax.Array, weights: jax.Array, layout: TileLayout, *, interpret: bool,
                  out_dtype) -> jax.Array:
    """`[padded_rows, K] x [G, K, N] -> [padded_rows, N]`: tile `t` times `weights[tile_group[t]]`."""
    g, k, n = weights.shape
    block_k, block_n = _block(k), _block(n)
    tm = layout.tile
    params = None
    if not interpret:
        from jax.experimental.pallas import triton as plgpu
        params = plgpu.CompilerParams(num_warps=4 if tm * block_n <= 64 * 64 else 8, num_stages=2)
    return pl.pallas_call(
        functools.partial(_kernel, block_k=block_k, block_n=block_n),
        out_shape=jax.ShapeDtypeStruct((layout.padded_rows, n), out_dtype),
        grid=(layout.tiles, n // block_n),
        in_specs=[pl.BlockSpec((layout.tiles,), lambda t, j: (0,)),
                  pl.BlockSpec((1,), lambda t, j: (0,)),
                  pl.BlockSpec((tm, k), lambda t, j: (t, 0)),
                  pl.BlockSpec((g, k, n), lambda t, j: (0, 0, 0))],
        out_specs=pl.BlockSpec((tm, block_n), lambda t, j: (t, j)),
        compiler_params=params,
        interpret=interpret,
    )(layout.tile_group, layout.real_tiles, padded, weights)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def tiled_matmul(padded: jax.Array, weights: jax.Array, layout: TileLayout, interpret: bool) -> jax.Array:
    """`padded [P, K]` (rows in `layout`) times each tile's group of `weights [G, K, N]`:
    `[P, N]` float32 (padding rows: unspecified; `from_tiles` drops them)."""
    return _tiled_matmul(padded, weights, layout, interpret=interpret, out_dtype=jnp.float32)


def _fwd(padded, weights, layout, interpret):
    return tiled_matmul(padded, weights, layout, interpret), (padded, weights, layout)


def _bwd(interpret, residuals, grad):
    """The gradient of the same product written as a ragged dot over the padded rows (each tile's
    rows in its group; tiles past the real ones in no group)."""
    padded, weights, layout = residuals
    g = weights.shape[0]
    real = jnp.arange(layout.tiles) < layout.real_tiles[0]
    sizes = jnp.zeros((g,), jnp.int32).at[layout.tile_group].add(jnp.where(real, layout.tile, 0))
    _, vjp = jax.vjp(lambda x, w: lax.ragged_dot(x, w, sizes, preferred_element_type=jnp.float32), padded, weights)
    d_padded, d_weights = vjp(grad.astype(jnp.float32))
    layout_zero = jax.tree.map(lambda x: jnp.zeros(x.shape, jax.dtypes.float0), layout)
    return d_padded.astype(padded.dtype), d_weights.astype(weights.dtype), layout_zero


tiled_matmul.defvjp(_fwd, _bwd)


def grouped_matmul(rows: jax.Array, weights: jax.Array, group_sizes: jax.Array, *, tile: int | None = None,
                   interpret: bool = False) -> jax.Array:
    """`jax.lax.ragged_dot(rows, weights, group_sizes)` through the tile layout and the kernel.

    Args:
      rows: `[R, K]` sorted by group; weights: `[G, K, N]` (K and N multiples of 16);
      group_sizes: `[G]` int, summing to at most R (rows past the sum: zeros out).
      tile: rows per tile (default `row_tile`); interpret: run the kernel in Pallas's interpreter.

    Returns:
      `[R, N]` float32.
    """
    layout = tile_layout(group_sizes, rows.shape[0], tile)
    return from_tiles(tiled_matmul(to_tiles(rows, layout), weights, layout, interpret), layout)


# ----------------------------------------------------------------------------- the tiles in a loop (CPU)

def loop_tile(rows: int, groups: int) -> int:
    """Rows per tile of `tile_loop` (XLA's CPU backend): the power of two at or above twice the mean
    group size, between 8 and 128. Each tile copies its group's weights out of the stacked kernels
    (XLA's CPU dot takes no dynamic slice of an operand in place) and reads them once: a copy costs
    about as much as multiplying a dozen rows, so a group spread over more tiles costs more than
    the padding rows of larger tiles do."""
    mean = max(1, -(-rows // max(groups, 1)))
    return int(min(128, max(8, 1 << (2 * mean - 1).bit_length())))


def _loop_fwd_impl(fn, padded, weights, layout):
    tile = layout.tile
    first = [jax.ShapeDtypeStruct(w.shape[1:], w.dtype) for w in weights]
    spec = jax.eval_shape(fn, jax.ShapeDtypeStruct((tile,) + padded.shape[1:], padded.dtype), *first)
    out = jnp.zeros((layout.padded_rows,) + spec.shape[1:], spec.dtype)

    def body(t, out):
        g = layout.tile_group[t]
        rows = lax.dynamic_slice_in_dim(padded, t * tile, tile)
        result = fn(rows, *(lax.dynamic_index_in_dim(w, g, keepdims=False) for w in weights))
        return lax.dynamic_update_slice_in_dim(out, result, t * tile, 0)

    return lax.fori_loop(0, layout.real_tiles[0], body, out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def tile_loop(fn, padded: jax.Array, weights: tuple, layout: TileLayout) -> jax.Array:
    """`fn` on each real row tile with its group's weights: tile `t` of the output is
    `fn(padded[tile t], *(w[tile_group[t]] for w in weights))`, one tile after another in a
    `while_loop` over the `real_tiles` tiles (what runs is each group's rows padded to whole tiles,
    not every group over every row); tiles past the real ones are zeros.

    Args:
      fn: `(rows [tile, K], *one group's weights) -> [tile, N]`, a pure function of its arguments
        (its gradient is `jax.vjp`'s, tile by tile).
      padded: `[padded_rows, K]` in `layout` (`to_tiles`); weights: a tuple of `[G, ...]` arrays.

    Gradients (`jax.custom_vjp`): the backward pass runs the same loop with `jax.vjp(fn)` per tile
    (recomputing the tile's forward), adding each tile's weight gradient into its group's (float32).
    """
    return _loop_fwd_impl(fn, padded, weights, layout)


def _loop_fwd(fn, padded, weights, layout):
    return _loop_fwd_impl(fn, padded, weights, layout), (padded, weights, layout)


def _loop_bwd(fn, residuals, grad):
    padded, weights, layout = residuals
    tile = layout.tile

    def body(t, carry):
        d_padded, d_weights = carry
        g = layout.tile_group[t]
        rows = lax.dynamic_slice_in_dim(padded, t * tile, tile)
        _, vjp = jax.vjp(fn, rows, *(lax.dynamic_index_in_dim(w, g, keepdims=False) for w in weights))
        d_rows, *d_group = vjp(lax.dynamic_slice_in_dim(grad, t * tile, tile))
        d_padded = lax.dynamic_update_slice_in_dim(d_padded, d_rows.astype(d_padded.dtype), t * tile, 0)
        d_weights = tuple(lax.dynamic_update_index_in_dim(
            dw, lax.dynamic_index_in_dim(dw, g, keepdims=False) + d.astype(jnp.float32), g, 0)
            for dw, d in zip(d_weights, d_group))
        return d_padded, d_weights

    zeros = (jnp.zeros_like(padded), tuple(jnp.zeros(w.shape, jnp.float32) for w in weights))
    d_padded, d_weights = lax.fori_loop(0, layout.real_tiles[0], body, zeros)
    layout_zero = jax.tree.map(lambda x: jnp.zeros(x.shape, jax.dtypes.float0), layout)
    return d_padded, tuple(d.astype(w.dtype) for d, w in zip(d_weights, weights)), layout_zero


tile_loop.defvjp(_loop_fwd, _loop_bwd)
