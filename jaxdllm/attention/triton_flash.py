"""Tile-skipping flash attention in Pallas on Triton (NVIDIA GPUs; any backend with `interpret=True`).

Forward: one program per (row, head, query tile) walks that tile's schedule (`tiles.py`):
full key tiles first with no mask arithmetic, then partial tiles with the mask rule evaluated
on the tile's indices; empty tiles are never loaded. Online softmax in base 2 with float32
accumulation; inputs may be bf16.

Backward (`jax.custom_vjp`): FlashAttention-2 style, two kernels with the same skipping: dq per
query tile over its key tiles, and dk/dv per key tile over its query tiles (the transposed
schedule). dk/dv are produced per query head and summed over each GQA group afterwards.

Rows with no visible key: output 0, log-sum-exp +inf, and zero gradients (same rule as the
reference paths). Masked scores are -inf while the running max starts at a finite floor, so
neither a fully masked tile nor a fully masked row ever forms `inf - inf`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from jaxdllm import sharding as shd
from jaxdllm.attention import tiles
from jaxdllm.attention.mask import MaskSpec
from jaxdllm.attention.platform import target_platform
from jaxdllm.errors import ConfigError

LOG2E = math.log2(math.e)
_MAX_FLOOR = -0.7 * float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes (powers of two) and Triton launch settings.

    `block_q`/`block_k` tile the forward pass, `block_q_bwd`/`block_k_bwd` both backward
    kernels. `num_warps=None` picks 4 for tiles up to 64x64 and 8 above.
    """

    block_q: int = 128
    block_k: int = 128
    block_q_bwd: int = 64
    block_k_bwd: int = 64
    num_warps: int | None = None
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_q", "block_k", "block_q_bwd", "block_k_bwd"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ConfigError(f"BlockSizes.{name} must be a power of two, got {value}")

    def warps(self, bq: int, bk: int) -> int:
        return self.num_warps or (4 if bq * bk <= 64 * 64 else 8)

    @classmethod
    def for_mask(cls, mask: MaskSpec, dtype=jnp.bfloat16) -> "BlockSizes":
        """Defaults, with forward tiles no larger than the mask's blocks when those are >= 64.

        float32 inputs use 64x64 forward tiles: 128x128 float32 K/V tiles with two pipeline
        stages need 256 KiB of shared memory, over the H100's 227 KiB.

        Tiles that straddle a block boundary are partial; Jacobi-Forcing's interleaved
        noisy/clean streams make 40% of 128-tiles partial at block 64 but 2% of 64-tiles
        (H100 measurements in `sampling/results/`). Below 64 the tensor-core tiles would get
        too small, so finer masks keep the defaults and pay for partial tiles.
        """
        blocks = cls()
        if jnp.dtype(dtype).itemsize > 2:
            blocks = dataclasses.replace(blocks, block_q=64, block_k=64)
        if mask.block_size and 64 <= mask.block_size < blocks.block_q:
            tile = 1 << (mask.block_size.bit_length() - 1)
            blocks = dataclasses.replace(blocks, block_q=tile, block_k=tile)
        return blocks


@dataclasses.dataclass(frozen=True)
class _Static:
    """Everything the kernels specialise on (hashable)."""

    kind: str
    block_size: int | None
    window_shape: tuple[int, int, int] | None
    window: int | None
    tree: tuple[int, ...] | None
    scale: float
    q_len: int          # true lengths; arrays are padded to tile multiples
    kv_len: int
    groups: int         # query heads per kv head
    has_segments: bool
    per_row_schedule: bool
    blocks: BlockSizes
    interpret: bool


