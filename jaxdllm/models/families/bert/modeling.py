"""BERT as transformers' `BertForMaskedLM` computes it (eval mode): GenMol's backbone.

    h   = LayerNorm(word[x] + position[p] + token_type[0])          (embeddings; dropout off)
    h   = LayerNorm(h + o(attention(q(h), k(h), v(h))))              (per layer, post-norm)
    h   = LayerNorm(h + down(act(up(h))))
    out = word^T . LayerNorm(act(dense(h))) + bias                   (the MLM head, decoder tied)

q/k/v/o, up/down and the head's dense all carry biases; attention is bidirectional through the shared
entry point (`jaxdllm.attention.attend`: its padding and segment masks, every backend); positions are
the `positions` argument looked up in the absolute position table (the sampler's logical positions,
so left padding never shifts them). The K/V cache is the shared `KVCache` (keys carry no rotation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxdllm.attention.shared_view import SharedView
from jaxdllm.errors import ConfigError
from jaxdllm.models.families.bert.bert_config import BertConfig
from jaxdllm.models.layers import Attention, Einsum, LayerNorm, _init, einsum_options
from jaxdllm.models.run_options import RunOptions
from jaxdllm.models.transformer import ForwardOutput, Transformer, stack_layers

ACTIVATIONS = {"gelu": lambda x: jax.nn.gelu(x, approximate=False),
               "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
               "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
               "relu": jax.nn.relu, "silu": jax.nn.silu, "swish": jax.nn.silu}


class BertAttention(Attention):
    """BERT's self-attention (`attention.self` and `attention.output.dense`): the shared `Attention`'s
    q/k/v/o with biases (`[D, heads, head_dim]`, `[heads, head_dim, D]`), without rotary embeddings."""

    def __call__(self, x: jax.Array, positions: jax.Array, mask, inv_freq=None, kv_cache=None):
        """`x [B, L, D]` -> (`[B, L, D]` before the residual and norm, updated `(k, v)` slot or None)."""
        if isinstance(mask, SharedView):
            raise ConfigError("BERT models do not read shared cache blocks (SharedView); decode with a plain "
                              "or no cache")
        return self.attend_cached(self.q(x), self.k(x), self.v(x), mask, kv_cache)


class BertFeedForward(nnx.Module):
    """`intermediate.dense` (`up`) and `output.dense` (`down`), both with biases: `down(act(up(x)))`."""

    def __init__(self, config: BertConfig, options: RunOptions, *, rngs: nnx.Rngs):
        kw = einsum_options(options, rngs)
        d, m = config.embed_dim, config.mlp_dim
        self.activation = ACTIVATIONS[config.hidden_act]
        self.up = Einsum("bld,dm->blm", (d, m), ("embed", "mlp"), bias_shape=(m,), bias_axes=("mlp",), **kw)
        self.down = Einsum("blm,md->bld", (m, d), ("mlp", "embed"), bias_shape=(d,), bias_axes=("embed",), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(self.activation(self.up(x)))


class BertLayer(nnx.Module):
    """One post-norm BERT layer: `h = LN(x + attn(x))`, `out = LN(h + ff(h))`."""

    def __init__(self, config: BertConfig, options: RunOptions, index: int = 0, *, rngs: nnx.Rngs):
        pd = options.jnp_param_dtype
        self.attn = BertAttention(config, options, rngs=rngs)
        self.attn_norm = LayerNorm(config.embed_dim, config.norm_eps, param_dtype=pd)
        self.mlp = BertFeedForward(config, options, rngs=rngs)
        self.mlp_norm = LayerNorm(config.embed_dim, config.norm_eps, param_dtype=pd)

    def __call__(self, x, positions, mask, inv_freq=None, kv_cache=None):
        """`(x [B, L, D], kv_cache slot, None)`: the shared layer call (`Transformer.make_layer`)."""
        h, kv_cache = self.attn(x, positions, mask, inv_freq, kv_cache)
        x = self.attn_norm(x + h)
        return self.mlp_norm(x + self.mlp(x)), kv_cache, None


class BertLM(Transformer):
    """BERT with its MLM head (transformers' `BertForMaskedLM`); `Transformer(config)` builds it for a
    `BertConfig`. It runs the shared forward (`Transformer.__call__`: masks, cache, `logits_slice`,
    scanned layers, remat) with its own embeddings, layers and head."""

    def __init__(self, config: BertConfig, options: RunOptions | None = None, *, rngs: nnx.Rngs):
        options = RunOptions() if options is None else options
        self.config = config
        self.options = options
        pd = options.jnp_param_dtype
        d = config.embed_dim
        self.embed = nnx.Param(_init(rngs.params(), (config.vocab_size, d), pd), logical_axes=("vocab", "embed"))
        self.position_embed = nnx.Param(_init(rngs.params(), (config.max_position, d), pd),
                                        logical_axes=(None, "embed"))
        self.type_embed = nnx.Param(_init(rngs.params(), (config.type_vocab_size, d), pd),
                                    logical_axes=(None, "embed"))
        self.embed_norm = LayerNorm(d, config.norm_eps, param_dtype=pd)
        blocks = [self.make_layer(config, options, i, rngs=rngs) for i in range(config.num_layers)]
        self.layers = stack_layers(blocks) if options.scan_layers else nnx.List(blocks)
        kw = einsum_options(options, rngs)
        self.head_dense = Einsum("...d,de->...e", (d, d), ("embed", None), bias_shape=(d,), bias_axes=(None,),
                                 **kw)
        self.head_norm = LayerNorm(d, config.norm_eps, param_dtype=pd)
        self.lm_bias = nnx.Param(jnp.zeros((config.vocab_size,), pd), logical_axes=("vocab",))
        self.activation = ACTIVATIONS[config.hidden_act]
        # what the shared Transformer keeps and BERT has not: a final norm (its layers end in one) and an
        # untied or int8 head (the decoder is the word embedding)
        self.final_norm = nnx.data(None)
        self.lm_head = nnx.data(None)
        self.lm_head_scale = nnx.data(None)

    # -- MODEL_PROTOCOL ----------------------------------------------------------------------------
    @classmethod
    def make_layer(cls, config: BertConfig, options: RunOptions, index: int, *, rngs: nnx.Rngs) -> BertLayer:
        """Layer `index`: `BertLayer`, called as the shared layers are."""
        return BertLayer(config, options, index, rngs=rngs)

    def embed_inputs(self, input_ids: jax.Array, positions: jax.Array | None = None, **_) -> jax.Array:
        """The first layer's input `[B, L, D]` (compute dtype): `LayerNorm(word[input_ids] +
        position[positions] + token_type[0])`; `positions` default `arange(L)` (clipped to the table)."""
        b, length = input_ids.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
        word = jnp.take(self.embed[...], input_ids, axis=0).astype(jnp.float32)
        where = jnp.take(self.position_embed[...], positions, axis=0, mode="clip").astype(jnp.float32)
        kind = self.type_embed[0].astype(jnp.float32)
        return self.embed_norm(word + where + kind).astype(self.options.jnp_dtype)

    def norm_output(self, x: jax.Array) -> jax.Array:
        """Unchanged: every BERT layer ends in its own LayerNorm (post-norm), so there is no final norm."""
        return x

    def unembed(self, hidden: jax.Array) -> jax.Array:
        """The MLM head: float32 logits `[..., L, V]` = `word^T . LN(act(dense(hidden))) + cls.predictions.bias`."""
        dtype = self.options.jnp_dtype
        x = self.head_norm(self.activation(self.head_dense(hidden)))
        logits = jnp.einsum("...ld,vd->...lv", x.astype(dtype), self.embed[...].astype(dtype),
                            preferred_element_type=jnp.float32)
        return logits + self.lm_bias[...].astype(jnp.float32)

    # init_cache: the shared `KVCache` (one `[B, S, heads, head_dim]` slot per layer).

    # -- the forward -------------------------------------------------------------------------------
    def _forward(self, input_ids, positions, attention, cache, logits_slice, inputs) -> ForwardOutput:
        """The shared forward, with the positions (default `q_offset + arange(L)`, as there) handed to
        `embed_inputs` for the position table."""
        if isinstance(attention, SharedView):
            raise ConfigError("BERT models do not read shared cache blocks (SharedView); decode with a plain "
                              "or no cache")
        if positions is None:
            b, length = input_ids.shape
            offset = 0 if attention is None else attention.q_offset
            positions = jnp.broadcast_to(jnp.asarray(offset, jnp.int32) + jnp.arange(length), (b, length))
        return super()._forward(input_ids, positions, attention, cache, logits_slice,
                                {**inputs, "positions": positions})
