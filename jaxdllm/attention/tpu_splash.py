"""TPU attention: JAX's splash attention (Pallas Mosaic, `jax.experimental.pallas.ops.tpu.
splash_attention`) behind `attend`, for every `MaskSpec` kind.

Which case goes where (one function, `splash_attention`, decides per call at trace time):

* **Static structure** (the kind, `block_size`, and `q_offset` / `prefix_len` known when tracing):
  a splash `NumpyMask` built from the `MaskSpec` rule. Splash derives its block-sparse metadata
  from it once per shape, skips empty blocks and loads the mask only for partial blocks; the
  kernel does no integer division of its own (block rules are evaluated here, in numpy).
* **Segment ids** (`[B, L]`, padding and packing): splash `SegmentIds`, per example.
* **A traced `q_offset` or a per-row `prefix_len`** (a sampler step over a cache, Jacobi
  Forcing rows with different prompt lengths): a *dynamic* splash mask, `[B or 1, Lq, Lk]`
  computed inside the jit from the rule. It skips empty blocks too, but its block metadata is
  recomputed every call.
* **Query blocks shorter than `MIN_QUERY_BLOCK` (128)**, i.e. a decoding step of a 16-64 token
  block over a cache: the XLA path (`xla_attention`). Its dense mask is only `Lq x Lk`, while
  splash would pad the queries to a 128-row tile. These rules were chosen from the kernel's
  constraints, not measured on a TPU (no TPU was available); `sampling/benchmarks/benchmark_attention.py`
  is the script to measure them with.

Lengths that are not multiples of 128 are padded (padded keys are invisible, padded query rows
dropped). Splash does not zero rows with no visible key (it averages the values, or returns
NaN for a block row with nothing to visit), so those rows are set to zero afterwards, as every
other implementation does; their gradients are zero too. GQA is native (`H % Hkv == 0`).
Forward and backward are splash's own kernels (`jax.custom_vjp`).

Sharded: when a mesh is set (`jax.set_mesh`, as the trainer does) the kernel runs under
`jax.shard_map` with the batch over the mesh's `batch` axes (`data`, `fsdp`) and the heads over
`tensor` (replicated where they do not divide), one kernel built per shard.
On CPU the kernel runs in the Pallas interpreter (`interpret=True`), which is how the tests
check it against the dense reference.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash_kernel
from jax.sharding import PartitionSpec

from jaxdllm import sharding as shd
from jaxdllm.attention.mask import _PER_ROW_PREFIX, MaskSpec
from jaxdllm.attention.platform import target_platform
from jaxdllm.attention.reference import reference_attention_lse, xla_attention

MIN_QUERY_BLOCK = 128   # shorter query blocks go to XLA
_LANES = 128            # splash tiles keys (and its backward, queries) in multiples of 128


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _static_int(x) -> int | None:
    """`x` as a Python int when it is known at trace time (not a tracer, a scalar), else None."""
    if isinstance(x, jax.core.Tracer) or np.ndim(x) != 0:
        return None
    return int(x)


def _block(length: int) -> int:
    """The largest of 512, 256, 128 dividing `length` (a multiple of 128)."""
    return next(b for b in (512, 256, 128) if length % b == 0)


def _rule(mask: MaskSpec, q_idx: jax.Array, k_idx: jax.Array, q_len: int, kv_len: int) -> jax.Array:
    """Visibility over padded query rows `q_idx` and key indices `k_idx` (traced offsets allowed):
    the `MaskSpec` rule on real keys; padded query rows see every real key (their output is
    dropped, this keeps them finite)."""
    visible = mask.visible_at(q_idx + mask.q_offset, k_idx, kv_len)
    return (k_idx < kv_len) & jnp.where(q_idx < q_len, visible, True)


@functools.lru_cache(maxsize=64)
def _static_mask(kind: str, block_size: int | None, window_shape, q_offset: int, prefix_len: int, q_len: int,
                 kv_len: int, q_pad: int, kv_pad: int, window: int | None = None,
                 tree: tuple[int, ...] | None = None) -> np.ndarray:
    """The padded `[q_pad, kv_pad]` numpy mask of a static structure (cached per shape)."""
    spec = MaskSpec(kind=kind, block_size=block_size, q_offset=q_offset, prefix_len=prefix_len,
                    window_shape=window_shape, window=window, tree=tree)
    q_idx = np.arange(q_pad, dtype=np.int64)[:, None]
    k_idx = np.arange(kv_pad, dtype=np.int64)[None, :]
    if kind == "bidirectional" and window is None:
        visible = np.broadcast_to(k_idx < kv_len, (q_pad, kv_pad))
    else:  # evaluated now even when called while tracing (the tree rule's selects are jnp ops)
        with jax.ensure_compile_time_eval():
            visible = np.asarray(spec.visible_at(q_idx + q_offset, k_idx, kv_len)) & (k_idx < kv_len)
    return np.where(q_idx < q_len, visible, k_idx < kv_len)


def _with_static_flag(kernel):
    """jax 0.10.2's `make_splash_mha` turns a dynamic mask's `is_dynamic_mask=True` into an array
    under jit, which its own `__call__` then branches on; set it back to the Python bool."""
    fix = lambda info: None if info is None else info._replace(is_dynamic_mask=True)
    return splash_kernel.SplashAttentionKernel(fix(kernel.fwd_mask_info), fix(kernel.dq_mask_info),
                                               fix(kernel.dkv_mask_info), **kernel.kwargs)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What one call needs, fixed at trace time."""

    q_len: int
    kv_len: int
    q_pad: int
    kv_pad: int
    heads: int
    interpret: bool
    static_mask: np.ndarray | None      # None: a dynamic mask
    per_row_mask: bool                  # the dynamic mask differs per example

    def block_sizes(self):
        bq, bk = _block(self.q_pad), _block(self.kv_pad)
        return splash.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq, block_kv_dkv=bk,
                                 block_kv_dkv_compute=bk, block_q_dq=bq, block_kv_dq=bk)

    def kernel(self, heads: int, dynamic_mask: jax.Array | None = None, save_residuals: bool = False):
        """A single-device splash kernel over `heads` query heads (with `save_residuals`, it also returns
        the rows' logsumexp, forward only)."""
        if self.static_mask is not None:
            mask = splash.MultiHeadMask([splash.NumpyMask(self.static_mask)] * heads)
            return splash.make_splash_mha_single_device(mask, block_sizes=self.block_sizes(),
                                                        interpret=self.interpret, save_residuals=save_residuals)
        mask = jnp.broadcast_to(dynamic_mask, (heads, self.q_pad, self.kv_pad))
        return _with_static_flag(splash.make_splash_mha_single_device(mask, block_sizes=self.block_sizes(),
                                                                       interpret=self.interpret,
                                                                       save_residuals=save_residuals))


