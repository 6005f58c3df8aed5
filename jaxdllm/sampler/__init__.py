"""The compiled dLLM sampler: `generate`, its `SamplerConfig`, and the commit policies."""

from jaxdllm.sampler.config import CACHES, POLICIES, SAMPLER_PRESETS, SamplerConfig
from jaxdllm.sampler.engine import GenerateResult, SamplerState, generate, generate_stepwise
from jaxdllm.sampler.learn2pd import Learn2PDFilter

__all__ = ["CACHES", "POLICIES", "SAMPLER_PRESETS", "GenerateResult", "Learn2PDFilter", "SamplerConfig", "SamplerState",
           "generate", "generate_stepwise"]
