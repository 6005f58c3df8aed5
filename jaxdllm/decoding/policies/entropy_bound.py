"""The EB-sampler (entropy-bounded unmasking, arXiv 2505.24857; DiffusionGemma's acceptance rule).

Each step the candidates are sorted by the entropy of their predictive distribution, lowest first,
and the longest prefix whose entropies, each one's own left out, sum to at most `entropy_bound`
(nats) is committed: the position of rank k is accepted iff `sum_{j<=k} H_(j) - H_(k) <= bound`.
The lowest-entropy candidate always passes, so every step makes progress; a small bound commits
one token per step in entropy order, a large one the whole block at once.

`entropy_bound_accept` is the rule alone (any canvas may call it); `EntropyBound` is the policy
of the masked canvas. Its `entropy_bound_rule="cumsum"` is JetEngine's stricter variant (SDAR's
`entropy_bounded` remasking, `entropy_cumsum_accept`): the longest prefix whose entropies, each
one's own included, sum to less than the bound, at least one.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.base import Commit, Policy, choose_tokens, token_entropy
from jaxdllm.errors import ConfigError

__all__ = ["EntropyBound", "entropy_bound_accept", "entropy_cumsum_accept", "token_entropy"]

RULES = ("eb", "cumsum")


def entropy_bound_accept(entropy: jax.Array, candidates: jax.Array, bound: float | jax.Array) -> jax.Array:
    """entropy [B, L] float32 (nats), candidates [B, L] bool -> accepted [B, L] bool: the EB rule.

    Per row, the candidates are sorted by ascending entropy (a stable sort: ties go to the lower
    position) and the candidate of rank k is accepted iff `sum_{j<=k} H_(j) - H_(k) <= bound`, so
    the lowest-entropy candidate is always accepted (for any bound >= 0). Non-candidates are never
    accepted and add nothing to the sums; a row without candidates accepts nothing. `bound` is a
    scalar or broadcasts against `[B, 1]` (one bound per row).
    """
    def passes(sorted_entropy):
        before = jnp.cumsum(sorted_entropy, axis=-1) - sorted_entropy  # sum_{j<=k} H_(j) - H_(k)
        return before <= jnp.asarray(bound, jnp.float32)

    return _accept_by_rank(entropy, candidates, passes)


def _accept_by_rank(entropy, candidates, passes) -> jax.Array:
    """`candidates` whose rank by ascending entropy (stable) passes: `passes(sorted_entropy [B, L]) ->
    [B, L] bool`, sorted_entropy holding the candidates first (non-candidates after them, counting 0)."""
    entropy = jnp.where(candidates, entropy.astype(jnp.float32), 0.0)
    order = jnp.argsort(jnp.where(candidates, entropy, jnp.inf), axis=-1, stable=True)
    ok = passes(jnp.take_along_axis(entropy, order, axis=-1))
    rank = jnp.argsort(order, axis=-1, stable=True)  # the inverse permutation: each position's rank
    return candidates & jnp.take_along_axis(ok, rank, axis=-1)


def entropy_cumsum_accept(entropy: jax.Array, candidates: jax.Array, bound: float | jax.Array) -> jax.Array:
    """entropy [B, L] float32 (nats), candidates [B, L] bool -> accepted [B, L] bool: JetEngine's rule
    (SDAR's `entropy_bounded`; Labman42/JetEngine `scheduler.py`).

    Per row, the candidates sorted by ascending entropy (stable) and `k = #(cumsum(H_sorted) < bound)`,
    at least 1: the candidate of rank k is accepted iff `sum_{j<=k} H_(j) < bound` or k = 0. Stricter
    than `entropy_bound_accept` (its sum leaves rank k's own entropy out, and compares with <=).
    """
    def passes(sorted_entropy):
        total = jnp.cumsum(sorted_entropy, axis=-1)  # sum_{j<=k} H_(j)
        return (total < jnp.asarray(bound, jnp.float32)) | (jnp.arange(sorted_entropy.shape[-1]) == 0)

    return _accept_by_rank(entropy, candidates, passes)


@dataclasses.dataclass(frozen=True)
class EntropyBound(Policy):
    """Commit the lowest-entropy candidates while their entropies, each one's own left out, sum to
    at most `entropy_bound` nats (0.1: the EB-sampler's and DiffusionGemma's published bound).

    The entropy is that of softmax of the logits the loop gives every policy (MASK removed, no
    temperature), the same as the `entropy` policy (dParallel) thresholds; the committed tokens
    are `choose_tokens` of them (argmax at temperature 0, a sample of softmax(logits / T) above).

    `entropy_bound_rule`: "eb" (the EB-sampler, above) or "cumsum" (JetEngine's, SDAR's
    `entropy_bounded`: the lowest-entropy candidates while their entropies, each one's own
    included, sum to less than the bound; at least one).
    """

    entropy_bound: float = 0.1
    entropy_bound_rule: str = "eb"
    name = "entropy_bound"

    def check(self, config):
        if not self.entropy_bound > 0:  # also rejects nan
            raise ConfigError(f"entropy_bound must be > 0 (nats), got {self.entropy_bound} (policy {self.name!r}): "
                              "pass e.g. entropy_bound=0.1 (the published bound); a tiny bound such as 1e-9 "
                              "commits one token per step, a larger one commits more per step")
        if self.entropy_bound_rule not in RULES:
            raise ConfigError(f"entropy_bound_rule must be one of {RULES}, got {self.entropy_bound_rule!r} "
                              f"(policy {self.name!r}): 'eb' is the EB-sampler's rule, 'cumsum' JetEngine's (SDAR)")

    def commit(self, logits, candidates, ctx):
        tokens = choose_tokens(logits, ctx.config.temperature, ctx.key)
        accept = entropy_cumsum_accept if self.entropy_bound_rule == "cumsum" else entropy_bound_accept
        accepted = accept(token_entropy(logits), candidates, self.entropy_bound)
        return Commit(accepted, tokens, ctx.state)
