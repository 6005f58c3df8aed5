"""CreditDecoding: a decayed credit per position and token, reset each block (`C <- gamma C`,
`C[top1] += p_top1 ** alpha`), fused into the logits as `z + lambda * log1p(C)`; commit the
candidates whose max(raw, fused) top-1 probability is >= `credit_threshold`, at least one."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.base import Commit, Policy, choose_tokens, in_unit_interval, top_plus_threshold
from jaxdllm.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Credit(Policy):
    credit_threshold: float = 0.95
    credit_gamma: float = 0.65
    credit_lambda: float = 0.70
    credit_alpha: float = 0.5
    name = "credit"

    def check(self, config):
        in_unit_interval(self.credit_threshold, "credit_threshold", self.name)
        if not 0 < self.credit_gamma <= 1 or self.credit_lambda < 0 or self.credit_alpha <= 0:
            raise ConfigError("credit_gamma must be in (0, 1], credit_lambda >= 0, credit_alpha > 0")

    def init_state(self, batch, block_length, vocab_size):
        return jnp.zeros((batch, block_length, vocab_size), jnp.float32)  # the credits

    def commit(self, logits, candidates, ctx):
        credits = jnp.where(ctx.block_step == 0, 0.0, ctx.state) * self.credit_gamma
        probs = jax.nn.softmax(logits, axis=-1)
        top1 = jnp.argmax(logits, axis=-1)
        p1 = jnp.max(probs, axis=-1)
        credits = credits + (jax.nn.one_hot(top1, logits.shape[-1], dtype=credits.dtype)
                             * (p1 ** self.credit_alpha)[..., None])
        fused = logits + self.credit_lambda * jnp.log1p(credits)
        tokens = choose_tokens(fused, ctx.config.temperature, ctx.key)
        conf = jnp.maximum(p1, jnp.max(jax.nn.softmax(fused, axis=-1), axis=-1))
        return Commit(top_plus_threshold(candidates, conf, conf >= self.credit_threshold), tokens, credits)
