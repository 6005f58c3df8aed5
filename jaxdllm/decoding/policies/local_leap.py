"""LocalLeap: anchors (candidates with p >= `threshold`) relax the bar to `leap_relaxed` for
candidates within `leap_radius` of them; the top-1 is always committed."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxdllm.decoding.policies.base import Commit, ConfidencePolicy, in_unit_interval, top_plus_threshold
from jaxdllm.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class LocalLeap(ConfidencePolicy):
    threshold: float = 0.9
    leap_relaxed: float = 0.75
    leap_radius: int = 4
    name = "local_leap"

    def check(self, config):
        in_unit_interval(self.threshold, "threshold", self.name)
        in_unit_interval(self.leap_relaxed, "leap_relaxed", self.name)
        if self.leap_radius < 0:
            raise ConfigError(f"leap_radius must be >= 0, got {self.leap_radius}")

    def commit(self, logits, candidates, ctx):
        tokens, conf = self.greedy(logits, ctx)
        anchors = candidates & (conf >= self.threshold)
        idx = jnp.arange(conf.shape[-1])
        within = jnp.abs(idx[:, None] - idx[None, :]) <= self.leap_radius  # [L, L], blocks are short
        near = (anchors[:, None, :] & within[None]).any(-1)
        bar = jnp.where(near, self.leap_relaxed, self.threshold)
        return Commit(top_plus_threshold(candidates, conf, conf >= bar), tokens, ctx.state)
