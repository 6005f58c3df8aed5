"""Model definitions: config + presets, the NNX transformer, the K/V cache."""

from jaxdllm.errors import ConfigError
from jaxdllm.models.cache import KVCache
from jaxdllm.models.config import PRESETS, ModelConfig, RopeScaling
from jaxdllm.models.transformer import ForwardOutput, Transformer, align_logits

__all__ = ["PRESETS", "ConfigError", "ForwardOutput", "KVCache", "ModelConfig", "RopeScaling", "Transformer",
           "align_logits"]
