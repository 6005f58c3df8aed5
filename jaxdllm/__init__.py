"""jaxdllm: parallel decoding of language models (diffusion LLMs, Jacobi decoding) in JAX."""

from jaxdllm.attention import MaskSpec, attend
from jaxdllm.checkpoint import CheckpointError, from_pretrained, load_state, save_pretrained, save_state
from jaxdllm.models import ConfigError, KVCache, ModelConfig, Transformer, align_logits
from jaxdllm.sampler import GenerateResult, SamplerConfig, generate, generate_stepwise
from jaxdllm.tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = ["CheckpointError", "ConfigError", "GenerateResult", "KVCache", "MaskSpec", "ModelConfig",
           "SamplerConfig", "Tokenizer",
           "Transformer", "align_logits", "attend", "from_pretrained", "generate", "generate_stepwise", "load_state",
           "save_pretrained", "save_state"]
