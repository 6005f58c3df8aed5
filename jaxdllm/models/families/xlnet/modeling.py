"""XLNet (Yang et al. 2019) as transformers' `XLNetLMHeadModel` computes it: two-stream attention over
Transformer-XL relative positions, post-LayerNorm layers, a tied LM head with its own bias.

Two streams run through every layer with the same weights:

* the content stream `h` starts from the token embeddings; position i attends to the keys its row of
  `perm_mask` allows plus itself (the diagonal cleared);
* the query stream `g` starts from one learned vector (`mask_emb`) per target; a target at position t
  attends to the keys row t of `perm_mask` allows (never itself), so it knows its position only
  through the relative terms and never sees its own token.

Keys and values come from the content stream only. One layer, for queries `x` (either stream):

    a   = (q + r_w_bias) . k_j  +  (q + r_r_bias) . W_r sin/cos(i - j)  [+ (q + r_s_bias) . seg_embed[s_ij]]
    out = LayerNorm(x + o(softmax((a / sqrt(d_head)) - 1e30 * blocked_ij) v))
    out = LayerNorm(out + layer_2(act(layer_1(out))))

`s_ij` is 1 when tokens i and j have different `token_type_ids` (the segment term is left out when
none are given, as transformers does). Masked scores are lowered by 1e30, not set to -inf, as
transformers does: a row with every key blocked attends uniformly, exactly as there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdllm import sharding as shd
from jaxdllm.attention import MaskSpec
from jaxdllm.errors import ConfigError
from jaxdllm.models.families.xlnet.xlnet_config import XLNetConfig
from jaxdllm.models.layers import Einsum, LayerNorm, _init, einsum_options
from jaxdllm.models.run_options import RunOptions
from jaxdllm.models.transformer import ForwardOutput, Transformer, stack_layers

_ACTIVATIONS = {"gelu": lambda x: jax.nn.gelu(x, approximate=False), "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
                "relu": jax.nn.relu, "silu": jax.nn.silu, "swish": jax.nn.silu}
_REMAT = {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}
# transformers subtracts this from a blocked score (`attn_score - 1e30 * attn_mask`)
_BLOCKED = 1e30


def relative_sinusoids(length: int, dim: int, clamp_len: int = -1) -> np.ndarray:
    """`[2 * length - 1, dim]` float32: Transformer-XL's `[sin(d f), cos(d f)]` for every relative distance
    `d = i - j` from `-(length - 1)` (row 0) to `length - 1` (row `2 length - 2`), `f = 10000^(-2k / dim)`;
    distances clamped to `[-clamp_len, clamp_len]` when `clamp_len >= 0`."""
    inv_freq = (1.0 / np.power(10000.0, np.arange(0, dim, 2.0, dtype=np.float32) / dim)).astype(np.float32)
    distances = np.arange(-(length - 1), length, dtype=np.float32)
    if clamp_len >= 0:
        distances = np.clip(distances, -clamp_len, clamp_len)
    angles = distances[:, None] * inv_freq[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).astype(np.float32)


class RelativeAttention(nnx.Module):
    """XLNet's relative attention of one layer (`rel_attn`): q/k/v/o/r projections `[D, heads, head_dim]`
    (transformers' layout), the content, position and segment biases, the post-attention LayerNorm."""

    def __init__(self, config: XLNetConfig, options: RunOptions, *, rngs: nnx.Rngs):
        kw = einsum_options(options, rngs)
        d, n, hd, pd = config.embed_dim, config.num_heads, config.head_dim, options.jnp_param_dtype
        shape, axes = (d, n, hd), ("embed", "heads", "head_dim")
        self.q = Einsum("bld,dnk->blnk", shape, axes, **kw)
        self.k = Einsum("bld,dnk->blnk", shape, axes, **kw)
        self.v = Einsum("bld,dnk->blnk", shape, axes, **kw)
        self.r = Einsum("pd,dnk->pnk", shape, axes, **kw)
        self.o = Einsum("blnk,dnk->bld", shape, axes, **kw)
        bias = lambda: nnx.Param(_init(rngs.params(), (n, hd), pd), logical_axes=("heads", "head_dim"))  # noqa: E731
        self.r_w_bias, self.r_r_bias, self.r_s_bias = bias(), bias(), bias()
        self.seg_embed = nnx.Param(_init(rngs.params(), (2, n, hd), pd), logical_axes=(None, "heads", "head_dim"))
        self.norm = LayerNorm(d, config.norm_eps, param_dtype=pd)
        self.scale = hd ** -0.5

    def attend(self, x: jax.Array, query_positions: jax.Array, k: jax.Array, v: jax.Array, k_r: jax.Array,
               blocked: jax.Array, other_segment: jax.Array | None) -> jax.Array:
        """One stream's attention and post-attention norm.

        Args:
          x: `[B, Q, D]` the stream's hidden states (its queries and its residual).
          query_positions: `[B, Q]` int32, the column each query sits at (a key's position is its column).
          k, v: `[B, L, heads, head_dim]` the content stream's keys and values.
          k_r: `[2L - 1, heads, head_dim]` the relative-position keys (`relative_sinusoids` through `r`).
          blocked: `[B, Q, L]` bool, True where the query may not attend to the key.
          other_segment: `[B, Q, L]` bool, True where query and key have different token types; None
            leaves the segment term out.

        Returns:
          `[B, Q, D]`: `LayerNorm(x + o(attention))`.
        """
        length = k.shape[1]
        q = self.q(x).astype(jnp.float32)
        f32 = lambda p: p[...].astype(jnp.float32)  # noqa: E731
        content = jnp.einsum("bqnk,blnk->bnql", q + f32(self.r_w_bias), k.astype(jnp.float32))
        by_distance = jnp.einsum("bqnk,pnk->bnqp", q + f32(self.r_r_bias), k_r.astype(jnp.float32))
        # row p of k_r is distance p - (L - 1): the score of (query at i, key j) is column i - j + L - 1
        index = query_positions[:, :, None] - jnp.arange(length)[None, None, :] + (length - 1)
        position = jnp.take_along_axis(by_distance, index[:, None], axis=-1)
        score = content + position
        if other_segment is not None:
            seg = jnp.einsum("bqnk,snk->bnqs", q + f32(self.r_s_bias), f32(self.seg_embed))
            score = score + jnp.where(other_segment[:, None], seg[..., 1:], seg[..., :1])
        score = score * self.scale - _BLOCKED * blocked[:, None].astype(jnp.float32)
        probs = jax.nn.softmax(score, axis=-1)
        out = jnp.einsum("bnql,blnk->bqnk", probs, v.astype(jnp.float32)).astype(x.dtype)
        return self.norm(self.o(out) + x)


class FeedForward(nnx.Module):
    """XLNet's feed-forward (`ff`): `LayerNorm(x + layer_2(act(layer_1(x))))`, both linears with biases."""

    def __init__(self, config: XLNetConfig, options: RunOptions, *, rngs: nnx.Rngs):
        kw = einsum_options(options, rngs)
        d, m = config.embed_dim, config.mlp_dim
        self.activation = _ACTIVATIONS[config.ff_activation]
        self.layer_1 = Einsum("bld,dm->blm", (d, m), ("embed", "mlp"), bias_shape=(m,), bias_axes=("mlp",), **kw)
        self.layer_2 = Einsum("blm,md->bld", (m, d), ("mlp", "embed"), bias_shape=(d,), bias_axes=("embed",), **kw)
        self.norm = LayerNorm(d, config.norm_eps, param_dtype=options.jnp_param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        """`[B, Q, D]` -> `[B, Q, D]`."""
        return self.norm(self.layer_2(self.activation(self.layer_1(x))) + x)


class XLNetLayer(nnx.Module):
    """One XLNet layer over both streams (the query stream may be absent)."""

    def __init__(self, config: XLNetConfig, options: RunOptions, index: int = 0, *, rngs: nnx.Rngs):
        self.attn = RelativeAttention(config, options, rngs=rngs)
        self.ff = FeedForward(config, options, rngs=rngs)

    def __call__(self, h: jax.Array, g: jax.Array | None, streams: dict) -> tuple[jax.Array, jax.Array | None]:
        """`(h [B, L, D], g [B, K, D] or None)` -> the same after this layer; `streams`: what
        `XLNetLM.stream_inputs` prepared (masks, positions, relative sinusoids, segment flags)."""
        k, v = self.attn.k(h), self.attn.v(h)
        k_r = self.attn.r(streams["sinusoids"])
        new_h = self.attn.attend(h, streams["content_positions"], k, v, k_r, streams["content_blocked"],
                                 streams["content_segment"])
        if g is not None:
            g = self.ff(self.attn.attend(g, streams["target_positions"], k, v, k_r, streams["query_blocked"],
                                         streams["query_segment"]))
        return self.ff(new_h), g


class XLNetLM(Transformer):
    """XLNet with its LM head (transformers' `XLNetLMHeadModel`); `Transformer(config)` builds it for an
    `XLNetConfig`.

    `two_stream(input_ids, perm_mask, target_positions)` is the any-order model's query: the logits of the
    query stream at K target positions under a permutation mask (what ASSD drafts and verifies with).
    `model(input_ids)` without targets returns the content stream's logits at every position, as
    transformers does without `target_mapping`. There is no K/V cache (each call reruns both streams).
    """

    forward_inputs = ("perm_mask", "target_positions", "token_type_ids")

    def __init__(self, config: XLNetConfig, options: RunOptions | None = None, *, rngs: nnx.Rngs):
        options = RunOptions() if options is None else options
        self.config = config
        self.options = options
        pd = options.jnp_param_dtype
        self.embed = nnx.Param(_init(rngs.params(), (config.vocab_size, config.embed_dim), pd),
                               logical_axes=("vocab", "embed"))
        self.mask_emb = nnx.Param(_init(rngs.params(), (config.embed_dim,), pd), logical_axes=("embed",))
        blocks = [self.make_layer(config, options, i, rngs=rngs) for i in range(config.num_layers)]
        self.layers = stack_layers(blocks) if options.scan_layers else nnx.List(blocks)
        self.lm_bias = nnx.Param(jnp.zeros((config.vocab_size,), pd), logical_axes=("vocab",))
        # what the shared Transformer keeps and XLNet has not: a final norm (its layers end in one) and an
        # untied or int8 head (the head is the word embedding)
        self.final_norm = nnx.data(None)
        self.lm_head = nnx.data(None)
        self.lm_head_scale = nnx.data(None)

    # -- MODEL_PROTOCOL ----------------------------------------------------------------------------
    @classmethod
    def make_layer(cls, config: XLNetConfig, options: RunOptions, index: int, *, rngs: nnx.Rngs) -> XLNetLayer:
        """Layer `index`: `XLNetLayer`, run as `layer(h, g, streams) -> (h, g)`."""
        return XLNetLayer(config, options, index, rngs=rngs)

    def embed_inputs(self, input_ids: jax.Array, **_) -> jax.Array:
        """The content stream's input `[B, L, D]` (compute dtype): the word embeddings of `input_ids [B, L]`."""
        return jnp.take(self.embed[...], input_ids, axis=0).astype(self.options.jnp_dtype)

    def norm_output(self, x: jax.Array) -> jax.Array:
        """Unchanged: every XLNet layer ends in its own LayerNorm (post-norm), so there is no final norm."""
        return x

    def unembed(self, hidden: jax.Array) -> jax.Array:
        """float32 logits `[..., Q, V]` of `hidden [..., Q, D]`: the word embedding's transpose plus `lm_loss.bias`."""
        dtype = self.options.jnp_dtype
        logits = jnp.einsum("...qd,vd->...qv", hidden.astype(dtype), self.embed[...].astype(dtype),
                            preferred_element_type=jnp.float32)
        return logits + self.lm_bias[...].astype(jnp.float32)

    def init_cache(self, batch_size: int, max_length: int, dtype=None):
        """XLNet keeps no K/V cache here: a query's keys change with the permutation mask, so every call
        reruns both streams. Raises `ConfigError`."""
        raise ConfigError("XLNet models have no K/V cache in jaxdllm: every call reruns the content and query "
                          "streams (decode with cache='none')")

    # -- the forward -------------------------------------------------------------------------------
    def stream_inputs(self, input_ids: jax.Array, perm_mask: jax.Array | None, target_positions: jax.Array | None,
                      token_type_ids: jax.Array | None) -> dict:
        """What every layer reads, built once per call (see `XLNetLayer`): the content stream's and the
        query stream's blocked keys (`[B, L, L]` and `[B, K, L]` bool), their query columns, the relative
        sinusoids `[2L - 1, D]` and the token-type flags (or None)."""
        b, length = input_ids.shape
        blocked = (jnp.zeros((b, length, length), bool) if perm_mask is None else jnp.asarray(perm_mask, bool))
        if blocked.shape != (b, length, length):
            raise ConfigError(f"perm_mask must be [B, L, L] = {[b, length, length]}, got {list(blocked.shape)}")
        content_positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
        out = {"content_positions": content_positions,
               # a token always sees its own content (transformers' `non_tgt_mask`)
               "content_blocked": blocked & ~jnp.eye(length, dtype=bool),
               "sinusoids": jnp.asarray(relative_sinusoids(length, self.config.embed_dim, self.config.clamp_len)),
               "target_positions": None, "query_blocked": None, "content_segment": None, "query_segment": None}
        if target_positions is not None:
            targets = jnp.asarray(target_positions, jnp.int32)
            out["target_positions"] = targets
            out["query_blocked"] = jnp.take_along_axis(blocked, targets[:, :, None], axis=1)
        if token_type_ids is not None:
            types = jnp.asarray(token_type_ids, jnp.int32)
            out["content_segment"] = types[:, :, None] != types[:, None, :]
            if target_positions is not None:
                out["query_segment"] = jnp.take_along_axis(types, out["target_positions"], axis=1)[:, :, None] \
                    != types[:, None, :]
        return out

    def _layer_fn(self, graphdef):
        def run(params, h, g, streams):
            h, g = nnx.merge(graphdef, params)(h, g, streams)
            h = shd.constrain(h, ("batch", "length", "embed"))
            return h, (None if g is None else shd.constrain(g, ("batch", "length", "embed")))

        if self.options.remat == "none":
            return run
        return jax.checkpoint(run, policy=_REMAT[self.options.remat], prevent_cse=not self.options.scan_layers)

    def streams(self, input_ids: jax.Array, perm_mask: jax.Array | None = None,
                target_positions: jax.Array | None = None,
                token_type_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
        """The last layer's content stream `[B, L, D]` and query stream `[B, K, D]` (None without targets);
        arguments as `two_stream`'s (`perm_mask` None: every position sees every other)."""
        streams = self.stream_inputs(input_ids, perm_mask, target_positions, token_type_ids)
        h = shd.constrain(self.embed_inputs(input_ids), ("batch", "length", "embed"))
        g = None
        if target_positions is not None:
            b, k = streams["target_positions"].shape
            g = jnp.broadcast_to(self.mask_emb[...].astype(h.dtype), (b, k, h.shape[-1]))
        if self.options.scan_layers:
            graphdef, params = nnx.split(self.layers)
            layer = self._layer_fn(graphdef)

            def body(carry, layer_params):
                return layer(layer_params, *carry, streams), None

            (h, g), _ = jax.lax.scan(body, (h, g), params)
        else:
            for block in self.layers:
                graphdef, params = nnx.split(block)
                h, g = self._layer_fn(graphdef)(params, h, g, streams)
        return h, g

    def two_stream(self, input_ids: jax.Array, perm_mask: jax.Array, target_positions: jax.Array,
                   token_type_ids: jax.Array | None = None) -> jax.Array:
        """The query stream's logits at K target positions under a permutation mask.

        Equal to transformers' `XLNetLMHeadModel(input_ids, perm_mask=perm_mask, target_mapping=one_hot(
        target_positions, L))` (its `token_type_ids` too, when given).

        Args:
          input_ids: `[B, L]` int32 token ids; a slot to predict may hold anything (ASSD writes the mask
            id, `config.mask_token_id`): a query never sees its own slot.
          perm_mask: `[B, L, L]` bool, `perm_mask[b, i, j]` True: position i may NOT attend to position j
            (transformers' convention). The content stream uses it with the diagonal cleared (a token
            sees itself); the query stream uses it as is. A padded key column is True for every query.
          target_positions: `[B, K]` int32 columns in `[0, L)` to predict, distinct within a row.
          token_type_ids: optional `[B, L]` int32 segment ids (XLNet's segment term); None leaves the
            term out, as transformers does.

        Returns:
          `[B, K, V]` float32 logits.
        """
        _, g = self.streams(input_ids, perm_mask, target_positions, token_type_ids)
        return self.unembed(g)

    def __call__(self, input_ids: jax.Array, positions: jax.Array | None = None, attention: MaskSpec | None = None,
                 cache=None, logits_slice=None, return_router_loads: bool = False, *, return_hidden: bool = False,
                 perm_mask: jax.Array | None = None, target_positions: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None) -> ForwardOutput:
        """`two_stream` as a `ForwardOutput` (the trainer's and the objectives' call), or without
        `target_positions` the content stream's logits `[B, L, V]` at every position.

        Args:
          input_ids, perm_mask, target_positions, token_type_ids: as `two_stream` (`perm_mask` may be
            None: full attention).
          attention: None, or a `bidirectional` `MaskSpec` whose segment ids block keys of other
            examples and padding (segment 0), added to `perm_mask`.
          positions, cache, logits_slice: not supported (positions are the columns; XLNet keeps no cache);
            `ConfigError` when given. `return_router_loads`: ignored (a dense model).
          return_hidden: fill `hidden` with the stream the logits come from.

        Returns:
          `ForwardOutput(logits [B, K or L, V] float32, hidden or None)`.
        """
        if positions is not None or cache is not None or logits_slice is not None:
            raise ConfigError("XLNet takes no positions, cache or logits_slice: positions are the columns of "
                              "input_ids, and the logits are those of target_positions")
        if attention is not None:
            if attention.kind != "bidirectional":
                raise ConfigError(f"XLNet attends as perm_mask says; a MaskSpec may only add padding and "
                                  f"segments to it (kind 'bidirectional'), got {attention.kind!r}")
            if attention.kv_segment_ids is not None:
                q_seg = attention.q_segment_ids if attention.q_segment_ids is not None else attention.kv_segment_ids
                other = (q_seg[:, :, None] != attention.kv_segment_ids[:, None, :]) | \
                    (attention.kv_segment_ids == 0)[:, None, :]
                perm_mask = other if perm_mask is None else jnp.asarray(perm_mask, bool) | other
        h, g = self.streams(input_ids, perm_mask, target_positions, token_type_ids)
        hidden = h if g is None else g
        return ForwardOutput(self.unembed(hidden), None, None, hidden if return_hidden else None)