def _dynamic_masks(mask: MaskSpec, plan: _Plan) -> jax.Array:
    """`[B or 1, q_pad, kv_pad]` bool from a traced `q_offset` / per-row `prefix_len`."""
    q_idx = jnp.arange(plan.q_pad, dtype=jnp.int32)[:, None]
    k_idx = jnp.arange(plan.kv_pad, dtype=jnp.int32)[None, :]
    if jnp.ndim(mask.prefix_len) == 1:
        per_row = mask.replace(prefix_len=jnp.asarray(mask.prefix_len, jnp.int32)[:, None, None],
                               q_offset=jnp.asarray(mask.q_offset, jnp.int32))
        return _rule(per_row, q_idx[None], k_idx[None], plan.q_len, plan.kv_len)
    return _rule(mask.replace(q_offset=jnp.asarray(mask.q_offset, jnp.int32)), q_idx, k_idx,
                 plan.q_len, plan.kv_len)[None]


def _pad_to(x: jax.Array, length: int, axis: int, value=0) -> jax.Array:
    extra = length - x.shape[axis]
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def _local_attention(plan: _Plan, q, k, v, q_seg, kv_seg, dyn, with_lse: bool = False):
    """Splash over local blocks: q `[b, H, q_pad, D]`, k/v `[b, Hkv, kv_pad, D]`, segment ids
    `[b, q_pad]` / `[b, kv_pad]` (or None), dynamic masks `[b or 1, q_pad, kv_pad]` (or None). With
    `with_lse`: `(out, logsumexp [b, H, q_pad])`."""
    heads = q.shape[1]

    def one(q, k, v, q_seg, kv_seg, dyn):
        kernel = plan.kernel(heads, dyn, save_residuals=with_lse)
        seg = None if q_seg is None else splash.SegmentIds(q=q_seg, kv=kv_seg)
        out = kernel(q, k, v, segment_ids=seg)
        return (out[0], out[1][0]) if with_lse else out

    seg_axis = None if q_seg is None else 0
    dyn_axis = 0 if plan.per_row_mask else None
    return jax.vmap(one, in_axes=(0, 0, 0, seg_axis, seg_axis, dyn_axis))(q, k, v, q_seg, kv_seg, dyn)


