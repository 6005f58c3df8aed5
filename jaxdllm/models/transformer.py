"""The shared jaxdllm `Transformer` (Flax NNX): LLaDA, Dream, Qwen2, Llama, block diffusion and
LLaDA2 run on it as it is; a family whose model differs subclasses it in its own module
(`jaxdllm.models.families`) and registers the subclass for its config class (`register_model`).

Which model it is lives in its `ModelConfig` (attention mode, biases, tied embeddings, token
shift, special ids). How it runs lives in `RunOptions`, held once as `model.options`: dtypes, the
attention backend, `scan_layers` (the layers' parameters stacked along a leading `layers` axis,
run with one `jax.lax.scan`: one layer to compile), `remat` (each layer's activations
rematerialised in the backward pass) and int8 weights.

What a family may change is one small protocol (`MODEL_PROTOCOL`), each a method here:
`embed_inputs` (token ids and the family's own forward inputs -> the first layer's input),
`make_layer` (its decoder layer), `norm_output` (the final norm), `unembed` (the LM head) and
`init_cache` (its K/V cache); `forward_inputs` names the extra keyword arguments its forward
takes and `layer_inputs` what of them each layer reads.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdllm import sharding as shd
from jaxdllm.attention import MaskSpec
from jaxdllm.attention.shared_view import SharedView
from jaxdllm.errors import ConfigError
from jaxdllm.models import quantize
from jaxdllm.models.cache import KVCache
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.block import Block
from jaxdllm.models.layers import RMSNorm, _init, rope_inv_freq
from jaxdllm.models.run_options import LAYOUT_OPTIONS, RunOptions

_REMAT = {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}
# What a family's model class answers for (see the module notes).
MODEL_PROTOCOL = ("embed_inputs", "make_layer", "norm_output", "unembed", "init_cache")
# Run options that modules keep a copy of, under the option's name (`with_options` updates them).
_FOLLOWED_OPTIONS = {"dtype": "jnp_dtype", "moe_impl": "moe_impl", "attention_impl": "attention_impl"}
# config class -> its family's model class (`register_model`); others build the shared `Transformer`.
_MODELS: dict[type, type] = {}


def register_model(config_class: type, model_class: type) -> None:
    """`Transformer(config)` builds `model_class` for a config of `config_class` (a family's own); one
    model class per config class."""
    if _MODELS.get(config_class, model_class) is not model_class:
        raise ConfigError(f"{config_class.__name__} already builds {_MODELS[config_class].__name__}, not "
                          f"{model_class.__name__}: a family with a model of its own has a config class of its own")
    _MODELS[config_class] = model_class


class ForwardOutput(NamedTuple):
    """What `Transformer.__call__` returns, whatever its flags; a part not asked for is `None`.

    Attributes:
      logits: `[B, L, V]` (or `[B, length, V]` with `logits_slice`) float32, raw: with
        `config.shift_logits`, position i-1 predicts token i (see `align_logits`).
      cache: the updated `KVCache` when the call was given one, else `None`.
      router_loads: `[num_moe_layers, E]` int32, the rows each routed expert ran in this call,
        when asked for (`return_router_loads=True`) and the model has MoE layers; else `None`
        (a dense model has no routers, so it has no loads to report).
      hidden: `[B, L or length, D]` the last layer's output after the final norm (what the LM
        head reads, `Transformer.unembed`), at the logits' positions, when asked for
        (`return_hidden=True`; heads that predict from it, e.g. Medusa's); else `None`.
    """

    logits: jax.Array
    cache: KVCache | None = None
    router_loads: jax.Array | None = None
    hidden: jax.Array | None = None


def stack_layers(blocks: list[Block]) -> Block:
    """One `Block` whose every parameter is the layers' parameters stacked on a new leading axis
    (logical axis `layers`)."""
    graphdef, _ = nnx.split(blocks[0])
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(b) for b in blocks])
    for _, var in nnx.to_flat_state(stacked):
        axes = var.get_metadata().get("logical_axes")
        if axes is not None:
            var.set_metadata(logical_axes=("layers", *axes))
    return nnx.merge(graphdef, stacked)


class Transformer(nnx.Module):
    """Decoder-only transformer; `model(input_ids)` runs the config's default attention.

    `Transformer(config, ...)` builds the model class registered for the config's class (a family's
    subclass, `register_model`), else this one."""

    # The keyword arguments a family's forward adds (`__call__(**inputs)`); none here.
    forward_inputs: tuple[str, ...] = ()

    def __new__(cls, config: ModelConfig | None = None, *args, **kwargs):
        if cls is Transformer and config is not None:  # (copy and pickle call __new__ without arguments)
            cls = _MODELS.get(type(config), Transformer)
        return super().__new__(cls)

    def __init__(self, config: ModelConfig, options: RunOptions | None = None, *, rngs: nnx.Rngs):
        """`config`: what the model is; `options`: how it runs (default `RunOptions()`: float32,
        automatic attention backend, unrolled layers, no remat, float weights)."""
        options = RunOptions() if options is None else options
        if options.scan_layers and not config.identical_layers:
            raise ConfigError(f"scan_layers needs identical layers, but this MoE model mixes "
                              f"{config.experts.first_dense_layers} dense layer(s) with MoE layers; "
                              "set scan_layers=False")
        self.config = config
        self.options = options
        pd = options.jnp_param_dtype
        self.embed = nnx.Param(_init(rngs.params(), (config.vocab_size, config.embed_dim), pd),
                               logical_axes=("vocab", "embed"))
        blocks = [self.make_layer(config, options, i, rngs=rngs) for i in range(config.num_layers)]
        self.layers = stack_layers(blocks) if options.scan_layers else nnx.List(blocks)
        self.final_norm = RMSNorm(config.embed_dim, config.norm_eps, param_dtype=pd)
        self.lm_head = nnx.data(None)  # tied embeddings: the embedding table's transpose
        self.lm_head_scale = nnx.data(None)  # int8: per-vocabulary-entry scales
        if not config.tie_embeddings:
            head = _init(rngs.params(), (config.embed_dim, config.vocab_size), pd)
            if options.quantization == "int8":
                head, scale = quantize.quantize_kernel(head, (1, config.vocab_size))
                self.lm_head_scale = nnx.Param(scale, logical_axes=(None, "vocab"))
            self.lm_head = nnx.Param(head, logical_axes=("embed", "vocab"))

    @classmethod
    def make_layer(cls, config: ModelConfig, options: RunOptions, index: int, *, rngs: nnx.Rngs) -> nnx.Module:
        """Decoder layer `index`: `layer(x [B, L, D], positions, mask, inv_freq, kv_cache slot, **layer_inputs)
        -> (x [B, L, D], slot, router load [E] or None)`. Here the LLaMA-style `Block`."""
        return Block(config, options, index, rngs=rngs)

    def with_options(self, **changes) -> "Transformer":
        """A view of this model (the same parameter arrays) that runs with `options` changed.

        Only what does not change the parameters' layout may change here (`dtype`,
        `attention_impl`, `moe_impl`, `remat`); a different `param_dtype`, `scan_layers` or `quantization` is a
        different set of parameters: load the checkpoint with it (`from_pretrained(...)`), or use
        `jaxdllm.models.quantize.quantize_weights`.
        """
        fixed = sorted(set(changes) & set(LAYOUT_OPTIONS))
        if fixed:
            raise ConfigError(f"with_options cannot change {fixed}: they fix the parameters' layout; load the "
                              "checkpoint with them instead")
        options = self.options.replace(**changes)
        view = nnx.merge(*nnx.split(self))
        for _, module in nnx.iter_modules(view):
            if module is view:
                continue
            for name, option in _FOLLOWED_OPTIONS.items():
                if name in vars(module):
                    setattr(module, name, getattr(options, option))
        view.options = options
        return view

    def init_cache(self, batch_size: int, max_length: int, dtype=None) -> KVCache:
        """An empty `KVCache` for this model: `max_length` slots per row, per layer (one stacked
        array with `scan_layers`), in `dtype` (default: the compute dtype)."""
        return KVCache.init(self.config, batch_size, max_length, self.options.jnp_dtype if dtype is None else dtype,
                            stacked=self.options.scan_layers)

    def default_mask(self) -> MaskSpec:
        """The config's attention mode over the whole input, no padding."""
        return MaskSpec(kind=self.config.attention, block_size=self.config.block_size)

    def __call__(self, input_ids: jax.Array, positions: jax.Array | None = None,
                 attention: MaskSpec | None = None, cache: KVCache | None = None,
                 logits_slice: tuple[jax.Array | int, int] | None = None,
                 return_router_loads: bool = False, *, return_hidden: bool = False, **inputs) -> ForwardOutput:
        """Logits for `input_ids` (and the updated cache, and the router loads when asked for).

        Args:
          input_ids: `[B, L]` int token ids.
          positions: `[B, L]` logical RoPE positions; default `q_offset + arange(L)`.
          attention: a `MaskSpec`; default `default_mask()`. With a cache, the queries sit at
            physical offset `attention.q_offset` in the cache.
          cache: optional `KVCache`. This call's K/V are written at `attention.q_offset` and
            its queries attend to every slot; `attention.kv_segment_ids` is replaced by the
            cache's segment ids (this call's `q_segment_ids`, default 1, are written too).
          logits_slice: optional `(start, length)` (start may be traced): compute logits only
            for input positions `[start, start + length)`, skipping the LM head elsewhere.
          return_router_loads: fill `router_loads [num_moe_layers, E]` int32 (MoE models; a dense
            model's stays `None`).
          return_hidden: fill `hidden [B, L or length, D]`, the final-normed hidden states at the
            logits' positions.
          **inputs: a family's own forward inputs (`forward_inputs`; none for this class).

        Returns:
          A `ForwardOutput(logits, cache, router_loads, hidden)`, the same type for every flag
          combination: `logits [B, L, V]` (or `[B, length, V]` with `logits_slice`) float32; `cache`
          the updated cache, or `None` without one; `router_loads` and `hidden` as above, else `None`.
        """
        with_loads = return_router_loads and self.config.experts is not None
        unknown = sorted(set(inputs) - set(self.forward_inputs))
        if unknown:
            raise ConfigError(f"{type(self).__name__} takes no forward input(s) {unknown} (its own: "
                              f"{list(self.forward_inputs) or 'none'}); they belong to another model family")
        if shd.explicit_context() is not None:
            out = self._call_with_auto_axes(input_ids, positions, attention, cache, logits_slice, with_loads, inputs)
        else:
            out = self._forward(input_ids, positions, attention, cache, logits_slice, inputs)
        out = out if return_hidden else out._replace(hidden=None)
        return out if with_loads else out._replace(router_loads=None)

    def _call_with_auto_axes(self, input_ids, positions, attention, cache, logits_slice, with_loads, inputs):
        """`__call__` inside `jax.set_mesh(mesh)` with Explicit axes (a `jax.make_mesh` mesh): the body
        runs with the mesh's axes in Auto mode (`jax.sharding.auto_axes`) and the outputs come back
        sharded over the batch axes (logits also over `vocab`)."""
        mesh = shd.explicit_context()
        graphdef, state = nnx.split(self)
        b, l = input_ids.shape
        length = l if logits_slice is None else logits_slice[1]
        start = None if logits_slice is None else logits_slice[0]

        # array inputs go through as arguments; the rest (flags) are closed over
        arrays = {k: v for k, v in inputs.items() if isinstance(v, jax.Array | np.ndarray)}
        static = {k: v for k, v in inputs.items() if k not in arrays}

        def body(state, input_ids, positions, attention, cache, start, arrays):
            where = None if logits_slice is None else (start, logits_slice[1])
            out = nnx.merge(graphdef, state)._forward(input_ids, positions, attention, cache, where,
                                                      {**static, **arrays})
            return out if with_loads else out._replace(router_loads=None)

        spec = lambda axes, shape: shd.logical_to_spec(axes, shape, mesh)
        d = self.config.embed_dim
        kv = lambda x: spec(("layers", "batch", "length", "kv_heads", "head_dim")[-x.ndim:], x.shape)
        out = ForwardOutput(
            logits=spec(("batch", "length", "vocab"), (b, length, self.config.vocab_size)),
            cache=None if cache is None else KVCache(k=jax.tree.map(kv, cache.k), v=jax.tree.map(kv, cache.v),
                                                     segment_ids=spec(("batch", "length"), cache.segment_ids.shape)),
            router_loads=jax.sharding.PartitionSpec() if with_loads else None,  # loads: replicated
            hidden=spec(("batch", "length", "embed"), (b, length, d)))
        return jax.sharding.auto_axes(body, out_sharding=out)(state, input_ids, positions, attention, cache, start,
                                                              arrays)

    def _forward(self, input_ids, positions, attention, cache, logits_slice, inputs) -> ForwardOutput:
        """The forward itself; an MoE model's router loads are always filled (`__call__` drops them)."""
        c = self.config
        b, l = input_ids.shape
        mask = self.default_mask() if attention is None else attention
        if isinstance(mask, SharedView):  # rows reading views of shared blocks (`jaxdllm.attention.shared_view`)
            if cache is None or positions is None:
                raise ConfigError("a SharedView forward needs the shared blocks' cache and the tokens' positions")
            mask = mask.written(cache.segment_ids)
        elif positions is None:
            positions = jnp.broadcast_to(jnp.asarray(mask.q_offset, jnp.int32) + jnp.arange(l), (b, l))
        if cache is not None and not isinstance(mask, SharedView):
            q_seg = (jnp.ones((b, l), jnp.int32) if mask.q_segment_ids is None
                     else jnp.asarray(mask.q_segment_ids, jnp.int32))
            kv_seg = jax.lax.dynamic_update_slice(cache.segment_ids, q_seg, (0, mask.q_offset))
            mask = mask.replace(q_segment_ids=q_seg, kv_segment_ids=kv_seg)
        inv_freq = rope_inv_freq(c.rope_dim, c.rope_theta, c.rope_scaling)

        x = shd.constrain(self.embed_inputs(input_ids, **inputs), ("batch", "length", "embed"))
        kv = None if cache is None else (cache.k, cache.v)
        extra = self.layer_inputs(**inputs)
        if self.options.scan_layers:
            x, kv, loads = self._scan_layers(x, positions, mask, inv_freq, kv, extra)
        else:
            x, kv, loads = self._unrolled_layers(x, positions, mask, inv_freq, kv, extra)
        if logits_slice is not None:
            x = jax.lax.dynamic_slice_in_dim(x, logits_slice[0], logits_slice[1], axis=1)
        x = self.norm_output(x)
        logits = self.unembed(x)
        new_cache = None if cache is None else KVCache(k=kv[0], v=kv[1], segment_ids=mask.kv_segment_ids)
        return ForwardOutput(logits, new_cache, loads, x)

    def embed_inputs(self, input_ids: jax.Array, **inputs) -> jax.Array:
        """The first layer's input `[B, L, D]` (compute dtype) for `input_ids [B, L]`: the embedding rows.
        `inputs`: a family's own forward inputs (none here)."""
        return jnp.take(self.embed[...], input_ids, axis=0).astype(self.options.jnp_dtype)

    def layer_inputs(self, **inputs) -> dict:
        """The keyword arguments every layer call gets, from the forward's `inputs` (none here)."""
        return {}

    def norm_output(self, x: jax.Array) -> jax.Array:
        """The final norm of the last layer's output `[B, L, D]`."""
        return self.final_norm(x)

    def unembed(self, hidden: jax.Array) -> jax.Array:
        """The LM head: float32 logits `[..., L, V]` of final-normed `hidden [..., L, D]` (the
        checkpoint's head or the tied embedding, int8 dequantised)."""
        dtype = self.options.jnp_dtype
        if self.lm_head_scale is not None:
            head = quantize.dequantize(self.lm_head[...], self.lm_head_scale[...], dtype)
        else:
            head = (self.embed[...].T if self.lm_head is None else self.lm_head[...]).astype(dtype)
        logits = jnp.einsum("...ld,dv->...lv", hidden.astype(dtype), head, preferred_element_type=jnp.float32)
        return shd.constrain(logits, ("batch", "length", "vocab")) if logits.ndim == 3 else logits

    def _layer_fn(self, graphdef, positions, mask, inv_freq, extra=None):
        """`(params, x, slot) -> (x, slot, load)` for one layer, rematerialised per `options.remat`."""
        extra = extra or {}

        def run(params, x, slot):
            x, slot, load = nnx.merge(graphdef, params)(x, positions, mask, inv_freq, slot, **extra)
            return shd.constrain(x, ("batch", "length", "embed")), slot, load

        remat = self.options.remat
        if remat == "none":
            return run
        return jax.checkpoint(run, policy=_REMAT[remat], prevent_cse=not self.options.scan_layers)

    def _unrolled_layers(self, x, positions, mask, inv_freq, kv, extra=None):
        new_k, new_v, loads = [], [], []
        for i, block in enumerate(self.layers):
            graphdef, params = nnx.split(block)
            slot = None if kv is None else (kv[0][i], kv[1][i])
            x, slot, load = self._layer_fn(graphdef, positions, mask, inv_freq, extra)(params, x, slot)
            if slot is not None:
                new_k.append(slot[0])
                new_v.append(slot[1])
            if load is not None:
                loads.append(load)
        return x, (None if kv is None else (tuple(new_k), tuple(new_v))), (jnp.stack(loads) if loads else None)

    def _scan_layers(self, x, positions, mask, inv_freq, kv, extra=None):
        graphdef, params = nnx.split(self.layers)
        layer = self._layer_fn(graphdef, positions, mask, inv_freq, extra)

        if kv is None:
            def body(x, layer_params):
                x, _, load = layer(layer_params, x, None)
                return x, load

            x, loads = jax.lax.scan(body, x, params)
            return x, None, loads

        # The cache rides in the carry and each layer writes its slot back with a dynamic update
        # slice of the carried buffer (a stacked scan output would allocate a second cache per call).
        def body_cached(carry, xs):
            x, k, v = carry
            i, layer_params = xs
            slot = (jax.lax.dynamic_index_in_dim(k, i, keepdims=False), jax.lax.dynamic_index_in_dim(v, i, keepdims=False))
            x, (sk, sv), load = layer(layer_params, x, slot)
            k = jax.lax.dynamic_update_index_in_dim(k, sk.astype(k.dtype), i, 0)
            v = jax.lax.dynamic_update_index_in_dim(v, sv.astype(v.dtype), i, 0)
            return (x, k, v), load

        (x, k, v), loads = jax.lax.scan(body_cached, (x, kv[0], kv[1]), (jnp.arange(self.config.num_layers), params))
        return x, (k, v), loads


def align_logits(logits: jax.Array, config: ModelConfig) -> jax.Array:
    """Logits `[B, L, V]` re-indexed so that `out[:, i]` predicts token i.

    For token-shifted models (Dream, Fast-dLLM v2) `out[:, i] = logits[:, i-1]` and position 0
    keeps its own logits (Dream's convention); otherwise `logits` unchanged.
    """
    if not config.shift_logits:
        return logits
    return jnp.concatenate([logits[:, :1], logits[:, :-1]], axis=1)
