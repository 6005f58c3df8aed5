"""The recipe's `[lora]` section. The adapters themselves live in the model
(`jaxdllm.models.lora`): applied in the forward, merged only at export."""

from __future__ import annotations

import dataclasses

import jax

from jaxdllm.errors import ConfigError
from jaxdllm.models.lora import TARGETS
from jaxdllm.validation import check_fields


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """`rank` 0 disables LoRA. `targets` name projections among `TARGETS` (dParallel: all seven)."""

    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS

    def __post_init__(self):
        check_fields(self, "[lora] ")
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 0:
            raise ConfigError(f"lora.rank must be a non-negative integer, got {self.rank!r}")
        unknown = sorted(set(self.targets) - set(TARGETS))
        if unknown:
            raise ConfigError(f"lora.targets {unknown} are not LoRA targets; choose from {TARGETS}")
        if self.rank and not self.targets:
            raise ConfigError("lora.targets is empty: name at least one kernel")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def num_lora_params(lora: dict) -> int:
    """Trainable parameter count of a LoRA state: `sum rank * (in + out)` over the targets."""
    return sum(x.size for x in jax.tree.leaves(lora))