# --------------------------------------------------------------------------------- kernels --
def _tile_visible(st: _Static, params_ref, q_start, k_start, bq, bk, q_seg, k_seg):
    """`[bq, bk]` bool: the mask rule on one tile's physical indices, plus padding/segments."""
    q_local = q_start + jnp.arange(bq, dtype=jnp.int32)[:, None]
    k_idx = k_start + jnp.arange(bk, dtype=jnp.int32)[None, :]
    spec = MaskSpec(kind=st.kind, block_size=st.block_size, q_offset=params_ref[0], prefix_len=params_ref[1],
                    window_shape=st.window_shape, window=st.window, tree=st.tree)
    visible = spec.visible_at(q_local + params_ref[0], k_idx, st.kv_len)
    visible = visible & (q_local < st.q_len) & (k_idx < st.kv_len)
    if q_seg is not None:
        visible = visible & (q_seg[:, None] == k_seg[None, :])
    return visible


def _precision(dtype):
    return lax.Precision.HIGHEST if dtype == jnp.float32 else None


def _dot(a, b, *, trans_a: bool = False, trans_b: bool = False):
    """2-D matmul with float32 accumulation (`pl.dot` is gone from newer JAX)."""
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    return lax.dot_general(a, b, dims, precision=_precision(a.dtype), preferred_element_type=jnp.float32)


def _scores(st: _Static, q, k):
    """`[bq, bk]` float32 scores in base 2 (scaled by log2 e for exp2)."""
    return _dot(q, k, trans_b=True) * (st.scale * LOG2E)


def _key_tile(st: _Static, params_ref, k_ref, v_ref, kseg_ref, j, q, q_start, q_seg, bq, bk, masked: bool):
    """Key tile `j`: its keys, values and base-2 scores against `q` (-inf where masked)."""
    keys = pl.ds(j * bk, bk)
    k, v = k_ref[keys, :], v_ref[keys, :]
    s = _scores(st, q, k)
    if masked:
        k_seg = None if kseg_ref is None else kseg_ref[keys]
        s = jnp.where(_tile_visible(st, params_ref, q_start, j * bk, bq, bk, q_seg, k_seg), s, -jnp.inf)
    return k, v, s


def _visit(order_ref, counts_ref, step, carry):
    """Run `step(tile, carry, masked)` over the full tiles, then the partial ones."""
    n_full, n_partial = counts_ref[0], counts_ref[1]
    carry = lax.fori_loop(0, n_full, lambda t, c: step(order_ref[t], c, False), carry)
    return lax.fori_loop(n_full, n_full + n_partial, lambda t, c: step(order_ref[t], c, True), carry)


def _split_segments(st: _Static, rest):
    if st.has_segments:
        return rest[0], rest[1], rest[2:]
    return None, None, rest


