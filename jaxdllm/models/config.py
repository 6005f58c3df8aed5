"""`ModelConfig`: one validated dataclass for the models that run on the shared `Transformer`; a
family whose layers need settings of their own subclasses it in its own module
(`jaxdllm.models.families`).

Presets carry the published sizes; each model family keeps its own (`jaxdllm.models.families`) and
registers them here for `ModelConfig.preset`, with its checkpoint format, its config class (for
`ModelConfig.from_dict`) and its parameter count. A config is immutable and hashable, so it can be
a static jit argument.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Literal, Mapping

from jaxdllm.errors import ConfigError
from jaxdllm.validation import check_fields, require_positive_int

AttentionMode = Literal["bidirectional", "causal", "block_causal"]
ATTENTION_MODES = ("bidirectional", "causal", "block_causal")
# Which tensor names a checkpoint uses (each family's `tensor_table` in jaxdllm.models.families):
# filled in as the families are registered (`register_family_config`).
CHECKPOINT_FORMATS: set[str] = set()
ROPE_SCALING_TYPES = ("llama3", "linear")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling.

    `llama3` (Llama 3.1+): frequencies with wavelength above
    `original_max_position / low_freq_factor` are divided by `factor`, those below
    `original_max_position / high_freq_factor` are kept, in between they are interpolated.
    `linear`: positions are divided by `factor`.
    """

    type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self):
        check_fields(self, "rope_scaling ")
        if self.type not in ROPE_SCALING_TYPES:
            raise ConfigError(
                f"rope_scaling type {self.type!r} is not supported; use one of {ROPE_SCALING_TYPES}")
        if self.factor <= 0:
            raise ConfigError(f"rope_scaling factor must be > 0, got {self.factor}")
        if self.type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ConfigError("rope_scaling: high_freq_factor must exceed low_freq_factor")


