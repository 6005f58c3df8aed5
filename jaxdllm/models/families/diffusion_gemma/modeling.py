"""DiffusionGemma's model: the shared `Transformer` with Gemma 4's layers, a self-conditioned input
and a softcapped head (`DiffusionGemmaTransformer`).

One weight set, two modes (`DiffusionGemmaTransformer.__call__(encode=...)`): the causal encoder
writes the prompt and every finished canvas into the KV cache; the denoiser runs bidirectionally
over a canvas of C tokens attending to [cache; canvas] and never writes the cache. A sliding
layer's canvas sees its W - 1 last cached tokens and the whole canvas (`MaskSpec.window`). The
denoiser's input is self-conditioned on its previous step's logits (`SelfConditioning`).

One layer, from the published `modeling_diffusion_gemma.py` (`architectures.md`, DiffusionGemma):

    h = x + post_attention_norm(attention(input_norm(x)))
    m1 = post_feedforward_norm_1(mlp(pre_feedforward_norm(h)))            # dense GeLU-tanh MLP
    m2 = post_feedforward_norm_2(experts(pre_feedforward_norm_2(h), route(h)))
    out = (h + post_feedforward_norm(m1 + m2)) * layer_scalar

Attention: q/k RMSNorm over the head dim before RoPE, V through a scale-free RMSNorm, softmax scale
1. Sliding layers have their own V projection, full RoPE and a sliding window; full layers use the
raw K projection as V and "proportional" RoPE. Routing: `softmax(proj(rmsnorm(h) * scale / sqrt(D)))`
in float32, the top k renormalised to sum 1, times `per_expert_scale`. The same weights serve the
causal encoder and the bidirectional denoiser; only the layer scalar differs (each has its own).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdllm.attention import MaskSpec, attend
from jaxdllm.errors import ConfigError
from jaxdllm.models.families.diffusion_gemma.gemma_config import DiffusionGemmaConfig
from jaxdllm.models.layers import MLP, Einsum, RMSNorm, _init, apply_rope, einsum_options, gelu_tanh, rope_inv_freq
from jaxdllm.models.moe import ExpertKernel, grouped_swiglu
from jaxdllm.models.run_options import RunOptions
from jaxdllm.models.transformer import Transformer


def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
    """Scale-free RMSNorm in float32, back in `x.dtype`."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def proportional_inv_freq(head_dim: int, theta: float, fraction: float) -> np.ndarray:
    """`[head_dim // 2]` inverse frequencies of "proportional" RoPE: the exponent runs over the whole
    head (`theta ** (-2j / head_dim)`), only the first `head_dim * fraction / 2` pairs rotate and the
    rest have frequency 0 (they pass through)."""
    pairs = np.arange(head_dim // 2, dtype=np.float32)
    inv = 1.0 / (theta ** (2 * pairs / head_dim))
    return np.where(pairs < int(head_dim * fraction) // 2, inv, 0.0).astype(np.float32)


class Gemma4Attention(nnx.Module):
    """Gemma 4 attention of one layer (sliding or full); the cache slot works as `Attention`'s."""

    def __init__(self, config: DiffusionGemmaConfig, options: RunOptions, index: int, *, rngs: nnx.Rngs):
        g, kw = config.gemma4, einsum_options(options, rngs)
        d, h = config.embed_dim, config.num_heads
        kv, hd = config.kv_shape(index)
        self.sliding = g.layer_types[index] == "sliding"
        self.window = g.sliding_window if self.sliding else None
        self.eps = config.norm_eps
        self.rope = (hd, config.rope_theta, 1.0) if self.sliding else (hd, g.full_rope_theta, g.full_rotary_fraction)
        self.q = Einsum("bld,dhk->blhk", (d, h, hd), ("embed", "heads", "head_dim"), **kw)
        self.k = Einsum("bld,dhk->blhk", (d, kv, hd), ("embed", "kv_heads", "head_dim"), **kw)
        self.v = Einsum("bld,dhk->blhk", (d, kv, hd), ("embed", "kv_heads", "head_dim"), **kw) if self.sliding else None
        self.o = Einsum("blhk,hkd->bld", (h, hd, d), ("heads", "head_dim", "embed"), **kw)
        pd = options.jnp_param_dtype
        self.q_norm = RMSNorm(hd, config.norm_eps, param_dtype=pd)
        self.k_norm = RMSNorm(hd, config.norm_eps, param_dtype=pd)
        self.attention_impl = options.attention_impl  # kept in step with the model's options (`with_options`)

    def inv_freq(self) -> np.ndarray:
        hd, theta, fraction = self.rope
        return rope_inv_freq(hd, theta) if fraction == 1.0 else proportional_inv_freq(hd, theta, fraction)

    def __call__(self, x: jax.Array, positions: jax.Array, mask: MaskSpec,
                 kv_cache: tuple[jax.Array, jax.Array] | None = None):
        """`x [B, L, D]` -> (`[B, L, D]`, the updated `(k, v)` slot or None)."""
        inv_freq = self.inv_freq()
        raw_k = self.k(x)
        q = apply_rope(self.q_norm(self.q(x)), positions, inv_freq)
        k = apply_rope(self.k_norm(raw_k), positions, inv_freq)
        v = rms_normalize(self.v(x) if self.v is not None else raw_k, self.eps)
        if kv_cache is not None:
            start = (0, mask.q_offset, 0, 0)
            k = jax.lax.dynamic_update_slice(kv_cache[0], k.astype(kv_cache[0].dtype), start)
            v = jax.lax.dynamic_update_slice(kv_cache[1], v.astype(kv_cache[1].dtype), start)
            kv_cache = (k, v)
        if self.window is not None:
            if mask.kind not in ("causal", "bidirectional", "denoise_canvas"):
                raise ConfigError(f"Gemma 4's sliding layers run causal (encoder), bidirectional (denoiser) or "
                                  f"denoise_canvas (training) attention, not {mask.kind!r}")
            mask = mask.replace(window=self.window)
        out = attend(q, k.astype(q.dtype), v.astype(q.dtype), mask, impl=self.attention_impl, scale=1.0)
        return self.o(out), kv_cache


class Gemma4Experts(nnx.Module):
    """Gemma 4's routed experts: `(route_from [T, D], x [T, D]) -> ([T, D], load [E])`."""

    def __init__(self, config: DiffusionGemmaConfig, options: RunOptions, *, rngs: nnx.Rngs):
        e = self.settings = config.experts
        self.dtype = options.jnp_dtype  # kept in step with the model's options (`with_options`)
        self.moe_impl = options.moe_impl  # likewise
        self.eps = config.norm_eps
        d, n, m = config.embed_dim, e.num_experts, e.expert_dim
        pd = options.jnp_param_dtype
        self.router = nnx.Param(_init(rngs.params(), (d, n), pd), logical_axes=("embed", None))
        self.router_scale = nnx.Param(jnp.ones((d,), pd), logical_axes=("norm",))
        self.per_expert_scale = nnx.Param(jnp.ones((n,), pd), logical_axes=(None,))
        self.gate = ExpertKernel((n, d, m), ("expert", None, "mlp"), options=options, rngs=rngs)
        self.up = ExpertKernel((n, d, m), ("expert", None, "mlp"), options=options, rngs=rngs)
        self.down = ExpertKernel((n, m, d), ("expert", "mlp", None), options=options, rngs=rngs)

    def route(self, h: jax.Array) -> tuple[jax.Array, jax.Array]:
        """`h [T, D]` -> (experts `[T, k]` int32, weights `[T, k]` float32)."""
        d = h.shape[-1]
        r = rms_normalize(h, self.eps) * self.router_scale[...].astype(h.dtype) * jnp.asarray(d ** -0.5, h.dtype)
        scores = jnp.dot(r.astype(self.dtype), self.router[...].astype(self.dtype), preferred_element_type=jnp.float32)
        probs = jax.nn.softmax(scores, axis=-1)
        weights, experts = jax.lax.top_k(probs, self.settings.experts_per_token)
        weights = weights / weights.sum(-1, keepdims=True)
        return experts.astype(jnp.int32), weights * self.per_expert_scale[...].astype(jnp.float32)[experts]

    def __call__(self, route_from: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        experts, weights = self.route(route_from)
        dt = self.dtype
        y, load = grouped_swiglu(x.astype(dt), experts, weights, self.gate.value(dt), self.up.value(dt),
                                 self.down.value(dt), activation=gelu_tanh, impl=self.moe_impl)
        return y.astype(x.dtype), load


class Gemma4Block(nnx.Module):
    """One Gemma 4 layer (see the module notes); `encode` picks the encoder's layer scalar."""

    def __init__(self, config: DiffusionGemmaConfig, options: RunOptions, index: int = 0, *, rngs: nnx.Rngs):
        pd, d, eps = options.jnp_param_dtype, config.embed_dim, config.norm_eps
        norm = lambda: RMSNorm(d, eps, param_dtype=pd)  # noqa: E731
        self.attn_norm, self.post_attn_norm = norm(), norm()
        self.attn = Gemma4Attention(config, options, index, rngs=rngs)
        self.mlp_norm, self.post_mlp_norm = norm(), norm()
        self.mlp = MLP(config, options, activation=gelu_tanh, rngs=rngs)
        self.experts = self.experts_norm = self.post_experts_norm = nnx.data(None)
        if config.experts is not None:
            self.experts_norm, self.post_experts_norm = norm(), norm()
            self.experts = Gemma4Experts(config, options, rngs=rngs)
        self.post_ff_norm = norm()
        self.layer_scalar = nnx.Param(jnp.ones((1,), pd), logical_axes=(None,))
        self.encoder_layer_scalar = nnx.Param(jnp.ones((1,), pd), logical_axes=(None,))

    def __call__(self, x, positions, mask, inv_freq=None, kv_cache=None, encode: bool = False):
        """`(x [B, L, D], kv_cache slot, load [E] or None)`; `inv_freq` is unused (each layer has its
        own RoPE)."""
        del inv_freq
        a, kv_cache = self.attn(self.attn_norm(x), positions, mask, kv_cache)
        h = x + self.post_attn_norm(a)
        ff, load = self.post_mlp_norm(self.mlp(self.mlp_norm(h))), None
        if self.experts is not None:
            b, l, d = h.shape
            flat = h.reshape(b * l, d)
            routed, load = self.experts(flat, self.experts_norm(flat))
            ff = ff + self.post_experts_norm(routed.reshape(b, l, d))
        out = h + self.post_ff_norm(ff)
        scalar = self.encoder_layer_scalar if encode else self.layer_scalar
        return out * scalar[...].astype(out.dtype), kv_cache, load


class SelfConditioning(nnx.Module):
    """DiffusionGemma's self-conditioning: the denoiser's input is
    `rmsnorm_noscale(e + mlp(pre_norm(s)))`, `s` the soft embedding of the previous step's logits."""

    def __init__(self, config: DiffusionGemmaConfig, options: RunOptions, *, rngs: nnx.Rngs):
        self.eps = config.norm_eps
        self.pre_norm = RMSNorm(config.embed_dim, config.norm_eps, param_dtype=options.jnp_param_dtype)
        self.mlp = MLP(config, options, activation=gelu_tanh, rngs=rngs)

    def __call__(self, e: jax.Array, soft: jax.Array | None) -> jax.Array:
        """`e, soft [B, L, D]` -> `[B, L, D]`; `soft=None` is a zero signal (the MLP of 0 is 0)."""
        if soft is not None:
            e = e + self.mlp(self.pre_norm(soft))
        return rms_normalize(e, self.eps)


class DiffusionGemmaTransformer(Transformer):
    """The shared `Transformer` with Gemma 4's layers (`Gemma4Block`), its input (embeddings times
    sqrt(D); the denoiser's self-conditioned on the previous step's logits) and its head (the tied
    embedding, logits softcapped). `Transformer(config)` builds this class for a
    `DiffusionGemmaConfig`."""

    forward_inputs = ("encode", "self_conditioning", "self_conditioning_mask")

    def __init__(self, config: DiffusionGemmaConfig, options: RunOptions | None = None, *, rngs: nnx.Rngs):
        super().__init__(config, options, rngs=rngs)
        self.self_conditioning = SelfConditioning(config, self.options, rngs=rngs)

    @classmethod
    def make_layer(cls, config: DiffusionGemmaConfig, options: RunOptions, index: int, *, rngs: nnx.Rngs) -> Gemma4Block:
        return Gemma4Block(config, options, index, rngs=rngs)

    def __call__(self, input_ids: jax.Array, positions: jax.Array | None = None, attention: MaskSpec | None = None,
                 cache=None, logits_slice=None, return_router_loads: bool = False, *, encode: bool = False,
                 self_conditioning: jax.Array | None = None, self_conditioning_mask: jax.Array | None = None,
                 return_hidden: bool = False):
        """`Transformer.__call__` (same arguments and `ForwardOutput`), and:

        Args:
          encode: run as the causal encoder (plain embeddings, the encoder's layer scalars) rather
            than the denoiser (self-conditioned input, the decoder's scalars).
          self_conditioning: the denoiser's `[B, L, V]` logits of the previous denoising step (None:
            the first step, a zero signal).
          self_conditioning_mask: `[B]` bool, rows whose `self_conditioning` is used (the others get
            the zero signal); default all.
        """
        return super().__call__(input_ids, positions, attention, cache, logits_slice, return_router_loads,
                                return_hidden=return_hidden, encode=encode, self_conditioning=self_conditioning,
                                self_conditioning_mask=self_conditioning_mask)

    def embed_inputs(self, input_ids: jax.Array, encode: bool = False, self_conditioning: jax.Array | None = None,
                     self_conditioning_mask: jax.Array | None = None) -> jax.Array:
        """`[B, L, D]`: embeddings times sqrt(D) (in the parameters' dtype); the denoiser then adds the
        self-conditioning signal, the soft embedding `softmax(logits) E sqrt(D)`."""
        x = super().embed_inputs(input_ids)
        table = self.embed[...]
        scale = jnp.asarray(self.config.embed_dim ** 0.5, table.dtype).astype(x.dtype)
        x = x * scale
        if encode:
            return x
        soft = None
        if self_conditioning is not None:
            probs = jax.nn.softmax(self_conditioning.astype(jnp.float32), axis=-1).astype(table.dtype)
            soft = jnp.einsum("blv,vd->bld", probs, table, preferred_element_type=jnp.float32).astype(x.dtype) * scale
            if self_conditioning_mask is not None:
                soft = soft * jnp.asarray(self_conditioning_mask, x.dtype)[:, None, None]
        return self.self_conditioning(x, soft)

    def layer_inputs(self, encode: bool = False, **_) -> dict:
        return {"encode": encode}

    def unembed(self, hidden: jax.Array) -> jax.Array:
        """The tied head's float32 logits `[..., L, V]`, softcapped (`cap * tanh(logits / cap)`)."""
        logits = super().unembed(hidden)
        cap = self.config.gemma4.final_softcap
        return logits if cap is None else cap * jnp.tanh(logits / cap)
