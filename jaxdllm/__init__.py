"""jaxdllm: parallel decoding of language models (diffusion LLMs, Jacobi decoding) in JAX."""

from jaxdllm.attention import MaskSpec, attend
from jaxdllm.checkpoint import Checkpoint, from_pretrained, load_state, save_pretrained, save_state
from jaxdllm.compilation_cache import enable_compilation_cache
from jaxdllm.decoding import GenerateResult, Sampler, SamplerConfig, generate, generate_stepwise
from jaxdllm.errors import CheckpointError, ConfigError
from jaxdllm.models import ForwardOutput, KVCache, ModelConfig, RunOptions, Transformer, align_logits
from jaxdllm.pretrained import Pretrained, companions, load, policy_params, sampler_defaults
from jaxdllm.shipped import checkpoint_dir, recipe_path
from jaxdllm.tokenizer import TokenBatch, Tokenizer

__version__ = "0.1.0"

__all__ = ["Checkpoint", "CheckpointError", "ConfigError", "ForwardOutput", "GenerateResult", "KVCache", "MaskSpec",
           "ModelConfig",
           "Pretrained", "RunOptions", "Sampler", "SamplerConfig", "TokenBatch", "Tokenizer", "Transformer", "align_logits",
           "attend",
           "checkpoint_dir", "companions", "enable_compilation_cache", "from_pretrained", "generate", "generate_stepwise", "load",
           "load_state", "policy_params", "recipe_path", "sampler_defaults", "save_pretrained", "save_state"]