@dataclasses.dataclass(frozen=True)
class ExpertConfig:
    """The routed experts of an MoE model (LLaDA2 / Ling; `jaxdllm.models.moe`). Names in
    parentheses are LLaDA2's config.json keys.

    Attributes:
      num_experts: routed experts per MoE layer (`num_experts`).
      experts_per_token: experts each token is routed to (`num_experts_per_tok`).
      expert_dim: SwiGLU width of one routed expert (`moe_intermediate_size`).
      num_shared_experts: always-on experts, run as one SwiGLU of width `expert_dim *
        num_shared_experts` added to the routed output (`num_shared_experts`).
      expert_groups, top_groups: group-limited routing: experts split into `expert_groups`
        contiguous groups; a token picks its experts from its `top_groups` best groups (`n_group`,
        `topk_group`).
      first_dense_layers: the first layers keep a dense `MLP` of width `ModelConfig.mlp_dim`
        (`first_k_dense_replace`); the rest are MoE layers. At most `ModelConfig.num_layers`
        (checked there).
      routed_scaling: routing weights (normalised to sum 1) are multiplied by this
        (`routed_scaling_factor`).
    """

    num_experts: int
    experts_per_token: int
    expert_dim: int
    num_shared_experts: int = 0
    expert_groups: int = 1
    top_groups: int = 1
    first_dense_layers: int = 0
    routed_scaling: float = 1.0

    def __post_init__(self):
        check_fields(self, "experts.")
        for name in ("num_experts", "experts_per_token", "expert_dim", "expert_groups", "top_groups"):
            require_positive_int(getattr(self, name), name)
        e, k, g = self.num_experts, self.experts_per_token, self.expert_groups
        if e % g:
            raise ConfigError(f"num_experts ({e}) must be a multiple of expert_groups ({g})")
        if self.top_groups > g:
            raise ConfigError(f"top_groups ({self.top_groups}) cannot exceed expert_groups ({g})")
        if g > 1 and e // g < 2:
            raise ConfigError(f"group-limited routing scores a group by its two best experts: "
                              f"num_experts / expert_groups must be >= 2, got {e} / {g}")
        if k > self.top_groups * (e // g):
            raise ConfigError(f"experts_per_token ({k}) exceeds the experts in the {self.top_groups} chosen "
                              f"groups ({self.top_groups * (e // g)})")
        if self.first_dense_layers < 0:
            raise ConfigError(f"first_dense_layers must be >= 0, got {self.first_dense_layers}")
        if self.num_shared_experts < 0:
            raise ConfigError(f"num_shared_experts must be >= 0, got {self.num_shared_experts}")
        if self.routed_scaling <= 0:
            raise ConfigError(f"routed_scaling must be > 0, got {self.routed_scaling}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base: "ExpertConfig | None" = None) -> "ExpertConfig | None":
        """Expert settings from a table of these fields, over `base`'s where the table leaves one
        out; None (a dense model) when `num_experts` is 0."""
        unknown = sorted(set(data) - set(EXPERT_FIELDS))
        if unknown:
            raise ConfigError(f"unknown expert setting(s) {unknown}; known: {list(EXPERT_FIELDS)}")
        values = {**(dataclasses.asdict(base) if base is not None else {}), **data}
        if values.get("num_experts") == 0:
            return None
        missing = [n for n in ("num_experts", "experts_per_token", "expert_dim") if n not in values]
        if missing:
            raise ConfigError(f"expert settings need {missing} (this model has no experts to take them from)")
        return cls(**values)


EXPERT_FIELDS = tuple(f.name for f in dataclasses.fields(ExpertConfig))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What a jaxdllm `Transformer` is: shape, numerics and special tokens.

    How it runs (parameter and compute dtypes, attention backend, scanned layers, remat, int8
    weights) is not part of it: see `jaxdllm.models.run_options.RunOptions`.

    Attributes:
      vocab_size: rows of the embedding table (LLaDA: `embedding_size`).
      embed_dim: model width D.
      num_layers, num_heads, num_kv_heads, head_dim: attention shape; `num_heads` must be a
        multiple of `num_kv_heads` (grouped-query attention).
      mlp_dim: SwiGLU hidden width.
      attention: default attention over the whole sequence: `bidirectional` (LLaDA, Dream),
        `causal` (Qwen2, Llama) or `block_causal` (block diffusion; needs `block_size`).
      block_size: block length for `block_causal` attention.
      qkv_bias / out_bias / mlp_bias: biases on q/k/v, the attention output, the MLP.
      tie_embeddings: logits use the transposed embedding table (no separate LM head).
      shift_logits: the logit at position i-1 predicts token i (Dream, Fast-dLLM v2). The
        model returns raw logits either way; samplers and losses read this flag.
      rope_theta, rope_scaling: rotary embedding base and optional frequency scaling.
      norm_eps: RMSNorm epsilon.
      max_position: longest sequence (prompt + generation) the model supports.
      mask_token_id, eos_token_id, eot_token_id, pad_token_id, bos_token_id: special ids.
      checkpoint_format: `llada`, `hf` (Qwen2/Llama tensor names) or `llada2`.
      model_type: the `model_type` written to config.json on export.
      qk_norm: RMSNorm over head_dim on q and k before RoPE (LLaDA2's `query_layernorm` /
        `key_layernorm`).
      rotary_fraction: RoPE rotates the first `head_dim * rotary_fraction` dims of each head; the
        rest pass through (LLaDA2's `partial_rotary_factor`, 0.5).
      experts: the routed-expert settings of an MoE model (`ExpertConfig`); None for a dense model
        (every layer an `MLP`).
      source_config: the config.json this came from; keys we do not model are written back.
    """

    vocab_size: int
    embed_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    attention: AttentionMode = "causal"
    block_size: int | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    tie_embeddings: bool = False
    shift_logits: bool = False
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    norm_eps: float = 1e-6
    max_position: int = 4096
    mask_token_id: int | None = None
    eos_token_id: int | None = None
    eot_token_id: int | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    checkpoint_format: str = "hf"
    model_type: str = "llama"
    qk_norm: bool = False
    rotary_fraction: float = 1.0
    experts: ExpertConfig | None = None
    source_config: dict | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)

    # Fields that hold a settings dataclass, which `replace`, `from_dict` and a recipe's
    # `[model.NAME]` table take as a table of its fields; a family's config class adds its own.
    settings_tables: ClassVar[Mapping[str, type]] = {"experts": ExpertConfig}

    def __post_init__(self):
        check_fields(self)
        for name in ("vocab_size", "embed_dim", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "mlp_dim", "max_position"):
            require_positive_int(getattr(self, name), name)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.attention not in ATTENTION_MODES:
            raise ConfigError(f"attention must be one of {ATTENTION_MODES}, got {self.attention!r}")
        if self.attention == "block_causal":
            if not self.block_size or self.block_size <= 0:
                raise ConfigError("attention='block_causal' needs a positive block_size")
        elif self.block_size is not None and self.block_size <= 0:
            raise ConfigError(f"block_size must be positive, got {self.block_size}")
        # A family's presets are built before the family is registered; registration checks their format.
        if CHECKPOINT_FORMATS and self.checkpoint_format not in CHECKPOINT_FORMATS:
            raise ConfigError(
                f"checkpoint_format must be one of {sorted(CHECKPOINT_FORMATS)}, got {self.checkpoint_format!r}")
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise ConfigError("rope_theta and norm_eps must be positive")
        for name in ("mask_token_id", "eos_token_id", "eot_token_id", "pad_token_id", "bos_token_id"):
            tid = getattr(self, name)
            if tid is not None and not 0 <= tid < self.vocab_size:
                raise ConfigError(f"{name}={tid} is outside the vocabulary [0, {self.vocab_size})")
        rope_dim = int(self.head_dim * self.rotary_fraction)
        if not 0 < self.rotary_fraction <= 1 or rope_dim % 2 or rope_dim == 0:
            raise ConfigError(f"rotary_fraction must be in (0, 1] and give an even number of rotated dims; "
                              f"head_dim {self.head_dim} x {self.rotary_fraction} = {self.head_dim * self.rotary_fraction}")
        if self.experts is not None and self.experts.first_dense_layers > self.num_layers:
            raise ConfigError(f"first_dense_layers must be in [0, num_layers={self.num_layers}], "
                              f"got {self.experts.first_dense_layers}")

    # -- derived ------------------------------------------------------------------------------
    def kv_shape(self, index: int) -> tuple[int, int]:
        """`(kv heads, head dim)` of layer `index` (the same for every layer here; a family whose
        layers differ overrides it): the shape of its K/V cache slot and of its attention heads."""
        return self.num_kv_heads, self.head_dim

    @property
    def rope_dim(self) -> int:
        """Dims of each head that RoPE rotates (`head_dim * rotary_fraction`)."""
        return int(self.head_dim * self.rotary_fraction)

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index` is an MoE layer (routed experts) rather than a dense MLP."""
        return self.experts is not None and index >= self.experts.first_dense_layers

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def identical_layers(self) -> bool:
        """Whether every layer has the same parameters' shapes (what `scan_layers` needs)."""
        return self.num_moe_layers in (0, self.num_layers)

    @property
    def num_params(self) -> int:
        """Every parameter (all experts; the MoE routers' expert biases included), counted by the
        config's family from its model's abstract parameters (`nnx.eval_shape`)."""
        return _count_params(self)[0]

    @property
    def active_params(self) -> int:
        """Parameters one token's forward touches: routed experts count `experts_per_token` times
        (the whole model for a dense config); counted as `num_params` is."""
        return _count_params(self)[1]

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with `changes` applied (and validated). `experts` may be a table of expert settings
        (a recipe's `[model.experts]`): it changes those of this config (`ExpertConfig.from_dict`)."""
        for name, settings in self.settings_tables.items():
            if isinstance(changes.get(name), Mapping):
                changes[name] = settings.from_dict(changes[name], base=getattr(self, name))
        return dataclasses.replace(self, **changes)

    # -- serialisation (jaxdllm's own format; HF config.json: jaxdllm.models.families) ---------
    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "source_config"}
        for name in ("rope_scaling", *self.settings_tables):
            if out[name] is not None:
                out[name] = {k: list(v) if isinstance(v, tuple) else v
                             for k, v in dataclasses.asdict(out[name]).items()}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """The config `to_dict` wrote. Also reads the older layout with the expert settings as flat
        keys (`num_experts`, ...; `num_experts` 0 or absent: dense), as older `jaxdllm_config.json`
        files and training-checkpoint metadata hold them. On `ModelConfig`, the config class of the
        family whose `checkpoint_format` the table names reads it."""
        data = dict(data)
        if cls is ModelConfig:
            cls = CONFIG_CLASSES.get(data.get("checkpoint_format"), cls)
        flat = {k: data.pop(k) for k in EXPERT_FIELDS if k in data}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown ModelConfig fields {unknown}")
        if flat:
            if data.get("experts") is not None:
                raise ConfigError(f"expert settings given both flat {sorted(flat)} and as experts")
            data["experts"] = ExpertConfig.from_dict(flat) if flat.get("num_experts") else None
        if isinstance(data.get("rope_scaling"), dict):
            data["rope_scaling"] = RopeScaling(**data["rope_scaling"])
        for name, settings in cls.settings_tables.items():
            if isinstance(data.get(name), dict):
                data[name] = settings.from_dict(data[name])
        return cls(**data)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "ModelConfig":
        """A published (or tiny test) configuration by preset name, or by the name of a published
        checkpoint of that shape (e.g. `inclusionAI/LLaDA2.0-mini`), with field overrides (as in
        `replace`: a table for `experts` changes the preset's expert settings)."""
        name = CHECKPOINT_PRESETS.get(name, name)
        if name not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
        return PRESETS[name].replace(**overrides)


# Fields the checkpoint itself determines; overriding them would mis-read its tensors (a family's
# config class adds its own settings tables, `checkpoint_fields`).
CHECKPOINT_FIELDS = {"vocab_size", "embed_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                      "mlp_dim", "qkv_bias", "out_bias", "mlp_bias", "tie_embeddings",
                      "checkpoint_format", "source_config", "qk_norm", "rotary_fraction", "experts"}


def checkpoint_fields(config_class: type[ModelConfig] = ModelConfig) -> set[str]:
    """The fields of `config_class` a checkpoint determines: `CHECKPOINT_FIELDS` and its settings tables."""
    return CHECKPOINT_FIELDS | set(config_class.settings_tables)

# Presets by name, and published checkpoint names -> the preset of their shape. Each model family
# (`jaxdllm.models.families`, imported by `jaxdllm.models`) holds its own and registers them here.
PRESETS: dict[str, ModelConfig] = {}
CHECKPOINT_PRESETS: dict[str, str] = {}
# checkpoint_format -> the config class of the family that writes it (`ModelConfig.from_dict`).
CONFIG_CLASSES: dict[str, type[ModelConfig]] = {}
# `config -> (num_params, active_params)`: the families' count (set by `jaxdllm.models.families`, which
# builds the models; this module cannot import it).
_PARAM_COUNTER: list[Callable[[ModelConfig], tuple[int, int]]] = []


def _count_params(config: ModelConfig) -> tuple[int, int]:
    if not _PARAM_COUNTER:
        raise ConfigError("parameter counts come from the model families: import jaxdllm.models first")
    return _PARAM_COUNTER[0](config)


def register_family_config(checkpoint_format: str, config_class: type[ModelConfig],
                           param_counter: Callable[[ModelConfig], tuple[int, int]]) -> None:
    """Make a family's checkpoint format and config class known here, and (once) the function that
    counts a config's parameters."""
    CHECKPOINT_FORMATS.add(checkpoint_format)
    CONFIG_CLASSES.setdefault(checkpoint_format, config_class)
    if not _PARAM_COUNTER:
        _PARAM_COUNTER.append(param_counter)


def register_presets(presets: Mapping[str, ModelConfig], checkpoints: Mapping[str, str] | None = None) -> None:
    """Make `presets` (name -> config) and `checkpoints` (published checkpoint name -> preset name)
    known to `ModelConfig.preset`; a name registered twice is an error."""
    for name, config in presets.items():
        if name in PRESETS:
            raise ConfigError(f"model preset {name!r} is registered twice")
        PRESETS[name] = config
    for name, preset in (checkpoints or {}).items():
        if name in CHECKPOINT_PRESETS or preset not in PRESETS:
            raise ConfigError(f"checkpoint {name!r}: registered twice, or its preset {preset!r} is unknown")
        CHECKPOINT_PRESETS[name] = preset
