"""Building blocks shared by every jaxdllm model: projections, RMSNorm, RoPE, attention, MLP.

Every parameter is an `nnx.Param` carrying `logical_axes` (names from `jaxdllm.sharding`),
stored in JAX `[in, out]` layout with heads split out: q `[embed, heads, head_dim]`,
o `[heads, head_dim, embed]`, gate/up `[embed, mlp]`, down `[mlp, embed]`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdllm.attention import MaskSpec, attend
from jaxdllm.attention.shared_view import SharedView, view_attention
from jaxdllm.errors import ConfigError
from jaxdllm.models import quantize
from jaxdllm.models.config import ModelConfig, RopeScaling
from jaxdllm.models.run_options import RunOptions

_init = nnx.initializers.normal(stddev=0.02)


def einsum_options(options: RunOptions, rngs: nnx.Rngs) -> dict:
    """The keyword arguments every `Einsum` of a model built with `options` takes."""
    return dict(dtype=options.jnp_dtype, param_dtype=options.jnp_param_dtype, quantization=options.quantization,
                rngs=rngs)


class Einsum(nnx.Module):
    """`y = einsum(eqn, x, kernel) (+ bias)`, matmul in the compute dtype, fp32 accumulation.

    With LoRA adapters attached (`jaxdllm.models.lora.add_lora`: `lora_a [in..., r]`, `lora_b [r,
    out...]`, both `nnx.LoRAParam`), `y += lora_scale * (x A) B`, computed in the forward; the
    kernel itself is never rewritten during training.

    With `quantization="int8"` the kernel is int8 and `kernel_scale` holds one float32 scale per
    output channel (the kernel's shape, contracted axes of size 1); see `jaxdllm.models.quantize`.
    """

    def __init__(self, eqn: str, kernel_shape: tuple[int, ...], kernel_axes: tuple[str, ...], *,
                 bias_shape: tuple[int, ...] | None = None, bias_axes: tuple[str, ...] = (),
                 dtype, param_dtype, quantization: str | None = None, rngs: nnx.Rngs):
        self.eqn = eqn
        self.dtype = dtype
        kernel = _init(rngs.params(), kernel_shape, param_dtype)
        self.kernel_scale = nnx.data(None)  # int8: per-output-channel scales
        if quantization == "int8":
            contracted = quantize.contracted_axes(eqn)
            kernel, scale = quantize.quantize_kernel(kernel, quantize.scale_shape(kernel_shape, contracted))
            self.kernel_scale = nnx.Param(scale, logical_axes=tuple(
                None if i in contracted else a for i, a in enumerate(kernel_axes)))
        self.kernel = nnx.Param(kernel, logical_axes=kernel_axes)
        self.bias = (nnx.Param(jnp.zeros(bias_shape, param_dtype), logical_axes=bias_axes)
                     if bias_shape is not None else None)
        self.lora_a = nnx.data(None)  # LoRAParams once adapters are attached
        self.lora_b = nnx.data(None)
        self.lora_scale = 0.0

    @property
    def lora_eqns(self) -> tuple[str, str]:
        """`(x, A -> xA, xA, B -> y)` einsum equations of the low-rank path ("r" is the rank)."""
        x_spec, rest = self.eqn.split(",")
        kernel_spec, y_spec = rest.split("->")
        batch = "".join(c for c in x_spec if c not in kernel_spec)
        contracted = "".join(c for c in kernel_spec if c in x_spec)
        produced = "".join(c for c in kernel_spec if c not in x_spec)
        return f"{x_spec},{contracted}r->{batch}r", f"{batch}r,r{produced}->{y_spec}"

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        kernel = (self.kernel[...].astype(self.dtype) if self.kernel_scale is None
                  else quantize.dequantize(self.kernel[...], self.kernel_scale[...], self.dtype))
        y = jnp.einsum(self.eqn, x, kernel, preferred_element_type=jnp.float32)
        if self.lora_a is not None:
            down, up = self.lora_eqns
            xa = jnp.einsum(down, x, self.lora_a[...].astype(self.dtype), preferred_element_type=jnp.float32)
            y = y + self.lora_scale * jnp.einsum(up, xa.astype(self.dtype), self.lora_b[...].astype(self.dtype),
                                                 preferred_element_type=jnp.float32)
        if self.bias is not None:
            y = y + self.bias[...].astype(jnp.float32)
        return y.astype(self.dtype)


class RMSNorm(nnx.Module):
    """RMSNorm computed in float32; the scale multiplies after casting back (HF and LLaDA)."""

    def __init__(self, dim: int, eps: float, *, param_dtype):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=("norm",))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return y.astype(x.dtype) * self.scale[...].astype(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> np.ndarray:
    """Inverse frequencies `[head_dim // 2]` (float32), with optional Llama-3 / linear scaling."""
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    inv = inv.astype(np.float32)
    if scaling is None:
        return inv
    if scaling.type == "linear":
        return (inv / scaling.factor).astype(np.float32)
    # llama3: keep high frequencies, divide low ones by `factor`, interpolate in between.
    low_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    smooth = ((scaling.original_max_position / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate-half RoPE in float32. `x [B, L, H, D]`, `positions [B, L]` (logical positions).

    `inv_freq [R/2]` with R < D (partial rotary, LLaDA2): the first R dims rotate (rotate-half within
    them) and the other D - R pass through.
    """
    rotated = 2 * len(inv_freq)
    if rotated < x.shape[-1]:
        return jnp.concatenate([apply_rope(x[..., :rotated], positions, inv_freq), x[..., rotated:]], axis=-1)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, L, D/2]
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE; optional biases; an optional K/V cache slot."""

    def __init__(self, config: ModelConfig, options: RunOptions, *, rngs: nnx.Rngs):
        c = config
        kw = einsum_options(options, rngs)
        d, h, kv, hd = c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim
        qkv_bias = lambda heads, axis: dict(bias_shape=(heads, hd), bias_axes=(axis, "head_dim")) if c.qkv_bias else {}
        self.q = Einsum("bld,dhk->blhk", (d, h, hd), ("embed", "heads", "head_dim"), **qkv_bias(h, "heads"), **kw)
        self.k = Einsum("bld,dhk->blhk", (d, kv, hd), ("embed", "kv_heads", "head_dim"), **qkv_bias(kv, "kv_heads"), **kw)
        self.v = Einsum("bld,dhk->blhk", (d, kv, hd), ("embed", "kv_heads", "head_dim"), **qkv_bias(kv, "kv_heads"), **kw)
        out_bias = dict(bias_shape=(d,), bias_axes=("embed",)) if c.out_bias else {}
        self.o = Einsum("blhk,hkd->bld", (h, hd, d), ("heads", "head_dim", "embed"), **out_bias, **kw)
        # LLaDA2: RMSNorm over head_dim on q and k, before RoPE.
        self.q_norm = RMSNorm(hd, c.norm_eps, param_dtype=options.jnp_param_dtype) if c.qk_norm else None
        self.k_norm = RMSNorm(hd, c.norm_eps, param_dtype=options.jnp_param_dtype) if c.qk_norm else None
        self.attention_impl = options.attention_impl  # kept in step with the model's options (`with_options`)

    def __call__(self, x: jax.Array, positions: jax.Array, mask: MaskSpec, inv_freq: np.ndarray,
                 kv_cache: tuple[jax.Array, jax.Array] | None = None):
        """`x [B, L, D]` -> (`[B, L, D]`, updated `(k, v)` cache slot or None).

        With `kv_cache = (k [B, S, Hkv, Dh], v)`, the new keys/values are written at
        `mask.q_offset` and the queries attend to all S cached slots.
        """
        q, k = self.q(x), self.k(x)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if isinstance(mask, SharedView):
            return self._over_shared_blocks(q, k, self.v(x), positions, mask, inv_freq, kv_cache)
        q = apply_rope(q, positions, inv_freq)
        k = apply_rope(k, positions, inv_freq)
        return self.attend_cached(q, k, self.v(x), mask, kv_cache)

    def attend_cached(self, q, k, v, mask, kv_cache):
        """This forward's `k, v` written into the cache slot at `mask.q_offset` (when there is one), then
        `q` attends; returns `(o(attention) [B, L, D], the updated (k, v) slot or None)`."""
        if kv_cache is not None:
            cache_k, cache_v = kv_cache
            start = (0, mask.q_offset, 0, 0)
            k = jax.lax.dynamic_update_slice(cache_k, k.astype(cache_k.dtype), start)
            v = jax.lax.dynamic_update_slice(cache_v, v.astype(cache_v.dtype), start)
            kv_cache = (k, v)
        out = attend(q, k.astype(q.dtype), v.astype(q.dtype), mask, impl=self.attention_impl)
        return self.o(out), kv_cache

    def _over_shared_blocks(self, q, k, v, positions, view: SharedView, inv_freq, kv_cache):
        """Attention over shared cache blocks (`jaxdllm.attention.shared_view`): this forward's keys are
        rotated at their block-local slots and written into `view.write_block`; the view's blocks are read at
        their offsets (stored keys never move)."""
        if kv_cache is None:
            raise ConfigError("a SharedView forward reads and writes shared cache blocks: pass the blocks' KVCache")
        cache_k, cache_v = kv_cache
        blocks, slots = view.write_targets(cache_k.shape[1])
        k = apply_rope(k, view.key_slots(), inv_freq)
        cache_k = cache_k.at[blocks, slots].set(k.astype(cache_k.dtype), mode="drop")
        cache_v = cache_v.at[blocks, slots].set(v.astype(cache_v.dtype), mode="drop")
        rotate = lambda x, at: apply_rope(x, at, inv_freq)  # noqa: E731
        out = view_attention(q, positions, cache_k.astype(q.dtype), cache_v.astype(q.dtype), view, rotate,
                             impl=self.attention_impl)
        return self.o(out), (cache_k, cache_v)


def gelu_tanh(x: jax.Array) -> jax.Array:
    """GeLU with the tanh approximation (Gemma's `gelu_pytorch_tanh`)."""
    return jax.nn.gelu(x, approximate=True)


class MLP(nnx.Module):
    """Gated MLP: `down(act(gate(x)) * up(x))`, of width `width` (default `config.mlp_dim`); `act` is
    SiLU (SwiGLU) unless given (Gemma: `gelu_tanh`)."""

    def __init__(self, config: ModelConfig, options: RunOptions, *, width: int | None = None, activation=None,
                 rngs: nnx.Rngs):
        c = config
        self.activation = jax.nn.silu if activation is None else activation
        m = c.mlp_dim if width is None else width
        kw = einsum_options(options, rngs)
        bias = lambda n, axis: dict(bias_shape=(n,), bias_axes=(axis,)) if c.mlp_bias else {}
        self.gate = Einsum("bld,dm->blm", (c.embed_dim, m), ("embed", "mlp"), **bias(m, "mlp"), **kw)
        self.up = Einsum("bld,dm->blm", (c.embed_dim, m), ("embed", "mlp"), **bias(m, "mlp"), **kw)
        self.down = Einsum("blm,md->bld", (m, c.embed_dim), ("mlp", "embed"), **bias(c.embed_dim, "embed"), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(self.activation(self.gate(x)) * self.up(x))


class LayerNorm(nnx.Module):
    """LayerNorm with scale and bias, computed in float32 (transformers' `nn.LayerNorm`; XLNet, BERT)."""

    def __init__(self, dim: int, eps: float, *, param_dtype):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=("norm",))
        self.bias = nnx.Param(jnp.zeros((dim,), param_dtype), logical_axes=("norm",))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)).astype(x.dtype)