def _forward_kernel(order_ref, counts_ref, params_ref, q_ref, k_ref, v_ref, *rest, st: _Static):
    qseg_ref, kseg_ref, (o_ref, lse_ref) = _split_segments(st, rest)
    bq, bk = st.blocks.block_q, st.blocks.block_k
    q_start = pl.program_id(2) * bq
    q = q_ref[...]
    q_seg = None if qseg_ref is None else qseg_ref[...]

    def step(j, carry, masked):
        acc, m, l = carry
        k, v, s = _key_tile(st, params_ref, k_ref, v_ref, kseg_ref, j, q, q_start, q_seg, bq, bk, masked)
        m_new = jnp.maximum(m, s.max(axis=-1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s - m_new[:, None])
        acc = alpha[:, None] * acc + _dot(p.astype(v.dtype), v)
        return acc, m_new, alpha * l + p.sum(axis=-1)

    init = (jnp.zeros(q.shape, jnp.float32), jnp.full((bq,), _MAX_FLOOR, jnp.float32),
            jnp.zeros((bq,), jnp.float32))
    acc, m, l = _visit(order_ref, counts_ref, step, init)
    empty = l == 0.0
    o_ref[...] = (acc / jnp.where(empty, 1.0, l)[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log2(jnp.where(empty, 1.0, l)))


def _dq_kernel(order_ref, counts_ref, params_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
               *rest, st: _Static):
    qseg_ref, kseg_ref, (dq_ref,) = _split_segments(st, rest)
    bq, bk = st.blocks.block_q_bwd, st.blocks.block_k_bwd
    q_start = pl.program_id(2) * bq
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    q_seg = None if qseg_ref is None else qseg_ref[...]

    def step(j, dq, masked):
        k, v, s = _key_tile(st, params_ref, k_ref, v_ref, kseg_ref, j, q, q_start, q_seg, bq, bk, masked)
        p = jnp.exp2(s - lse[:, None])
        dp = _dot(do, v, trans_b=True)
        ds = p * (dp - delta[:, None])
        return dq + _dot(ds.astype(k.dtype), k)

    dq = _visit(order_ref, counts_ref, step, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * st.scale).astype(dq_ref.dtype)


def _dkv_kernel(order_ref, counts_ref, params_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
                *rest, st: _Static):
    qseg_ref, kseg_ref, (dk_ref, dv_ref) = _split_segments(st, rest)
    bq, bk = st.blocks.block_q_bwd, st.blocks.block_k_bwd
    k_start = pl.program_id(2) * bk
    k, v = k_ref[...], v_ref[...]
    k_seg = None if kseg_ref is None else kseg_ref[...]

    def step(i, carry, masked):
        dk, dv = carry
        rows = pl.ds(i * bq, bq)
        q, do, lse, delta = q_ref[rows, :], do_ref[rows, :], lse_ref[rows], delta_ref[rows]
        s = _scores(st, q, k)
        if masked:
            q_seg = None if qseg_ref is None else qseg_ref[rows]
            s = jnp.where(_tile_visible(st, params_ref, i * bq, k_start, bq, bk, q_seg, k_seg), s, -jnp.inf)
        p = jnp.exp2(s - lse[:, None])
        dv = dv + _dot(p.astype(do.dtype), do, trans_a=True)
        dp = _dot(do, v, trans_b=True)
        ds = p * (dp - delta[:, None])
        dk = dk + _dot(ds.astype(q.dtype), q, trans_a=True)
        return dk, dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = _visit(order_ref, counts_ref, step, (zeros, zeros))
    dk_ref[...] = dk * st.scale
    dv_ref[...] = dv


# -------------------------------------------------------------------------------- launches --
def _compiler_params(st: _Static, bq: int, bk: int):
    if st.interpret:
        return None
    from jax.experimental.pallas import triton as plgpu
    return plgpu.CompilerParams(num_warps=st.blocks.warps(bq, bk), num_stages=st.blocks.num_stages)


def _row(st: _Static):
    """Index of a row's schedule: its own when the mask differs per row, else the shared one."""
    return (lambda b: b) if st.per_row_schedule else (lambda b: 0)


def _schedule_specs(st: _Static, n_inner: int):
    row = _row(st)
    return [pl.BlockSpec((None, None, n_inner), lambda b, h, i: (row(b), i, 0)),
            pl.BlockSpec((None, None, 2), lambda b, h, i: (row(b), i, 0)),
            pl.BlockSpec((None, 2), lambda b, h, i: (b, 0))]


def _forward(q, k, v, aux, st: _Static):
    b, lq, h, d = q.shape
    lk = k.shape[1]
    bq, bk = st.blocks.block_q, st.blocks.block_k
    g = st.groups
    sched = aux["fwd"]
    in_specs = _schedule_specs(st, sched.order.shape[-1]) + [
        pl.BlockSpec((None, bq, None, d), lambda b_, h_, i: (b_, i, h_, 0)),
        pl.BlockSpec((None, lk, None, d), lambda b_, h_, i: (b_, 0, h_ // g, 0)),
        pl.BlockSpec((None, lk, None, d), lambda b_, h_, i: (b_, 0, h_ // g, 0)),
    ]
    args = [sched.order, sched.counts, aux["params"], q, k, v]
    if st.has_segments:
        in_specs += [pl.BlockSpec((None, bq), lambda b_, h_, i: (b_, i)),
                     pl.BlockSpec((None, lk), lambda b_, h_, i: (b_, 0))]
        args += [aux["q_seg"], aux["kv_seg"]]
    return pl.pallas_call(
        functools.partial(_forward_kernel, st=st),
        grid=(b, h, lq // bq),
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, bq, None, d), lambda b_, h_, i: (b_, i, h_, 0)),
                   pl.BlockSpec((None, None, bq), lambda b_, h_, i: (b_, h_, i))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((b, h, lq), jnp.float32)],
        compiler_params=_compiler_params(st, bq, bk),
        interpret=st.interpret,
        name="jaxdllm_flash_forward",
    )(*args)


def _backward(q, k, v, o, lse, do, aux, st: _Static, dlse=None):
    b, lq, h, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    bq, bk = st.blocks.block_q_bwd, st.blocks.block_k_bwd
    g = st.groups
    delta = jnp.einsum("bqhd,bqhd->bhq", o.astype(jnp.float32), do.astype(jnp.float32))
    if dlse is not None:  # d lse2 / d s_j = log2(e) p_j: the kernels' ds = p (dp - delta) takes it in delta
        delta = delta - LOG2E * dlse.astype(jnp.float32)
    seg_args = [aux["q_seg"], aux["kv_seg"]] if st.has_segments else []
    common = dict(interpret=st.interpret, compiler_params=_compiler_params(st, bq, bk))

    dq_sched = aux["dq"]
    dq_specs = _schedule_specs(st, dq_sched.order.shape[-1]) + [
        pl.BlockSpec((None, bq, None, d), lambda b_, h_, i: (b_, i, h_, 0)),
        pl.BlockSpec((None, lk, None, d), lambda b_, h_, i: (b_, 0, h_ // g, 0)),
        pl.BlockSpec((None, lk, None, d), lambda b_, h_, i: (b_, 0, h_ // g, 0)),
        pl.BlockSpec((None, bq, None, d), lambda b_, h_, i: (b_, i, h_, 0)),
        pl.BlockSpec((None, None, bq), lambda b_, h_, i: (b_, h_, i)),
        pl.BlockSpec((None, None, bq), lambda b_, h_, i: (b_, h_, i)),
    ]
    if st.has_segments:
        dq_specs += [pl.BlockSpec((None, bq), lambda b_, h_, i: (b_, i)),
                     pl.BlockSpec((None, lk), lambda b_, h_, i: (b_, 0))]
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, st=st),
        grid=(b, h, lq // bq), in_specs=dq_specs,
        out_specs=pl.BlockSpec((None, bq, None, d), lambda b_, h_, i: (b_, i, h_, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), name="jaxdllm_flash_dq", **common,
    )(dq_sched.order, dq_sched.counts, aux["params"], q, k, v, do, lse, delta, *seg_args)

    kv_sched = aux["dkv"]
    dkv_specs = _schedule_specs(st, kv_sched.order.shape[-1]) + [
        pl.BlockSpec((None, lq, None, d), lambda b_, h_, j: (b_, 0, h_, 0)),
        pl.BlockSpec((None, bk, None, d), lambda b_, h_, j: (b_, j, h_ // g, 0)),
        pl.BlockSpec((None, bk, None, d), lambda b_, h_, j: (b_, j, h_ // g, 0)),
        pl.BlockSpec((None, lq, None, d), lambda b_, h_, j: (b_, 0, h_, 0)),
        pl.BlockSpec((None, None, lq), lambda b_, h_, j: (b_, h_, 0)),
        pl.BlockSpec((None, None, lq), lambda b_, h_, j: (b_, h_, 0)),
    ]
    if st.has_segments:
        dkv_specs += [pl.BlockSpec((None, lq), lambda b_, h_, j: (b_, 0)),
                      pl.BlockSpec((None, bk), lambda b_, h_, j: (b_, j))]
    per_head = jax.ShapeDtypeStruct((b, lk, h, d), jnp.float32)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, st=st),
        grid=(b, h, lk // bk), in_specs=dkv_specs,
        out_specs=[pl.BlockSpec((None, bk, None, d), lambda b_, h_, j: (b_, j, h_, 0))] * 2,
        out_shape=[per_head, per_head], name="jaxdllm_flash_dkv", **common,
    )(kv_sched.order, kv_sched.counts, aux["params"], q, k, v, do, lse, delta, *seg_args)
    # dk/dv were computed per query head: sum each GQA group onto its kv head.
    dk = dk.reshape(b, lk, hkv, g, d).sum(3).astype(k.dtype)
    dv = dv.reshape(b, lk, hkv, g, d).sum(3).astype(v.dtype)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, aux, st: _Static):
    return _forward(q, k, v, aux, st)[0]


def _flash_fwd(q, k, v, aux, st: _Static):
    o, lse = _forward(q, k, v, aux, st)
    return o, (q, k, v, o, lse, aux)


def _flash_bwd(st: _Static, res, do):
    q, k, v, o, lse, aux = res
    dq, dk, dv = _backward(q, k, v, o, lse, do, aux, st)
    zero_aux = jax.tree.map(lambda x: np.zeros(x.shape, jax.dtypes.float0), aux)
    return dq, dk, dv, zero_aux


_flash.defvjp(_flash_fwd, _flash_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash_lse(q, k, v, aux, st: _Static):
    """`(o, lse)`: the output and the forward's base-2 log-sum-exp `[b, h, lq]` (+inf: no visible key)."""
    return tuple(_forward(q, k, v, aux, st))


def _flash_lse_fwd(q, k, v, aux, st: _Static):
    o, lse = _forward(q, k, v, aux, st)
    return (o, lse), (q, k, v, o, lse, aux)


def _flash_lse_bwd(st: _Static, res, cotangents):
    q, k, v, o, lse, aux = res
    do, dlse = cotangents
    dq, dk, dv = _backward(q, k, v, o, lse, do, aux, st, dlse=jnp.where(jnp.isfinite(lse), dlse, 0.0))
    zero_aux = jax.tree.map(lambda x: np.zeros(x.shape, jax.dtypes.float0), aux)
    return dq, dk, dv, zero_aux


_flash_lse.defvjp(_flash_lse_fwd, _flash_lse_bwd)


# ------------------------------------------------------------------------------ public API --
def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pad_axis1(x: jax.Array, length: int, value=0) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, length - x.shape[1])
    return jnp.pad(x, widths, constant_values=value)


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskSpec, *,
                    scale: float | None = None, block_sizes: BlockSizes | None = None,
                    interpret: bool | None = None) -> jax.Array:
    """Tile-skipping flash attention; same contract as `reference_attention`.

    Args:
      q: `[B, Lq, H, D]`; k, v: `[B, Lk, Hkv, D]` with `H % Hkv == 0`; any float dtype
        (bf16 in, float32 accumulation).
      mask: the structured mask (any kind, segment ids, traced `q_offset` / per-row
        `prefix_len` included).
      scale: score scale, default `1/sqrt(D)`.
      block_sizes: tiles and launch settings (default `BlockSizes.for_mask(mask)`); lengths
        are padded to tile multiples.
      interpret: run the Pallas interpreter (default: when the backend is the CPU).

    Returns:
      `[B, Lq, H, D]` in `q.dtype`; zeros for a query with no visible key. Differentiable
      in q, k, v through the tile-skipping backward kernels.
    """
    if shd.explicit_context() is not None:  # the kernel does not read shardings: run it with the axes in Auto mode
        body = functools.partial(flash_attention, scale=scale, block_sizes=block_sizes, interpret=interpret)
        return jax.sharding.auto_axes(body, out_sharding=jax.typeof(q).sharding.spec)(q, k, v, mask)
    (qp, kp, vp), aux, st = _prepare(q, k, v, mask, scale, block_sizes, interpret)
    return _flash(qp, kp, vp, aux, st)[:, :q.shape[1]]


def flash_attention_lse(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskSpec, *,
                        scale: float | None = None, block_sizes: BlockSizes | None = None,
                        interpret: bool | None = None) -> tuple[jax.Array, jax.Array]:
    """`flash_attention` and the log-sum-exp of each query's visible scores (for merging partial
    attentions, `jaxdllm.attention.shared_view`). Same arguments.

    Returns:
      `(out [B, Lq, H, D] in q.dtype, lse [B, Lq, H] float32)`: `lse` in natural log (the kernel's
      base-2 value divided by log2 e) of the scaled scores; `-inf` for a query with no visible key
      (its output is zeros). Differentiable in q, k, v through both outputs (the backward kernels
      take the lse cotangent in their `delta`).
    """
    if shd.explicit_context() is not None:
        body = functools.partial(flash_attention_lse, scale=scale, block_sizes=block_sizes, interpret=interpret)
        spec = jax.typeof(q).sharding.spec
        lse_spec = jax.sharding.PartitionSpec(*(tuple(spec) + (None,) * 3)[:3])
        return jax.sharding.auto_axes(body, out_sharding=(spec, lse_spec))(q, k, v, mask)
    (qp, kp, vp), aux, st = _prepare(q, k, v, mask, scale, block_sizes, interpret)
    lq = q.shape[1]
    out, lse2 = _flash_lse(qp, kp, vp, aux, st)
    lse2 = jnp.swapaxes(lse2[:, :, :lq], 1, 2)                                   # [B, Lq, H]
    lse = jnp.where(jnp.isfinite(lse2), lse2 / LOG2E, -jnp.inf)
    return out[:, :lq], lse


def _prepare(q, k, v, mask: MaskSpec, scale, block_sizes, interpret):
    """The padded `(q, k, v)`, the schedules and mask parameters (`aux`) and the static settings of one call."""
    blocks = block_sizes or BlockSizes.for_mask(mask, q.dtype)
    b, lq, h, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    mask.check_inputs(q, k)
    interpret = target_platform() == "cpu" if interpret is None else interpret
    has_seg = mask.q_segment_ids is not None
    per_row = has_seg or jnp.ndim(mask.prefix_len) == 1
    st = _Static(kind=mask.kind, block_size=mask.block_size, window_shape=mask.window_shape, window=mask.window,
                 tree=mask.tree, scale=float(d ** -0.5 if scale is None else scale), q_len=lq, kv_len=lk,
                 groups=h // hkv, has_segments=has_seg, per_row_schedule=per_row,
                 blocks=blocks, interpret=interpret)

    q_pad = _round_up(lq, max(blocks.block_q, blocks.block_q_bwd))
    k_pad = _round_up(lk, max(blocks.block_k, blocks.block_k_bwd))
    fwd_classes = tiles.tile_classes(mask, lq, lk, blocks.block_q, blocks.block_k)
    bwd_classes = tiles.tile_classes(mask, lq, lk, blocks.block_q_bwd, blocks.block_k_bwd)
    aux = {
        "fwd": _pad_schedule(tiles.schedule(fwd_classes), q_pad // blocks.block_q),
        "dq": _pad_schedule(tiles.schedule(bwd_classes), q_pad // blocks.block_q_bwd),
        "dkv": _pad_schedule(tiles.schedule(bwd_classes, transpose=True), k_pad // blocks.block_k_bwd),
        "params": jnp.stack(jnp.broadcast_arrays(
            jnp.broadcast_to(jnp.asarray(mask.q_offset, jnp.int32), (b,)),
            jnp.broadcast_to(jnp.asarray(mask.prefix_len, jnp.int32), (b,))), axis=-1),
    }
    if has_seg:
        aux["q_seg"] = _pad_axis1(jnp.asarray(mask.q_segment_ids, jnp.int32), q_pad, -1)
        aux["kv_seg"] = _pad_axis1(jnp.asarray(mask.kv_segment_ids, jnp.int32), k_pad, -2)
    return (_pad_axis1(q, q_pad), _pad_axis1(k, k_pad), _pad_axis1(v, k_pad)), aux, st


def _pad_schedule(sched: tiles.TileSchedule, n_outer: int) -> tiles.TileSchedule:
    """Extend the outer axis to the padded tile count (extra tiles visit nothing)."""
    extra = n_outer - sched.order.shape[1]
    if extra == 0:
        return sched
    order = jnp.pad(sched.order, ((0, 0), (0, extra), (0, 0)))
    counts = jnp.pad(sched.counts, ((0, 0), (0, extra), (0, 0)))
    return tiles.TileSchedule(order, counts)
