"""Model definitions: config + presets (what a model is, held by the model families), run options
(how it runs), the NNX transformer, the K/V cache."""

from jaxdllm.errors import ConfigError
from jaxdllm.models.cache import KVCache
from jaxdllm.models.config import PRESETS, ExpertConfig, ModelConfig, RopeScaling
from jaxdllm.models.families import FAMILIES  # registers every family's presets
from jaxdllm.models.medusa import MedusaHeads
from jaxdllm.models.run_options import RunOptions
from jaxdllm.models.transformer import ForwardOutput, Transformer, align_logits

__all__ = ["FAMILIES", "PRESETS", "ConfigError", "ExpertConfig", "ForwardOutput", "KVCache", "MedusaHeads", "ModelConfig",
           "RopeScaling", "RunOptions", "Transformer", "align_logits"]
