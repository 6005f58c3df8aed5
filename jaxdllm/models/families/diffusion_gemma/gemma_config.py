"""DiffusionGemma's config: `ModelConfig` with Gemma 4's layer settings (`Gemma4Layers`), and the
presets.

Gemma 4's layers differ from the shared LLaMA-style block: sliding and full attention layers of
different shapes, a dense MLP beside routed experts in every layer, a final logit softcap. These
settings live here, on the family's own config class (`DiffusionGemmaConfig.gemma4`); the shared
`ModelConfig` knows nothing of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from jaxdllm.errors import ConfigError
from jaxdllm.models.config import ExpertConfig, ModelConfig
from jaxdllm.validation import check_fields, require_positive_int

LAYER_TYPES = ("sliding", "full")
VOCAB_SIZE = 262144
CANVAS = 256


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
    def from_dict(cls, data: Mapping[str, Any], base: "Gemma4Layers | None" = None) -> "Gemma4Layers":
        """Settings from a table of these fields, over `base`'s where the table leaves one out."""
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"unknown gemma4 setting(s) {unknown}; known: {[f.name for f in dataclasses.fields(cls)]}")
        return cls(**{**(dataclasses.asdict(base) if base is not None else {}), **data})


@dataclasses.dataclass(frozen=True)
class DiffusionGemmaConfig(ModelConfig):
    """A `ModelConfig` of Gemma 4 layers: the shared fields, plus `gemma4` (`Gemma4Layers`, required).

    Sliding layers take the shared `num_kv_heads`, `head_dim` and `rope_theta`; full layers take
    `gemma4.full_kv_heads` / `full_head_dim` (`kv_shape`). Built by `ModelConfig.preset` from a
    DiffusionGemma preset and by config.json import; `replace(gemma4={...})` changes some settings.
    """

    checkpoint_format: str = "diffusion_gemma"
    model_type: str = "diffusion_gemma"
    gemma4: Gemma4Layers | None = None

    settings_tables: ClassVar[Mapping[str, type]] = {**ModelConfig.settings_tables, "gemma4": Gemma4Layers}

    def __post_init__(self):
        super().__post_init__()
        g = self.gemma4
        if g is None:
            raise ConfigError("a DiffusionGemma config needs its layer settings: gemma4=Gemma4Layers(...)")
        if len(g.layer_types) != self.num_layers:
            raise ConfigError(f"gemma4.layer_types lists {len(g.layer_types)} layers; the model has "
                              f"{self.num_layers}")
        if self.num_heads % g.full_kv_heads:
            raise ConfigError(f"num_heads ({self.num_heads}) must be a multiple of gemma4.full_kv_heads "
                              f"({g.full_kv_heads})")
        if self.experts is not None and self.experts.first_dense_layers:
            raise ConfigError("Gemma 4 layers run their experts beside the dense MLP in every layer: "
                              "first_dense_layers must be 0")

    def kv_shape(self, index: int) -> tuple[int, int]:
        """`(kv heads, head dim)` of layer `index`: full layers have their own."""
        if self.gemma4.layer_types[index] == "full":
            return self.gemma4.full_kv_heads, self.gemma4.full_head_dim
        return self.num_kv_heads, self.head_dim

    @property
    def identical_layers(self) -> bool:
        return len(set(self.gemma4.layer_types)) == 1 and super().identical_layers


def published_layer_types(num_layers: int, every: int = 6) -> tuple[str, ...]:
    """Gemma 4's pattern: a full layer every `every` layers, and always as the last layer."""
    types = ["full" if (i + 1) % every == 0 else "sliding" for i in range(num_layers)]
    types[-1] = "full"
    return tuple(types)


def _config(num_layers, embed_dim, num_heads, kv_heads, head_dim, full_kv_heads, full_head_dim, mlp_dim, window,
            experts, vocab=VOCAB_SIZE, canvas=CANVAS, max_position=262144, layer_types=None) -> DiffusionGemmaConfig:
    return DiffusionGemmaConfig(
        vocab_size=vocab, embed_dim=embed_dim, num_layers=num_layers, num_heads=num_heads, num_kv_heads=kv_heads,
        head_dim=head_dim, mlp_dim=mlp_dim, attention="bidirectional", block_size=canvas, tie_embeddings=True,
        rope_theta=10000.0, norm_eps=1e-6, max_position=max_position, eos_token_id=1, pad_token_id=0,
        bos_token_id=2, eot_token_id=106 if vocab > 106 else None, checkpoint_format="diffusion_gemma",
        model_type="diffusion_gemma", experts=experts,
        gemma4=Gemma4Layers(layer_types=layer_types or published_layer_types(num_layers), sliding_window=window,
                            full_head_dim=full_head_dim, full_kv_heads=full_kv_heads))


PRESETS = {
    # google/diffusiongemma-26B-A4B-it: 25.25B text parameters, ~3.8B active per token.
    "diffusiongemma-26b-a4b": _config(30, 2816, 16, 8, 256, 2, 512, 2112, 1024,
                                      ExpertConfig(num_experts=128, experts_per_token=8, expert_dim=704)),
    # Tiny size for tests (random weights, fp32): two sliding layers then two full ones.
    "tiny-diffusiongemma": _config(4, 64, 4, 2, 16, 1, 32, 96, 8,
                                   ExpertConfig(num_experts=8, experts_per_token=2, expert_dim=24),
                                   vocab=256, canvas=8, max_position=512,
                                   layer_types=("sliding", "sliding", "full", "full")),
}
CHECKPOINTS = {"google/diffusiongemma-26B-A4B-it": "diffusiongemma-26b-a4b"}
