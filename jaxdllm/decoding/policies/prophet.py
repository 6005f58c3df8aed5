"""Prophet (early commit): the LLaDA schedule, and before each commit the mean top-1 minus top-2
logit gap over the whole answer; once it clears a threshold that falls with progress (the
first value while progress < 1/3, the second while < 2/3, the third after), every remaining
MASK takes its argmax and the row stops."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.llada import Llada
from jaxdllm.errors import ConfigError


def prophet_gap(answer_logits: jax.Array) -> jax.Array:
    """Mean top-1 minus top-2 logit over the answer positions; `[B]`."""
    top2 = jax.lax.top_k(answer_logits, 2)[0]
    return jnp.mean(top2[..., 0] - top2[..., 1], axis=-1)


@dataclasses.dataclass(frozen=True)
class Prophet(Llada):
    prophet_thresholds: tuple[float, float, float] = (7.5, 5.0, 2.5)
    name = "prophet"
    answer_logits = True

    def check(self, config):
        if len(self.prophet_thresholds) != 3:
            raise ConfigError("prophet_thresholds needs three values (early, middle, late)")
        super().check(config)

    def threshold_at(self, config, step: jax.Array) -> jax.Array:
        """The gap threshold at global step `step` (0-based)."""
        progress = step.astype(jnp.float32) / config.steps
        early, middle, late = self.prophet_thresholds
        return jnp.where(progress < 1 / 3, early, jnp.where(progress < 2 / 3, middle, late))

    def commit(self, logits, candidates, ctx):
        decision = super().commit(logits, candidates, ctx)
        step = ctx.block * ctx.config.steps_per_block + ctx.block_step
        early = candidates.any(-1) & (prophet_gap(ctx.answer_logits) >= self.threshold_at(ctx.config, step))
        block_len = logits.shape[1]
        in_block = jax.lax.dynamic_slice_in_dim(ctx.undecided, ctx.block * block_len, block_len, axis=1)
        undecided = jax.lax.dynamic_update_slice_in_dim(ctx.undecided, in_block & ~decision.commit,
                                                        ctx.block * block_len, axis=1)
        fill = early[:, None] & undecided
        return decision._replace(fill=fill, fill_tokens=jnp.argmax(ctx.answer_logits, axis=-1).astype(jnp.int32),
                                 stop=early)
