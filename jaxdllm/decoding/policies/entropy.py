"""dParallel's evaluation sampler: the lowest-entropy candidate plus every candidate whose
predictive entropy is <= `entropy_threshold` (tau)."""

from __future__ import annotations

import dataclasses

from jaxdllm.decoding.policies.base import Commit, Policy, choose_tokens, token_entropy, top_plus_threshold
from jaxdllm.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Entropy(Policy):
    entropy_threshold: float = 0.5
    name = "entropy"

    def check(self, config):
        if self.entropy_threshold < 0:
            raise ConfigError(f"entropy_threshold must be >= 0, got {self.entropy_threshold}")

    def commit(self, logits, candidates, ctx):
        tokens = choose_tokens(logits, ctx.config.temperature, ctx.key)
        ent = token_entropy(logits)
        return Commit(top_plus_threshold(candidates, -ent, ent <= self.entropy_threshold), tokens, ctx.state)