def _shard_specs(mesh, b: int, h: int, hkv: int):
    """`(rows, heads)` mesh axes for the batch and head dims (None where they do not divide)."""
    rows = shd.logical_to_spec(("batch",), (b,), mesh)[0]
    heads = shd.logical_to_spec(("heads",), (h,), mesh)[0]
    kv_heads = shd.logical_to_spec(("kv_heads",), (hkv,), mesh)[0]
    return rows, (heads if heads == kv_heads else None)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskSpec, *, scale: float | None = None,
                     interpret: bool | None = None, **_tuning) -> jax.Array:
    """Masked attention with JAX's splash kernel; same contract as `reference_attention`.

    Args:
      q: `[B, Lq, H, D]`; k, v: `[B, Lk, Hkv, D]` with `H % Hkv == 0`.
      mask: any `MaskSpec` (segment ids, traced `q_offset`, per-row `prefix_len` included).
      scale: score scale, default `1/sqrt(D)` (applied to q: splash does not scale).
      interpret: run the Pallas interpreter (default: when the backend is not a TPU).

    Returns:
      `[B, Lq, H, D]` in `q.dtype`; zeros for a query with no visible key. Differentiable in q,
      k, v. Query blocks shorter than `MIN_QUERY_BLOCK` are computed by `xla_attention`.
    """
    mask.check_inputs(q, k)
    if q.shape[1] < MIN_QUERY_BLOCK:
        return xla_attention(q, k, v, mask, scale=scale)
    return _splash(q, k, v, mask, scale=scale, interpret=interpret, with_lse=False)


def splash_attention_lse(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskSpec, *, scale: float | None = None,
                         interpret: bool | None = None, min_query_block: int = MIN_QUERY_BLOCK,
                         **_tuning) -> tuple[jax.Array, jax.Array]:
    """`splash_attention` and the log-sum-exp of each query's visible scores (splash's saved residuals), for
    merging partial attentions (`jaxdllm.attention.shared_view`).

    Args: as `splash_attention`; `min_query_block`: shorter query blocks take the dense path
      (`reference_attention_lse`), as `splash_attention` sends them to XLA.

    Returns:
      `(out [B, Lq, H, D] in q.dtype, lse [B, Lq, H] float32)`, `lse` in natural log of the scaled scores,
      `-inf` for a query with no visible key (its output is zeros). Forward only on the kernel: splash has
      no VJP for its residuals (the dense path is differentiable).
    """
    mask.check_inputs(q, k)
    if q.shape[1] < min_query_block:
        return reference_attention_lse(q, k, v, mask, scale=scale)
    return _splash(q, k, v, mask, scale=scale, interpret=interpret, with_lse=True)


