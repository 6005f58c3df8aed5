"""LLaDA's semi-autoregressive sampler: each step commits the scheduled number of candidates,
by confidence (`remasking="low_confidence"`) or at random (`"random"`)."""

from __future__ import annotations

import dataclasses

import jax

from jaxdllm.decoding.policies.base import Commit, ConfidencePolicy, rank_among, scheduled_count
from jaxdllm.errors import ConfigError

REMASKING = ("low_confidence", "random")


@dataclasses.dataclass(frozen=True)
class Llada(ConfidencePolicy):
    """`remasking`: `low_confidence` (top-k by p of the chosen token) or `random`."""

    remasking: str = "low_confidence"
    name = "llada"
    scheduled = True

    def check(self, config):
        if self.remasking not in REMASKING:
            raise ConfigError(f"remasking must be one of {REMASKING}, got {self.remasking!r}")
        super().check(config)

    def commit(self, logits, candidates, ctx):
        tokens, conf = self.greedy(logits, ctx)
        if self.remasking == "random":
            conf = jax.random.uniform(jax.random.fold_in(ctx.key, 1), conf.shape)
        k = scheduled_count(ctx.config, ctx.block_step)
        return Commit(candidates & (rank_among(conf, candidates) < k), tokens, ctx.state)
