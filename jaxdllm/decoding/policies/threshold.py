"""Fast-dLLM's threshold rule: the most confident candidate plus every candidate with p >= `threshold`."""

from __future__ import annotations

import dataclasses

from jaxdllm.decoding.policies.base import Commit, ConfidencePolicy, in_unit_interval, top_plus_threshold


@dataclasses.dataclass(frozen=True)
class Threshold(ConfidencePolicy):
    threshold: float = 0.9
    name = "threshold"

    def check(self, config):
        in_unit_interval(self.threshold, "threshold", self.name)

    def commit(self, logits, candidates, ctx):
        tokens, conf = self.greedy(logits, ctx)
        return Commit(top_plus_threshold(candidates, conf, conf >= self.threshold), tokens, ctx.state)
