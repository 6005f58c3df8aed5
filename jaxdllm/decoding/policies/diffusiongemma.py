"""DiffusionGemma's generation rule (transformers' `generation_diffusion_gemma.py`; `algorithms.md`
§9): the settings and the per-step arithmetic of the uniform-noise canvas
(`jaxdllm.decoding.uniform_canvas`, which runs the steps and owns the canvases and the cache).

Each denoising step s = N, N-1, ..., 1 over a canvas of C tokens:
  z = logits / T(s), T(s) = t_min + (t_max - t_min) * s / N
  d = a sample of softmax(z) per position (or its argmax, `sample=False`); a = argmax(z)
  accepted = the entropy bound over all C positions (`entropy_bound_accept`)
  x <- where(accepted, d, fresh uniform tokens)
  a row stops once a equals the argmax canvas of each of its last `stability_threshold` steps and
  the mean entropy of softmax(z) is below `confidence_threshold`; its canvas commits a.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.base import Policy
from jaxdllm.decoding.policies.entropy_bound import entropy_bound_accept, token_entropy
from jaxdllm.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DiffusionGemma(Policy):
    """DiffusionGemma's entropy-bound sampler on a uniform-noise canvas (published defaults).

    Attributes:
      entropy_bound: the EB-sampler's bound (nats): a step accepts the lowest-entropy positions whose
        summed entropy, less the largest of them, stays within it.
      max_denoising_steps: N, the most steps per canvas.
      t_min, t_max: the temperature schedule's last and first values.
      stability_threshold: steps the argmax canvas must stay unchanged to stop (0: always stable).
      confidence_threshold: the mean entropy (nats) below which a stable canvas stops.
      sample: draw the accepted tokens from softmax(z) (the published sampler); False takes the
        argmax (deterministic: tests, and runs that must repeat).
      stop_ids: a canvas holding any of these ends its row (default: the model's EOS and end of turn);
        the published checkpoint's generation config stops at 1, 106 and 50.
    """

    name: ClassVar[str] = "diffusiongemma"
    canvas: ClassVar[str] = "uniform_canvas"

    entropy_bound: float = 0.1
    max_denoising_steps: int = 48
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = 1
    confidence_threshold: float = 0.005
    sample: bool = True
    stop_ids: tuple[int, ...] | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.entropy_bound <= 0 or self.confidence_threshold < 0:
            raise ConfigError(f"entropy_bound must be > 0 and confidence_threshold >= 0, got {self.entropy_bound}, "
                              f"{self.confidence_threshold}")
        if self.max_denoising_steps < 1 or self.stability_threshold < 0:
            raise ConfigError("max_denoising_steps must be >= 1 and stability_threshold >= 0")
        if not 0 < self.t_min <= self.t_max:
            raise ConfigError(f"the temperature schedule needs 0 < t_min <= t_max, got {self.t_min}, {self.t_max}")

    def check(self, config) -> None:
        if config.temperature:
            raise ConfigError("policy 'diffusiongemma' sets its own temperatures (t_min, t_max); leave temperature=0 "
                              "and pass sample=False for argmax decoding")

    def temperature(self, block_step: jax.Array) -> jax.Array:
        """T at denoising step `block_step` (0-based; the published step counts down from N)."""
        n = self.max_denoising_steps
        return self.t_min + (self.t_max - self.t_min) * (n - block_step).astype(jnp.float32) / n

    def denoise(self, logits: jax.Array, block_step: jax.Array, key: jax.Array):
        """One step's arithmetic on `logits [B, C, V]` (float32).

        Returns `(z, entropy [B, C], proposal [B, C], argmax [B, C], accepted [B, C])`: the
        temperature-scaled logits, their per-position entropy, the denoiser's tokens (sampled or
        argmax), the argmax canvas and the positions the entropy bound accepts.
        """
        z = logits / self.temperature(block_step)
        entropy = token_entropy(z)
        argmax = jnp.argmax(z, axis=-1).astype(jnp.int32)
        proposal = jax.random.categorical(key, z, axis=-1).astype(jnp.int32) if self.sample else argmax
        accepted = entropy_bound_accept(entropy, jnp.ones(entropy.shape, bool), self.entropy_bound)
        return z, entropy, proposal, argmax, accepted
