"""ASSD (Any-Subset Speculative Decoding; Guo & Ermon, arXiv 2504.20456): an any-order model (XLNet's
two-stream attention) drafts its next `drafts` positions in one forward and checks them against its
own sequential conditionals in a second forward. The policy holds the settings and the per-step
arithmetic; the canvas that runs the forwards (orders, perm masks, per-row ranks) is
`jaxdllm.decoding.assd_canvas`.

Per iteration, with n ranks decided and k' = min(drafts, ranks left) targets (the next k' ranks):

* draft: q_j = the model's distribution at target j given the decided tokens only, with the MASK
  token's probability removed and the rest renormalised; y_j ~ q_j independently (`draft`).
* verify: p_j = the distribution at target j given every rank before it, the drafts y_0 .. y_{j-1}
  written in (also MASK-removed, renormalised).
* accept in order (`accept`): y_j is kept while U_j < min(1, p_j(y_j) / q_j(y_j)); at the first
  rejection j, a token drawn from normalise(max(p_j - q_j, 0)) is written at j and the step stops.
  No bonus token. y_0 is always kept: q_0 and p_0 condition on the same ranks (the published code
  asserts they agree to 1e-5; here float noise between the two forwards never rejects it).

This is speculative sampling (Leviathan et al., Chen et al.) with a proposal that conditions on the
decided ranks only, so the tokens are distributed as sequential sampling under the order:
prod_i p(x_sigma(i) | x_sigma(<i)). At temperature 0 both distributions are the argmax's one-hot:
a draft is kept while it equals the verifier's argmax, and the first that differs is replaced by it,
so the output is sequential greedy decoding under the order, token for token. Every iteration of
k' >= 2 writes at least 2 tokens for its 2 forwards, the last single rank 1 token for 1 forward, so a
row's forwards never exceed its decoded tokens.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.base import Policy
from jaxdllm.errors import ConfigError


class Verdict(NamedTuple):
    """The outcome of one iteration's acceptance, per row.

    Attributes:
      written: `[B]` int32, ranks written this iteration (the accepted drafts, plus the residual
        token at the first rejection); 0 for a row with no valid target.
      tokens: `[B, K]` int32, the token of each written slot (slot j < written).
    """

    written: jax.Array
    tokens: jax.Array


def mask_removed_probs(logits: jax.Array, mask_id: int, temperature: float) -> jax.Array:
    """`[B, K, V]` float32 probabilities of `logits [B, K, V]` with the MASK token's probability
    removed and the rest renormalised: softmax(logits / T) over the other ids, or at `temperature` 0
    the one-hot of their argmax (ties to the lower id)."""
    logits = logits.astype(jnp.float32).at[..., mask_id].set(-jnp.inf)
    if temperature == 0:
        return jax.nn.one_hot(jnp.argmax(logits, -1), logits.shape[-1], dtype=jnp.float32)
    return jax.nn.softmax(logits / temperature, axis=-1)


def sample_from(probs: jax.Array, key: jax.Array) -> jax.Array:
    """`[...]` int32 one draw from each distribution `probs [..., V]` (a one-hot gives its id)."""
    return jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Assd(Policy):
    """ASSD's settings.

    Attributes:
      drafts: k, the ranks drafted (and verified) per iteration; 5 in the published main runs
        (`_run_speculative_decoding.sh`), 10 in its infilling and code evaluations.
    """

    drafts: int = 5
    name = "assd"
    canvas = "assd_canvas"

    def check(self, config) -> None:
        if not isinstance(self.drafts, int) or isinstance(self.drafts, bool) or self.drafts < 1:
            raise ConfigError(f"drafts (ASSD's k, ranks drafted per iteration) must be an integer >= 1, got "
                              f"{self.drafts!r} (policy {self.name!r}); the published runs use 5")

    def draft(self, q: jax.Array, key: jax.Array) -> jax.Array:
        """`[B, K]` int32 drafts, one independent draw from each `q [B, K, V]`."""
        return sample_from(q, key)

    def accept(self, drafts: jax.Array, q: jax.Array, p: jax.Array, valid: jax.Array, key: jax.Array) -> Verdict:
        """Speculative sampling's accept-or-resample over the K slots, in order.

        Args:
          drafts: `[B, K]` the drafted tokens y_j.
          q: `[B, K, V]` the draft distributions (MASK removed, renormalised).
          p: `[B, K, V]` the verifier's distributions at the same slots, the drafts before each written in.
          valid: `[B, K]` bool, the slots that are targets (a prefix of each row: k' of them).
          key: PRNG key of this step's acceptance.

        Returns:
          `Verdict(written [B], tokens [B, K])`.
        """
        k = drafts.shape[1]
        u_key, r_key = jax.random.split(key)
        u = jax.random.uniform(u_key, drafts.shape, jnp.float32)
        q_y = jnp.take_along_axis(q, drafts[..., None], -1)[..., 0]
        p_y = jnp.take_along_axis(p, drafts[..., None], -1)[..., 0]
        keep = u * q_y < p_y  # U < p / q (q_y > 0: y was drawn from q); at T = 0: y is p's argmax
        keep = keep.at[:, 0].set(True) | ~valid  # rank n is always kept; past k' nothing is rejected
        first = jnp.where(keep.all(1), k, jnp.argmin(keep, axis=1))  # the first rejected slot, or K
        count = valid.sum(1)
        written = jnp.where(first < count, first + 1, count)
        at = jnp.clip(first, 0, k - 1)[:, None, None]
        p_f = jnp.take_along_axis(p, at, 1)[:, 0]
        q_f = jnp.take_along_axis(q, at, 1)[:, 0]
        residual = jnp.maximum(p_f - q_f, 0.0)
        mass = residual.sum(-1, keepdims=True)
        residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_f)
        fix = sample_from(residual, r_key)                                          # [B]
        slot = jnp.arange(k)[None]
        tokens = jnp.where(slot == first[:, None], fix[:, None], drafts)
        return Verdict(written.astype(jnp.int32), tokens.astype(jnp.int32))
