"""`SamplerConfig`: every decoding policy's published arguments, validated before compiling.

Field names follow the published code (`steps`, `gen_length`, `block_length`, `temperature`,
`cfg_scale`, `remasking`, `threshold`, `factor`); `policy` picks the commit rule:

  * `llada`: the LLaDA semi-autoregressive schedule (`steps` per generation, an equal share of
    each block's masks per step) with `remasking` = `low_confidence` or `random`.
  * `threshold` (Fast-dLLM): top-1 plus every masked in-block position with p >= `threshold`.
  * `factor` (Fast-dLLM): the longest confidence-ranked prefix with c_n >= 1 - factor/(n+1).
  * `entropy` (dParallel): lowest-entropy position plus all with entropy <= `entropy_threshold`.
  * `local_leap` (LocalLeap): anchors at p >= `threshold`, neighbours within `leap_radius`
    need only `leap_relaxed`.
  * `credit` (CreditDecoding): credits accumulated per block fuse into the logits.
  * `prophet` (Prophet): the `llada` schedule, stopping early once the mean top-1/top-2 logit gap
    over the answer clears a threshold that falls with progress.
  * `learn2pd` (Learn2PD): a learned filter (any small module passed to `generate`) accepts
    positions from the block's top-1 probabilities; the `llada` schedule's top-k is committed
    too; with `eot_prediction`, an accepted EOS ends the answer.
  * `dream` (Dream's `diffusion_generate`): no blocks (`block_length == gen_length`), timesteps
    `linspace(1, eps, steps + 1)`, `int(M (1 - s/t))` tokens per step by `dream_alg`
    (`maskgit_plus`, `topk_margin`, `entropy`, or `origin`), `alg_temp`, `top_p`, `top_k`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxdllm.errors import ConfigError

POLICIES = ("llada", "threshold", "factor", "entropy", "local_leap", "credit", "prophet", "dream",
            "learn2pd")
SCHEDULED = ("llada", "prophet", "dream", "learn2pd")
DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")  # policies whose steps per block are fixed by `steps`
REMASKING = ("low_confidence", "random")
CACHES = ("none", "prefix", "dual", "block")


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Decoding settings; hashable, so it is a static argument of the compiled sampler.

    Attributes:
      gen_length: tokens to generate G (all of them unless `stop_at_eos`).
      block_length: semi-autoregressive block; `gen_length` for one block over the canvas.
      steps: total steps for the scheduled policies (`llada`, `prophet`); must be a multiple
        of the number of blocks. Other policies run each block until it is full and ignore it.
      policy, remasking: see the module docstring.
      temperature: 0 = greedy; > 0 samples with Gumbel-max (= softmax(logits / T)).
      cfg_scale: classifier-free guidance, `u + (cfg + 1)(c - u)`, u with the prompt masked.
      threshold: confidence threshold (`threshold`, `local_leap` anchors).
      factor: the Fast-dLLM factor rule's constant.
      entropy_threshold: dParallel's tau.
      leap_relaxed, leap_radius: LocalLeap's neighbour threshold and radius.
      credit_threshold, credit_gamma, credit_lambda, credit_alpha: CreditDecoding constants.
      prophet_thresholds: logit-gap thresholds for progress < 1/3, < 2/3, and after.
      filter_threshold, eot_prediction: Learn2PD's acceptance threshold and end-of-text prediction.
      dream_alg, alg_temp, top_p, top_k, eps: Dream's algorithm, position-sampling temperature
        (0 = top-k by confidence), nucleus and top-k token filtering (1.0 / 0 = off), and the
        final timestep.
      confidence_eos_eot_inf: EOS/EoT predictions get confidence 0 (committed last).
      stop_at_eos: a row stops once it has committed EOS and everything before it; the rest is
        filled with EOS. Off reproduces the published LLaDA sampler exactly.
      cache: `none` (exact), `prefix` or `dual` (Fast-dLLM, approximate, refreshed per block;
        bidirectional models), `block` (block-causal models: exact K/V cache of finished blocks,
        Fast-dLLM v2 style; `block_length` must be a multiple or a divisor of the model's
        `block_size`, and `gen_length` a multiple of `block_size`).
      cache_refresh_every_step: recompute the `prefix`/`dual` cache at every step (exact; for
        testing caches).
      prompt_bucket: prompts are left-padded to a multiple of this (for block-causal models, of
        lcm(prompt_bucket, block_size), so the generation starts on a block boundary), so a new
        prompt in the same bucket reuses the compiled sampler.
      max_trajectory: record the canvas after each of the first `max_trajectory` steps.
    """

    gen_length: int = 128
    block_length: int = 128
    steps: int = 128
    policy: str = "llada"
    remasking: str = "low_confidence"
    temperature: float = 0.0
    cfg_scale: float = 0.0
    threshold: float = 0.9
    factor: float = 1.0
    entropy_threshold: float = 0.5
    leap_relaxed: float = 0.75
    leap_radius: int = 4
    credit_threshold: float = 0.95
    credit_gamma: float = 0.65
    credit_lambda: float = 0.70
    credit_alpha: float = 0.5
    prophet_thresholds: tuple[float, float, float] = (7.5, 5.0, 2.5)
    filter_threshold: float = 0.96
    eot_prediction: bool = True
    dream_alg: str = "maskgit_plus"
    alg_temp: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    eps: float = 1e-3
    confidence_eos_eot_inf: bool = False
    stop_at_eos: bool = False
    cache: str = "none"
    cache_refresh_every_step: bool = False
    prompt_bucket: int = 32
    max_trajectory: int = 0

    def __post_init__(self):
        def positive(name):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")

        for name in ("gen_length", "block_length", "steps", "prompt_bucket"):
            positive(name)
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.remasking not in REMASKING:
            raise ConfigError(f"remasking must be one of {REMASKING}, got {self.remasking!r}")
        if self.cache not in CACHES:
            raise ConfigError(f"cache must be one of {CACHES}, got {self.cache!r}")
        if self.gen_length % self.block_length:
            raise ConfigError(
                f"gen_length ({self.gen_length}) must be a multiple of block_length ({self.block_length})")
        if self.policy in SCHEDULED and self.steps % self.num_blocks:
            raise ConfigError(
                f"steps ({self.steps}) must be a multiple of the number of blocks "
                f"(gen_length / block_length = {self.num_blocks})")
        if self.policy in SCHEDULED and self.steps > self.gen_length:
            raise ConfigError(f"steps ({self.steps}) cannot exceed gen_length ({self.gen_length}): "
                              "every step commits at least one token")
        if self.temperature < 0 or self.cfg_scale < 0:
            raise ConfigError("temperature and cfg_scale must be >= 0")
        for name in ("threshold", "leap_relaxed", "credit_threshold"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.entropy_threshold < 0 or self.factor <= 0 or self.leap_radius < 0:
            raise ConfigError("entropy_threshold must be >= 0, factor > 0 and leap_radius >= 0")
        if not 0 < self.credit_gamma <= 1 or self.credit_lambda < 0 or self.credit_alpha <= 0:
            raise ConfigError("credit_gamma must be in (0, 1], credit_lambda >= 0, credit_alpha > 0")
        if len(self.prophet_thresholds) != 3:
            raise ConfigError("prophet_thresholds needs three values (early, middle, late)")
        if self.cfg_scale > 0 and self.cache != "none":
            raise ConfigError("cfg_scale > 0 is supported with cache='none' only")
        if self.dream_alg not in DREAM_ALGS:
            raise ConfigError(f"dream_alg must be one of {DREAM_ALGS}, got {self.dream_alg!r}")
        if self.policy == "dream" and self.block_length != self.gen_length:
            raise ConfigError("policy='dream' decodes the whole canvas: set block_length = gen_length")
        if not 0 < self.top_p <= 1 or self.top_k < 0 or self.alg_temp < 0 or not 0 < self.eps < 1:
            raise ConfigError("top_p must be in (0, 1], top_k >= 0, alg_temp >= 0 and eps in (0, 1)")
        if self.max_trajectory < 0:
            raise ConfigError("max_trajectory must be >= 0")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks

    def replace(self, **changes: Any) -> "SamplerConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "SamplerConfig":
        """A published setting by name (see `SAMPLER_PRESETS`), with overrides."""
        if name not in SAMPLER_PRESETS:
            raise ConfigError(f"unknown sampler preset {name!r}; known presets: {sorted(SAMPLER_PRESETS)}")
        return dataclasses.replace(SAMPLER_PRESETS[name], **overrides)


SAMPLER_PRESETS: dict[str, SamplerConfig] = {
    # LLaDA-8B-Instruct GSM8K baseline: one token per step.
    "llada": SamplerConfig(gen_length=256, block_length=32, steps=256),
    "llada-random": SamplerConfig(gen_length=256, block_length=32, steps=256, remasking="random"),
    # Fast-dLLM (LLaDA, GSM8K): parallel threshold 0.9, with and without caches.
    "fast-dllm-parallel": SamplerConfig(gen_length=256, block_length=32, policy="threshold", threshold=0.9),
    "fast-dllm-prefix": SamplerConfig(gen_length=256, block_length=32, policy="threshold", cache="prefix"),
    "fast-dllm-dual": SamplerConfig(gen_length=256, block_length=32, policy="threshold", cache="dual"),
    "fast-dllm-factor": SamplerConfig(gen_length=256, block_length=32, policy="factor", factor=1.0),
    # dParallel evaluation sampler: entropy threshold 0.5, no cache.
    "dparallel": SamplerConfig(gen_length=256, block_length=32, policy="entropy", entropy_threshold=0.5),
    "dparallel-mbpp": SamplerConfig(gen_length=256, block_length=32, policy="entropy", entropy_threshold=0.45),
    "prophet": SamplerConfig(gen_length=256, block_length=32, steps=256, policy="prophet"),
    "credit": SamplerConfig(gen_length=256, block_length=32, policy="credit"),
    "local-leap": SamplerConfig(gen_length=256, block_length=32, policy="local_leap"),
    # Dream-v0-Instruct-7B's published generation settings (GSM8K-style): 256 tokens, 256 steps,
    # entropy ordering, greedy tokens.
    "dream": SamplerConfig(gen_length=256, block_length=256, steps=256, policy="dream", dream_alg="entropy"),
}
