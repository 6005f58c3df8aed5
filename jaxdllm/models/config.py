"""`ModelConfig`: one validated dataclass for LLaDA, Dream, Qwen2, Llama, block-diffusion and LLaDA2
models.

Presets carry the published sizes; each model family keeps its own (`jaxdllm.models.families`) and
registers them here for `ModelConfig.preset`. A config is immutable and hashable, so it can be a
static jit argument.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Mapping

from jaxdllm.errors import ConfigError
from jaxdllm.validation import check_fields, require_positive_int

AttentionMode = Literal["bidirectional", "causal", "block_causal"]
ATTENTION_MODES = ("bidirectional", "causal", "block_causal")
# Which tensor names a checkpoint uses: LLaDA's OLMo-derived names or HF Llama/Qwen2 names
# (each family's `tensor_table` in jaxdllm.models.families).
CHECKPOINT_FORMATS = ("llada", "hf", "llada2", "diffusion_gemma")  # llada2: LLaDA2's fused qkv and per-expert names
LAYER_TYPES = ("sliding", "full")
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
class Gemma4Layers:
    """Gemma 4's layers (DiffusionGemma): sliding and full attention layers, each with a dense MLP and
    routed experts side by side, and the numerics that differ from the LLaMA-style block.

    Sliding layers use `ModelConfig.num_kv_heads`, `head_dim` and `rope_theta` (RoPE on the whole
    head); full layers have their own shape, share one projection for K and V (V is the raw K
    projection through a scale-free RMSNorm) and rotate only a fraction of their frequencies
    ("proportional" RoPE: the frequencies of the whole head dim, the rest set to zero).

    Attributes:
      layer_types: per layer, `"sliding"` or `"full"`.
      sliding_window: W: a sliding layer's query sees at most W keys back (see `MaskSpec.window`).
      full_head_dim, full_kv_heads: the full layers' head dim and K/V heads (`global_head_dim`,
        `num_global_key_value_heads`).
      full_rope_theta, full_rotary_fraction: the full layers' RoPE base and the fraction of their
        frequency pairs that rotate (`partial_rotary_factor`).
      final_softcap: logits become `cap * tanh(logits / cap)` (None: no cap).
    """

    layer_types: tuple[str, ...]
    sliding_window: int
    full_head_dim: int
    full_kv_heads: int
    full_rope_theta: float = 1_000_000.0
    full_rotary_fraction: float = 0.25
    final_softcap: float | None = 30.0

    def __post_init__(self):
        if isinstance(self.layer_types, list):
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        check_fields(self, "gemma4.")
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad or not self.layer_types:
            raise ConfigError(f"gemma4.layer_types must list {LAYER_TYPES} per layer, got {bad or 'none'}")
        for name in ("sliding_window", "full_head_dim", "full_kv_heads"):
            require_positive_int(getattr(self, name), name)
        rotated = self.full_head_dim * self.full_rotary_fraction
        if self.full_head_dim % 2 or not 0 < self.full_rotary_fraction <= 1 or rotated % 2:
            raise ConfigError(f"full layers rotate an even number of dims of an even head: full_head_dim "
                              f"{self.full_head_dim} x full_rotary_fraction {self.full_rotary_fraction}")
        if self.full_rope_theta <= 0 or (self.final_softcap is not None and self.final_softcap <= 0):
            raise ConfigError("full_rope_theta and final_softcap must be positive")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Gemma4Layers":
        return cls(**data)


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
      gemma4: Gemma 4's layers (`Gemma4Layers`: DiffusionGemma); None for the LLaMA-style block.
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
    gemma4: Gemma4Layers | None = None
    source_config: dict | None = dataclasses.field(default=None, compare=False, hash=False, repr=False)

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
        if self.checkpoint_format not in CHECKPOINT_FORMATS:
            raise ConfigError(
                f"checkpoint_format must be one of {CHECKPOINT_FORMATS}, got {self.checkpoint_format!r}")
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
        g = self.gemma4
        if g is not None:
            if len(g.layer_types) != self.num_layers:
                raise ConfigError(f"gemma4.layer_types lists {len(g.layer_types)} layers; the model has "
                                  f"{self.num_layers}")
            if self.num_heads % g.full_kv_heads:
                raise ConfigError(f"num_heads ({self.num_heads}) must be a multiple of gemma4.full_kv_heads "
                                  f"({g.full_kv_heads})")
            if self.experts is not None and self.experts.first_dense_layers:
                raise ConfigError("Gemma 4 layers run their experts beside the dense MLP in every layer: "
                                  "first_dense_layers must be 0")

    # -- derived ------------------------------------------------------------------------------
    def kv_shape(self, index: int) -> tuple[int, int]:
        """`(kv heads, head dim)` of layer `index` (Gemma 4's full layers have their own)."""
        if self.gemma4 is not None and self.gemma4.layer_types[index] == "full":
            return self.gemma4.full_kv_heads, self.gemma4.full_head_dim
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
        if self.gemma4 is not None and len(set(self.gemma4.layer_types)) > 1:
            return False
        return self.num_moe_layers in (0, self.num_layers)

    @property
    def num_params(self) -> int:
        """Every parameter (all experts; the MoE routers' expert biases included)."""
        return self._count_params(active=False)

    @property
    def active_params(self) -> int:
        """Parameters one token's forward touches: routed experts count `experts_per_token` times
        (the whole model for a dense config)."""
        return self._count_params(active=True)

    def _count_params(self, active: bool) -> int:
        if self.gemma4 is not None:
            return self._count_gemma4_params(active)
        d, h, kv, hd, m, v = (self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim,
                              self.mlp_dim, self.vocab_size)
        attn = d * hd * (h + 2 * kv) + h * hd * d
        attn += (h + 2 * kv) * hd * self.qkv_bias + d * self.out_bias + 2 * hd * self.qk_norm
        dense_mlp = 3 * d * m + (2 * m + d) * self.mlp_bias
        total = self.num_layers * (attn + 2 * d) + v * d * (1 if self.tie_embeddings else 2) + d
        e, moe = self.experts, self.num_moe_layers
        if e is None:
            return total + self.num_layers * dense_mlp
        routed = e.experts_per_token if active else e.num_experts
        moe_mlp = (3 * d * e.expert_dim * (routed + e.num_shared_experts)
                   + e.num_experts * (d + 1))  # router weights + expert bias
        return total + moe * moe_mlp + (self.num_layers - moe) * dense_mlp

    def _count_gemma4_params(self, active: bool) -> int:
        """Gemma 4 layers (two layer scalars each: the encoder's and the decoder's), the tied
        embedding, the final norm and the self-conditioning MLP."""
        d, h, m, v = self.embed_dim, self.num_heads, self.mlp_dim, self.vocab_size
        total = v * d * (1 if self.tie_embeddings else 2) + d + (3 * d * m + d)
        for i in range(self.num_layers):
            kv, hd = self.kv_shape(i)
            sliding = self.gemma4.layer_types[i] == "sliding"
            total += d * hd * (h + kv * (2 if sliding else 1)) + h * hd * d + 2 * hd + 2
            total += 3 * d * m + 7 * d  # dense MLP; input, post-attention and the five feed-forward norms
            e = self.experts
            if e is not None:
                routed = e.experts_per_token if active else e.num_experts
                total += 3 * d * e.expert_dim * routed + e.num_experts * (d + 1) + d  # + router scale
        return total

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with `changes` applied (and validated). `experts` may be a table of expert settings
        (a recipe's `[model.experts]`): it changes those of this config (`ExpertConfig.from_dict`)."""
        if isinstance(changes.get("experts"), Mapping):
            changes["experts"] = ExpertConfig.from_dict(changes["experts"], base=self.experts)
        if isinstance(changes.get("gemma4"), Mapping):
            base = dataclasses.asdict(self.gemma4) if self.gemma4 is not None else {}
            changes["gemma4"] = Gemma4Layers.from_dict({**base, **changes["gemma4"]})
        return dataclasses.replace(self, **changes)

    # -- serialisation (jaxdllm's own format; HF config.json: jaxdllm.models.families) ---------
    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "source_config"}
        for name in ("rope_scaling", "experts", "gemma4"):
            if out[name] is not None:
                out[name] = dataclasses.asdict(out[name])
        if out["gemma4"] is not None:
            out["gemma4"]["layer_types"] = list(out["gemma4"]["layer_types"])
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """The config `to_dict` wrote. Also reads the older layout with the expert settings as flat
        keys (`num_experts`, ...; `num_experts` 0 or absent: dense), as older `jaxdllm_config.json`
        files and training-checkpoint metadata hold them."""
        data = dict(data)
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
        if isinstance(data.get("experts"), dict):
            data["experts"] = ExpertConfig.from_dict(data["experts"])
        if isinstance(data.get("gemma4"), dict):
            data["gemma4"] = Gemma4Layers.from_dict(data["gemma4"])
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


# Fields the checkpoint itself determines; overriding them would mis-read its tensors.
CHECKPOINT_FIELDS = {"vocab_size", "embed_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                      "mlp_dim", "qkv_bias", "out_bias", "mlp_bias", "tie_embeddings",
                      "checkpoint_format", "source_config", "qk_norm", "rotary_fraction", "experts", "gemma4"}

# Presets by name, and published checkpoint names -> the preset of their shape. Each model family
# (`jaxdllm.models.families`, imported by `jaxdllm.models`) holds its own and registers them here.
PRESETS: dict[str, ModelConfig] = {}
CHECKPOINT_PRESETS: dict[str, str] = {}


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
