"""`Family`: what jaxdllm knows about one family of checkpoints (LLaDA, Dream, Qwen2/Llama, ...).

A family owns its model: its config class and model class (the shared `Transformer`, or a subclass
that picks its own layers behind `jaxdllm.models.transformer.MODEL_PROTOCOL`), how its checkpoints
are written down (the config.json `model_type`s it reads, config.json <-> config, the table from
its tensor names to parameters, the tensors it ignores), its presets, its parameter count (from
the model's abstract parameters, `nnx.eval_shape`), and how its checkpoints decode by default (the
sampler preset, the settings a checkpoint's own files publish).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Callable, Mapping, NamedTuple

import jax
import numpy as np
from flax import nnx

from jaxdllm.errors import ConfigError
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families.tensors import TensorMapping
from jaxdllm.models.run_options import RunOptions
from jaxdllm.models.transformer import MODEL_PROTOCOL, Transformer

# What every family must provide, checked by `check_family` when it is registered.
FAMILY_PROTOCOL = ("config_from_hf", "config_to_hf", "tensor_table", "default_preset", "sampler_settings",
                   "param_counts", "parameter_shapes", "ignores_tensor")


def model_type_of(raw: dict) -> str:
    """A parsed config.json's `model_type`, lower case (`""` when absent)."""
    return str(raw.get("model_type", "")).lower()


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family.

    Attributes:
      name: short name (`llada`, `dream`, ...).
      model_types: the config.json `model_type`s (lower case) whose checkpoints this family reads.
      checkpoint_format: its tensor names (`ModelConfig.checkpoint_format`).
      presets: name -> `ModelConfig`: the published sizes and tiny test sizes.
      config_from_hf: `(raw config.json, where) -> ModelConfig`; `where` names the file in errors.
      config_to_hf: `(config, out)`: writes this family's config.json keys into `out` (which
        starts as a copy of `config.source_config`, so keys the config does not model survive).
      tensor_table: `config -> [TensorMapping]`: every tensor a checkpoint holds, in file order.
      checkpoints: published checkpoint name (Hugging Face repository) -> the preset of its shape.
      reads: whether a parsed config.json is this family's; by default, when its `model_type` is
        one of `model_types`. A family that refines others (block diffusion: a Qwen2 config.json
        with `bd_size`) says so here and is registered before them.
      holds: whether a `ModelConfig` is this family's; by default, when its `checkpoint_format`
        and `model_type` are this family's.
      writes_special_ids: `config_to_hf` writes the special token ids itself (DiffusionGemma keeps
        them in `text_config`); otherwise they go at the top level of config.json.
      config_class: the class of its configs (`ModelConfig` or the family's subclass).
      model: its model class: the shared `Transformer` or the family's subclass (built by
        `Transformer(config)` for a config of `config_class`).
      preset: `config -> sampler preset name` a checkpoint decodes with unless told otherwise;
        default `jacobi` (greedy, exact) for a causal model, else `llada` (LLaDA's published sampler).
      generation_settings: `(checkpoint folder, config, preset) -> SamplerConfig keywords` the
        checkpoint's own files publish for that preset (beyond `jaxdllm_sampler.json`); none by default.
      ignored_tensors: name prefixes of checkpoint tensors this family's model does not use (skipped
        on import), and `ignored_why`, what they are (for the log line).
      fixed_block: the model decodes in blocks of its own `block_size` only, whatever the
        `gen_length` (DiffusionGemma's canvas): a requested length keeps that block.
      scores_likelihood: whether a log-likelihood can be read from one forward with the
        continuation masked (masked diffusion) or fed (causal); False for a family whose noise is
        not a mask (DiffusionGemma's uniform noise).
    """

    name: str
    model_types: tuple[str, ...]
    checkpoint_format: str
    presets: Mapping[str, ModelConfig]
    config_from_hf: Callable[[dict, str], ModelConfig]
    config_to_hf: Callable[[ModelConfig, dict], None]
    tensor_table: Callable[[ModelConfig], list[TensorMapping]]
    checkpoints: Mapping[str, str] = dataclasses.field(default_factory=dict)
    reads: Callable[[dict], bool] | None = None
    holds: Callable[[ModelConfig], bool] | None = None
    writes_special_ids: bool = False
    config_class: type = ModelConfig
    model: type = Transformer
    preset: Callable[[ModelConfig], str] | None = None
    generation_settings: Callable[[Path, ModelConfig, str], dict] | None = None
    ignored_tensors: tuple[str, ...] = ()
    ignored_why: str = ""
    fixed_block: bool = False
    scores_likelihood: bool = True

    def reads_hf(self, raw: dict) -> bool:
        """Whether the parsed config.json `raw` is a checkpoint of this family."""
        return self.reads(raw) if self.reads else model_type_of(raw) in self.model_types

    def holds_config(self, config: ModelConfig) -> bool:
        """Whether `config` is a model of this family (its export writes this family's layout)."""
        if self.holds:
            return self.holds(config)
        return config.checkpoint_format == self.checkpoint_format and config.model_type.lower() in self.model_types

    def default_preset(self, config: ModelConfig) -> str:
        """The sampler preset a checkpoint of `config` decodes with unless told otherwise."""
        if self.preset is not None:
            return self.preset(config)
        return "jacobi" if config.attention == "causal" else "llada"

    def sampler_settings(self, directory: Path, config: ModelConfig, preset: str) -> dict:
        """`SamplerConfig` keywords for `preset` from the checkpoint folder's own files (e.g. a
        `generation_config.json`); `{}` when the family publishes none for that preset."""
        return self.generation_settings(directory, config, preset) if self.generation_settings else {}

    def ignores_tensor(self, name: str) -> bool:
        """Whether checkpoint tensor `name` holds nothing this family's model uses."""
        return bool(self.ignored_tensors) and name.startswith(self.ignored_tensors)

    def parameter_shapes(self, config: ModelConfig, options: RunOptions | None = None) -> tuple:
        """`(shape, dtype, logical axes)` of every parameter of `config`'s model run with `options`
        (default `RunOptions()`), from `nnx.eval_shape` (nothing allocated; cached)."""
        return _parameter_shapes(self.model, config, RunOptions() if options is None else options)

    def param_counts(self, config: ModelConfig) -> "ParamCounts":
        """`ParamCounts(total, active)` of `config`'s model (float weights)."""
        return _param_counts(self.model, config)


class ParamCounts(NamedTuple):
    """A model's parameters: `total` (every expert) and `active` (one token's forward: a routed expert
    tensor, one whose first logical axis is `expert`, counts `experts_per_token / num_experts` of its size)."""

    total: int
    active: int


@functools.lru_cache(maxsize=64)
def _parameter_shapes(model: type, config: ModelConfig, options: RunOptions) -> tuple:
    _, state = nnx.split(nnx.eval_shape(lambda: model(config, options, rngs=nnx.Rngs(0))))
    out = []
    for var in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable)):
        value = var.get_value()
        axes = getattr(var, "logical_axes", None) or (None,) * len(value.shape)
        out.append((tuple(value.shape), np.dtype(value.dtype), tuple(axes)))
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _param_counts(model: type, config: ModelConfig) -> ParamCounts:
    total = routed = 0
    for shape, _, axes in _parameter_shapes(model, config, RunOptions()):
        total += math.prod(shape)
        if axes and axes[0] == "expert":
            routed += math.prod(shape)
    if config.experts is None:
        return ParamCounts(total, total)
    e = config.experts
    return ParamCounts(total, total - routed + routed * e.experts_per_token // e.num_experts)


def check_family(family) -> None:
    """Raise `ConfigError` naming what `family` lacks: a method of `FAMILY_PROTOCOL`, or a method
    of its model class (`MODEL_PROTOCOL`: embed, layers, final norm, unembed, cache); and check its
    presets are its own configs."""
    name = getattr(family, "name", repr(family))
    missing = [m for m in FAMILY_PROTOCOL if not callable(getattr(family, m, None))]
    if missing:
        raise ConfigError(f"model family {name!r} does not provide {missing}: every family provides "
                          f"{list(FAMILY_PROTOCOL)} (jaxdllm.models.families.family.Family)")
    model = getattr(family, "model", None)
    lacking = [m for m in MODEL_PROTOCOL if not callable(getattr(model, m, None))]
    if not isinstance(model, type) or lacking:
        raise ConfigError(f"model family {name!r}: its model {model!r} lacks {lacking or list(MODEL_PROTOCOL)}; "
                          f"a model class provides {list(MODEL_PROTOCOL)} (jaxdllm.models.transformer)")
    for preset, config in family.presets.items():
        if not isinstance(config, family.config_class) or not family.holds_config(config):
            raise ConfigError(f"model family {name!r}: preset {preset!r} is not one of its configs "
                              f"({family.config_class.__name__}, checkpoint_format={family.checkpoint_format!r})")