def _splash(q, k, v, mask: MaskSpec, *, scale, interpret, with_lse: bool):
    b, lq, h, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    interpret = target_platform() != "tpu" if interpret is None else interpret
    q_off, prefix = _static_int(mask.q_offset), _static_int(mask.prefix_len)
    static = q_off is not None and (prefix is not None or mask.kind not in _PER_ROW_PREFIX)
    q_pad, kv_pad = _round_up(lq, _LANES), _round_up(lk, _LANES)
    plan = _Plan(q_len=lq, kv_len=lk, q_pad=q_pad, kv_pad=kv_pad, heads=h, interpret=interpret,
                 static_mask=(_static_mask(mask.kind, mask.block_size, mask.window_shape, q_off, prefix or 0, lq, lk,
                                           q_pad, kv_pad, mask.window, mask.tree)
                              if static else None),
                 per_row_mask=not static and jnp.ndim(mask.prefix_len) == 1)
    dyn = None if static else _dynamic_masks(mask, plan)

    scale = d ** -0.5 if scale is None else scale
    qt = _pad_to(jnp.swapaxes(q * jnp.asarray(scale, q.dtype), 1, 2), q_pad, 2)   # [B, H, q_pad, D]
    kt = _pad_to(jnp.swapaxes(k, 1, 2), kv_pad, 2)
    vt = _pad_to(jnp.swapaxes(v, 1, 2), kv_pad, 2)
    q_seg = kv_seg = None
    if mask.q_segment_ids is not None:
        q_seg = _pad_to(jnp.asarray(mask.q_segment_ids, jnp.int32), q_pad, 1)
        kv_seg = _pad_to(jnp.asarray(mask.kv_segment_ids, jnp.int32), kv_pad, 1)

    run = functools.partial(_local_attention, plan, with_lse=with_lse)
    args = (qt, kt, vt, q_seg, kv_seg, dyn)
    mesh = jax.sharding.get_abstract_mesh()
    explicit = False
    if not mesh.empty and mesh.size > 1:
        rows, heads = _shard_specs(mesh, b, h, hkv)
        qkv = PartitionSpec(rows, heads, None, None)
        seg = None if q_seg is None else PartitionSpec(rows, None)
        dyn_spec = None if dyn is None else PartitionSpec(rows if plan.per_row_mask else None, None, None)
        in_specs = (qkv, qkv, qkv, seg, seg, dyn_spec)
        explicit = shd.explicit_context() is not None
        if explicit:  # Explicit axes type every array's sharding: shard_map wants exactly its in_specs
            args = tuple(None if x is None else jax.reshard(x, spec) for x, spec in zip(args, in_specs))
        out_specs = (qkv, PartitionSpec(rows, heads, None)) if with_lse else qkv
        run = jax.shard_map(run, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    out = run(*args)
    out, lse = out if with_lse else (out, None)
    out = out[:, :, :lq]
    out = jnp.swapaxes(out, 1, 2)                                                  # [B, Lq, H, D]
    if explicit:  # back to the caller's sharding of q
        out = jax.reshard(out, jax.typeof(q).sharding.spec)
    if mask.q_segment_ids is not None or not static:  # rows that may see no key at all
        any_visible = mask.dense(lq, lk).any(-1)                                   # [B or 1, Lq]
    else:  # a structural mask: queries past the keys, or past a tree with no prefix before it
        any_visible = plan.static_mask[:lq, :lk].any(-1)[None]
    if not (isinstance(any_visible, np.ndarray) and any_visible.all()):
        out = jnp.where(any_visible[:, :, None, None], out, 0)
    if not with_lse:
        return out.astype(q.dtype)
    lse = jnp.swapaxes(lse[:, :, :lq].astype(jnp.float32), 1, 2)                  # [B, Lq, H]
    if explicit:
        lse = jax.reshard(lse, PartitionSpec(*(tuple(jax.typeof(q).sharding.spec) + (None,) * 3)[:3]))
    return out.astype(q.dtype), jnp.where(any_visible[:, :, None], lse, -jnp.inf)
