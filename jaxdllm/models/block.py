"""The transformer block: attention then an MLP, or routed experts in an MoE config's MoE layers."""

from __future__ import annotations

from flax import nnx

from jaxdllm.models.config import ModelConfig
from jaxdllm.models.layers import MLP, Attention, RMSNorm
from jaxdllm.models.moe import MoE
from jaxdllm.models.run_options import RunOptions


class Block(nnx.Module):
    """Pre-norm transformer block: `h = x + attn(norm(x))`, `out = h + mlp(norm(h))`; `mlp` is a
    routed-experts `MoE` in the MoE layers of an MoE config (`config.is_moe_layer(index)`)."""

    def __init__(self, config: ModelConfig, options: RunOptions, index: int = 0, *, rngs: nnx.Rngs):
        pd = options.jnp_param_dtype
        self.attn_norm = RMSNorm(config.embed_dim, config.norm_eps, param_dtype=pd)
        self.attn = Attention(config, options, rngs=rngs)
        self.mlp_norm = RMSNorm(config.embed_dim, config.norm_eps, param_dtype=pd)
        self.mlp = (MoE(config, options, rngs=rngs) if config.is_moe_layer(index)
                    else MLP(config, options, rngs=rngs))

    def __call__(self, x, positions, mask, inv_freq, kv_cache=None):
        """`(x [B, L, D], kv_cache slot, load)`: `load [E]` counts the rows each routed expert ran
        (None in a dense layer)."""
        h, kv_cache = self.attn(self.attn_norm(x), positions, mask, inv_freq, kv_cache)
        x = x + h
        h, load = self.mlp(self.mlp_norm(x)), None
        if isinstance(h, tuple):
            h, load = h
        return x + h, kv_cache, load
