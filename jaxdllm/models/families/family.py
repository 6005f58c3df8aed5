"""`Family`: what jaxdllm knows about one family of checkpoints (LLaDA, Dream, Qwen2/Llama, ...).

Every family runs on the one `Transformer`; a family only says how its checkpoints are written
down: the config.json `model_type`s it reads, its presets, config.json <-> `ModelConfig`, and the
table from its tensor names to `Transformer` parameters.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families.tensors import TensorMapping


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

    def reads_hf(self, raw: dict) -> bool:
        """Whether the parsed config.json `raw` is a checkpoint of this family."""
        return self.reads(raw) if self.reads else model_type_of(raw) in self.model_types

    def holds_config(self, config: ModelConfig) -> bool:
        """Whether `config` is a model of this family (its export writes this family's layout)."""
        if self.holds:
            return self.holds(config)
        return config.checkpoint_format == self.checkpoint_format and config.model_type.lower() in self.model_types
