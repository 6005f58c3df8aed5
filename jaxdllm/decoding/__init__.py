"""Decoding: one compiled loop (`loop.py`) shared by diffusion (`masked_canvas.py`) and
draft-and-verify (`draft_canvas.py`: Jacobi, Lookahead) decoding, with policies (`policies/`) and caches (`caches.py`) as objects.

Public entry points: `generate`, `generate_stepwise`, `Sampler`, `SamplerConfig` (+ presets).
"""

from jaxdllm.decoding.caches import CACHES, BlockCache, Cache, DualCache, NoCache, PrefixCache, register_cache
from jaxdllm.decoding.config import SAMPLER_PRESETS, SamplerConfig
from jaxdllm.decoding.policies import POLICIES, Commit, Learn2PDFilter, Policy, StepContext, register_policy
from jaxdllm.decoding.sampler import GenerateResult, Sampler, generate, generate_stepwise
from jaxdllm.decoding.state import DecodeState

__all__ = ["BlockCache", "CACHES", "Cache", "Commit", "DecodeState", "DualCache", "GenerateResult", "Learn2PDFilter",
           "NoCache", "POLICIES", "Policy", "PrefixCache", "SAMPLER_PRESETS", "Sampler", "SamplerConfig",
           "StepContext", "generate", "generate_stepwise", "register_cache", "register_policy"]
