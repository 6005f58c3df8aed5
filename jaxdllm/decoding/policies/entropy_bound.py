"""The EB-sampler (entropy-bounded unmasking, arXiv 2505.24857; DiffusionGemma's acceptance rule).

Each step the candidates are sorted by the entropy of their predictive distribution, lowest first,
and the longest prefix whose entropies, each one's own left out, sum to at most `entropy_bound`
(nats) is committed: the position of rank k is accepted iff `sum_{j<=k} H_(j) - H_(k) <= bound`.
The lowest-entropy candidate always passes, so every step makes progress; a small bound commits
one token per step in entropy order, a large one the whole block at once.

`entropy_bound_accept` is the rule alone (any canvas may call it); `EntropyBound` is the policy
of the masked canvas.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.base import Commit, Policy, choose_tokens, token_entropy
from jaxdllm.errors import ConfigError

__all__ = ["EntropyBound", "entropy_bound_accept", "token_entropy"]


def entropy_bound_accept(entropy: jax.Array, candidates: jax.Array, bound: float | jax.Array) -> jax.Array:
    """entropy [B, L] float32 (nats), candidates [B, L] bool -> accepted [B, L] bool: the EB rule.

    Per row, the candidates are sorted by ascending entropy (a stable sort: ties go to the lower
    position) and the candidate of rank k is accepted iff `sum_{j<=k} H_(j) - H_(k) <= bound`, so
    the lowest-entropy candidate is always accepted (for any bound >= 0). Non-candidates are never
    accepted and add nothing to the sums; a row without candidates accepts nothing. `bound` is a
    scalar or broadcasts against `[B, 1]` (one bound per row).
    """
    entropy = jnp.where(candidates, entropy.astype(jnp.float32), 0.0)
    # candidates first, by ascending entropy; non-candidates after them (their entropy counts as 0)
    order = jnp.argsort(jnp.where(candidates, entropy, jnp.inf), axis=-1, stable=True)
    sorted_entropy = jnp.take_along_axis(entropy, order, axis=-1)
    before = jnp.cumsum(sorted_entropy, axis=-1) - sorted_entropy  # sum_{j<=k} H_(j) - H_(k)
    passes = before <= jnp.asarray(bound, jnp.float32)
    rank = jnp.argsort(order, axis=-1, stable=True)  # the inverse permutation: each position's rank
    return candidates & jnp.take_along_axis(passes, rank, axis=-1)


@dataclasses.dataclass(frozen=True)
class EntropyBound(Policy):
    """Commit the lowest-entropy candidates while their entropies, each one's own left out, sum to
    at most `entropy_bound` nats (0.1: the EB-sampler's and DiffusionGemma's published bound).

    The entropy is that of softmax of the logits the loop gives every policy (MASK removed, no
    temperature), the same as the `entropy` policy (dParallel) thresholds; the committed tokens
    are `choose_tokens` of them (argmax at temperature 0, a sample of softmax(logits / T) above).
    """

    entropy_bound: float = 0.1
    name = "entropy_bound"

    def check(self, config):
        if not self.entropy_bound > 0:  # also rejects nan
            raise ConfigError(f"entropy_bound must be > 0 (nats), got {self.entropy_bound} (policy {self.name!r}): "
                              "pass e.g. entropy_bound=0.1 (the published bound); a tiny bound such as 1e-9 "
                              "commits one token per step, a larger one commits more per step")

    def commit(self, logits, candidates, ctx):
        tokens = choose_tokens(logits, ctx.config.temperature, ctx.key)
        accepted = entropy_bound_accept(token_entropy(logits), candidates, self.entropy_bound)
        return Commit(accepted, tokens, ctx.state)
