"""Fast-dLLM's factor rule: sort the candidates' confidences c_1 >= c_2 >= ...; commit the longest
prefix n = 1.. with c_n >= 1 - factor / (n + 1), at least one."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxdllm.decoding.policies.base import Commit, ConfidencePolicy, rank_among
from jaxdllm.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Factor(ConfidencePolicy):
    factor: float = 1.0
    name = "factor"

    def check(self, config):
        if self.factor <= 0:
            raise ConfigError(f"factor must be > 0, got {self.factor}")

    def commit(self, logits, candidates, ctx):
        tokens, conf = self.greedy(logits, ctx)
        rank = rank_among(conf, candidates)
        sorted_conf = -jnp.sort(jnp.where(candidates, -conf, jnp.inf), axis=-1)  # descending, -inf pad
        n = jnp.arange(1, conf.shape[-1] + 1, dtype=jnp.float32)
        ok = sorted_conf >= 1.0 - self.factor / (n + 1.0)
        count = jnp.maximum(jnp.sum(jnp.cumprod(ok, axis=-1), axis=-1, keepdims=True), 1)
        return Commit(candidates & (rank < count), tokens, ctx.state)
