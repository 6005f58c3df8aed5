"""The compiled dLLM sampler: `generate`, its `SamplerConfig`, and the commit policies."""

from jaxdllm.sampler.config import CACHES, POLICIES, SAMPLER_PRESETS, SamplerConfig
from jaxdllm.sampler.engine import GenerateResult, SamplerState, generate, generate_stepwise

__all__ = ["CACHES", "POLICIES", "SAMPLER_PRESETS", "GenerateResult", "SamplerConfig", "SamplerState",
           "generate", "generate_stepwise"]
