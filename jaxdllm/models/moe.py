"""Routed experts (LLaDA2 / Ling MoE layers): a sigmoid router with group-limited top-k, grouped
matmuls over the experts (`jax.lax.ragged_dot`), and always-on shared experts.

Routing, per token (LLaDA2's `LLaDA2MoeGate`; the settings are `ModelConfig.experts`, an `ExpertConfig`):
  scores = sigmoid(x W) in float32; selection uses scores + `expert_bias`; experts are split into
  `expert_groups` contiguous groups, a group scores the sum of its two best biased scores, the
  `top_groups` best groups stay, and the `experts_per_token` best experts among them are chosen.
  The weights are the chosen experts' *unbiased* scores, normalised to sum 1 (when k > 1), times
  `routed_scaling`. Ties go to the lower expert (or group) index (`jax.lax.top_k`).
`expert_bias` only moves the selection (aux-loss-free balancing): it gets no gradient, and the
trainer nudges it towards balanced loads (`jaxdllm.train.expert_balance`).

Dispatch (`grouped_swiglu`): on TPU and GPU the (token, expert) pairs are sorted by expert, each
expert's SwiGLU runs on its contiguous rows with one `ragged_dot` per projection (XLA's native
ragged dot), and the outputs return to their tokens weighted by the routing weights. On a CPU
(XLA's CPU ragged dot is a slow emulation) the sorted pairs are padded per expert to whole row
tiles and a loop runs one tile at a time through its expert's three projections (`tiles`): the
experts cost their active share, each used expert's weights read once per tile of its rows.
At small shapes, and where the expert kernels are spread over a mesh of CPU devices, every expert
runs on every token and the routing weights mix the outputs (`dense`: as cheap as the loop there,
and XLA partitions it without gathering a kernel; `cpu_impl`).
`RunOptions.moe_impl="pallas"` runs the sorted pairs through the grouped matmul kernel of
`jaxdllm.models.grouped_matmul` instead (NVIDIA GPUs, one device).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxdllm.attention.platform import target_platform
from jaxdllm.models import quantize
from jaxdllm.models.config import ExpertConfig, ModelConfig
from jaxdllm.models.layers import MLP, _init
from jaxdllm.models.run_options import RunOptions


class ExpertKernel(nnx.Module):
    """One projection of every routed expert: `kernel [E, in, out]` (logical `expert, ...`), int8
    with one scale per expert and output channel (`kernel_scale [E, 1, out]`) when quantized."""

    def __init__(self, shape: tuple[int, int, int], axes: tuple[str | None, ...], *, options: RunOptions,
                 rngs: nnx.Rngs):
        kernel = _init(rngs.params(), shape, options.jnp_param_dtype)
        self.kernel_scale = nnx.data(None)
        if options.quantization == "int8":
            kernel, scale = quantize.quantize_kernel(kernel, (shape[0], 1, shape[2]))
            self.kernel_scale = nnx.Param(scale, logical_axes=(axes[0], None, axes[2]))
        self.kernel = nnx.Param(kernel, logical_axes=axes)

    def value(self, dtype) -> jax.Array:
        """The kernel in `dtype` (dequantized when int8)."""
        if self.kernel_scale is None:
            return self.kernel[...].astype(dtype)
        return quantize.dequantize(self.kernel[...], self.kernel_scale[...], dtype)


def route(x: jax.Array, router: jax.Array, expert_bias: jax.Array, experts: ExpertConfig):
    """Group-limited top-k routing.

    Args:
      x: `[T, D]` token activations.
      router: `[D, E]` router weights; expert_bias: `[E]` selection bias.
      experts: the routing settings (`ModelConfig.experts`).

    Returns:
      `(experts [T, k] int32, weights [T, k] float32)`: each token's chosen experts (best first)
      and their routing weights.
    """
    c = experts
    scores = jax.nn.sigmoid(jnp.dot(x.astype(jnp.float32), router.astype(jnp.float32)))  # [T, E]
    biased = scores + jax.lax.stop_gradient(expert_bias.astype(jnp.float32))
    if c.expert_groups > 1:
        t, per_group = x.shape[0], c.num_experts // c.expert_groups
        group_score = jax.lax.top_k(biased.reshape(t, c.expert_groups, per_group), 2)[0].sum(-1)  # [T, G]
        kept = jax.lax.top_k(group_score, c.top_groups)[1]  # [T, top_groups]
        kept_group = jnp.any(kept[..., None] == jnp.arange(c.expert_groups), axis=-2)  # [T, G]
        biased = jnp.where(jnp.repeat(kept_group, per_group, axis=-1), biased, -jnp.inf)
    experts = jax.lax.top_k(biased, c.experts_per_token)[1]
    weights = jnp.take_along_axis(scores, experts, axis=-1)
    if c.experts_per_token > 1:
        weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    return experts.astype(jnp.int32), weights * c.routed_scaling


class MoE(nnx.Module):
    """Routed SwiGLU experts plus shared experts: `x [B, L, D] -> ([B, L, D], load [E])`, where
    `load` counts the (token, expert) assignments of each expert in this call."""

    def __init__(self, config: ModelConfig, options: RunOptions, *, rngs: nnx.Rngs):
        c = self.config = config
        self.dtype = options.jnp_dtype  # kept in step with the model's options (`with_options`)
        self.moe_impl = options.moe_impl  # likewise
        d, e, m = c.embed_dim, c.experts.num_experts, c.experts.expert_dim
        self.router = nnx.Param(_init(rngs.params(), (d, e), options.jnp_param_dtype), logical_axes=("embed", None))
        self.expert_bias = nnx.Param(jnp.zeros((e,), jnp.float32), logical_axes=(None,))
        self.gate = ExpertKernel((e, d, m), ("expert", None, "mlp"), options=options, rngs=rngs)
        self.up = ExpertKernel((e, d, m), ("expert", None, "mlp"), options=options, rngs=rngs)
        self.down = ExpertKernel((e, m, d), ("expert", "mlp", None), options=options, rngs=rngs)
        shared = c.experts.num_shared_experts
        self.shared = MLP(c, options, width=m * shared, rngs=rngs) if shared else None

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        c = self.config
        b, l, d = x.shape
        flat = x.reshape(b * l, d)
        experts, weights = route(flat, self.router[...], self.expert_bias[...], c.experts)
        dt = self.dtype
        routed, load = grouped_swiglu(flat.astype(dt), experts, weights, self.gate.value(dt),
                                      self.up.value(dt), self.down.value(dt), impl=self.moe_impl)
        y = routed.reshape(b, l, d).astype(x.dtype)
        if self.shared is not None:
            y = y + self.shared(x)
        return y, load


def grouped_swiglu(x: jax.Array, experts: jax.Array, weights: jax.Array, gate: jax.Array, up: jax.Array,
                   down: jax.Array, activation=jax.nn.silu, impl: str = "auto") -> tuple[jax.Array, jax.Array]:
    """`sum_j weights[t, j] * glu_{experts[t, j]}(x[t])`; the gated unit is
    `down(activation(gate x) * up x)` (SwiGLU by default).

    `impl` (`RunOptions.moe_impl`): `auto` is `ragged_dot` on TPU and GPU and, on a CPU, where
    XLA's ragged dot is a slow emulation (tens of times a plain matmul over the same rows, and slow
    to compile), `tiles`, or `dense` for small shapes or kernels spread over a mesh (`cpu_impl`).
    `ragged_dot`: one `jax.lax.ragged_dot` per projection over the (token, expert) pairs sorted by
    expert. `tiles`: the same sorted pairs padded per expert to whole row tiles
    (`grouped_matmul.tile_layout`, room for every pair: none is dropped), a `while_loop` over the
    tiles that hold rows, each through its expert's SwiGLU (`grouped_matmul.tile_loop`).
    `dense`: every expert on every token, the outputs mixed with the routing weights (zero for the
    experts a token did not pick), the same sum at `num_experts / k` times the arithmetic.
    `pallas`: the same sorted pairs through `jaxdllm.models.grouped_matmul` (padded to row tiles
    once for the three projections; Triton on a GPU, interpreted elsewhere); `ragged_dot` where the
    widths are not multiples of 16.

    Args:
      x: `[T, D]`; experts, weights: `[T, k]`; gate, up: `[E, D, M]`; down: `[E, M, D]`.

    Returns:
      `(y [T, D] float32, load [E] int32)`: the mixed expert outputs and how many rows each
      expert ran.
    """
    num_experts = gate.shape[0]
    load = jnp.bincount(experts.reshape(-1), length=num_experts).astype(jnp.int32)
    if impl == "auto":
        impl = cpu_impl(x.shape[0], gate) if target_platform() == "cpu" else "ragged_dot"
    if impl == "tiles":
        return _looped_swiglu(x, experts, weights, gate, up, down, activation, load), load
    if impl == "pallas":
        from jaxdllm.models.grouped_matmul import supported

        if supported(*gate.shape[1:]) and supported(*down.shape[1:]):
            return _pallas_swiglu(x, experts, weights, gate, up, down, activation, load), load
        impl = "ragged_dot"  # widths the kernel's tiles do not divide (not multiples of 16)
    if impl == "dense":  # in float32: XLA's CPU dots take no bf16 x bf16 -> f32 of these shapes
        f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
        mix = jnp.zeros((x.shape[0], num_experts), jnp.float32).at[jnp.arange(x.shape[0])[:, None], experts].add(
            f32(weights))
        hidden = activation(jnp.einsum("td,edm->tem", f32(x), f32(gate)))
        hidden = f32((hidden * jnp.einsum("td,edm->tem", f32(x), f32(up))).astype(x.dtype))  # rounded as on TPU
        out = jnp.einsum("tem,emd->ted", hidden, f32(down))
        return jnp.einsum("ted,te->td", out, mix), load
    t, k = experts.shape
    order = jnp.argsort(experts.reshape(-1), stable=True)  # (token, slot) pairs grouped by expert
    rows = x[order // k]
    dot = lambda a, w: jax.lax.ragged_dot(a, w, load, preferred_element_type=jnp.float32)
    hidden = (activation(dot(rows, gate)) * dot(rows, up)).astype(x.dtype)
    out = dot(hidden, down)  # [T*k, D] in expert order
    out = jnp.zeros_like(out).at[order].set(out).reshape(t, k, -1)
    return jnp.einsum("tkd,tk->td", out, weights.astype(jnp.float32)), load


# Below this many multiply-adds of one projection run densely (tokens x experts x in x out), every
# expert on every token costs no more than the loop over tiles does (on 2 CPU cores: tiny-llada2's
# experts at 32 tokens 140 us a layer either way, at 128 tokens 600 us dense against 385 us in
# tiles; DiffusionGemma's `small` benchmark shape at 8 tokens 4.4 ms against 0.3 ms).
DENSE_BELOW = 1 << 22


def cpu_impl(tokens: int, kernel: jax.Array) -> str:
    """What `auto` runs on a CPU for `tokens` rows and a `[E, D, M]` expert kernel: `tiles` (each
    expert on its own rows), or `dense` where that is as cheap (`DENSE_BELOW`) or where the
    kernels are spread over a mesh (XLA partitions the dense mix over the expert shards, moving
    tokens and never a kernel; the loop's per-tile kernel slices would gather them)."""
    e, d, m = kernel.shape
    if tokens * e * d * m < DENSE_BELOW:
        return "dense"
    meshes = [jax.sharding.get_abstract_mesh()]
    try:
        meshes.append(jax.typeof(kernel).sharding.mesh)
    except AttributeError:  # no sharding on the abstract value
        pass
    return "dense" if any(not mesh.empty and mesh.size > 1 for mesh in meshes) else "tiles"


def _swiglu_tile(rows, gate, up, down, *, activation, dtype):
    """One row tile through one expert's SwiGLU, in float32 (XLA's CPU dots take no bf16 x bf16 ->
    f32), the hidden units rounded to `dtype` as the other paths round them."""
    f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
    rows = f32(rows)
    hidden = f32((activation(rows @ f32(gate)) * (rows @ f32(up))).astype(dtype))
    return hidden @ f32(down)


def _looped_swiglu(x, experts, weights, gate, up, down, activation, load):
    """`grouped_swiglu` as a loop over row tiles (`jaxdllm.models.grouped_matmul.tile_loop`): the
    (token, expert) pairs sorted by expert, each expert's rows padded to whole tiles, one tile at a
    time through its expert's three projections, the outputs back to their tokens. No pair is
    dropped: the layout has room for every pair whatever the routing."""
    from jaxdllm.models import grouped_matmul as gm

    t, k = experts.shape
    order = jnp.argsort(experts.reshape(-1), stable=True)  # (token, slot) pairs grouped by expert
    layout = gm.tile_layout(load, t * k, gm.loop_tile(t * k, gate.shape[0]))
    rows = gm.to_tiles(x[order // k], layout)
    tile_fn = functools.partial(_swiglu_tile, activation=activation, dtype=x.dtype)
    out = gm.from_tiles(gm.tile_loop(tile_fn, rows, (gate, up, down), layout), layout)  # [T*k, D] in expert order
    out = jnp.zeros_like(out).at[order].set(out).reshape(t, k, -1)
    return jnp.einsum("tkd,tk->td", out, weights.astype(jnp.float32))


def _pallas_swiglu(x, experts, weights, gate, up, down, activation, load):
    """`grouped_swiglu` through the grouped matmul kernel: the sorted (token, expert) rows padded to
    row tiles once, the three projections in that layout, the outputs back to their tokens."""
    from jaxdllm.models import grouped_matmul as gm

    t, k = experts.shape
    order = jnp.argsort(experts.reshape(-1), stable=True)
    layout = gm.tile_layout(load, t * k)
    interpret = target_platform() != "gpu"
    rows = gm.to_tiles(x[order // k], layout)
    dot = lambda a, w: gm.tiled_matmul(a, w, layout, interpret)  # noqa: E731
    hidden = (activation(dot(rows, gate)) * dot(rows, up)).astype(x.dtype)
    out = gm.from_tiles(dot(hidden, down), layout)  # [T*k, D] in expert order
    out = jnp.zeros_like(out).at[order].set(out).reshape(t, k, -1)
    return jnp.einsum("tkd,tk->td", out, weights.astype(jnp.float32))
