"""Jacobi decoding (greedy) for causal models: a window of draft tokens is refined in parallel
until it reaches a fixed point; each step accepts the longest prefix whose inputs were already
right. The output equals greedy autoregressive decoding token for token.

Here the window fed to the model is the last decided token followed by the drafts, so the
logit at window index j predicts the token at the window's j-th undecided position. Position 0's
prediction is exact (its whole context is decided); position j's is exact when the drafts
before it equal their own predictions. Exact predictions are committed; the others become the
next draft (`Commit.draft`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.base import Commit, Policy
from jaxdllm.errors import ConfigError

DRAFT_INITS = ("prompt", "repeat")


@dataclasses.dataclass(frozen=True)
class Jacobi(Policy):
    """`draft_init`: the first draft; `prompt` (published: tokens drawn at random from the row's
    prompt) or `repeat` (the last prompt token repeated)."""

    draft_init: str = "prompt"
    name = "jacobi"
    method = "jacobi"

    def check(self, config):
        if self.draft_init not in DRAFT_INITS:
            raise ConfigError(f"draft_init must be one of {DRAFT_INITS}, got {self.draft_init!r}")
        if config.temperature != 0:
            raise ConfigError("policy='jacobi' is greedy decoding: set temperature = 0")

    def initial_draft(self, prompt: jax.Array, seg: jax.Array, length: int, key: jax.Array) -> jax.Array:
        """`[B, length]` first draft for rows of left-padded `prompt [B, Lp]` (`seg` 0 on padding)."""
        b, lp = prompt.shape
        if self.draft_init == "repeat":
            return jnp.broadcast_to(prompt[:, -1:], (b, length))
        real = jnp.maximum(seg.sum(1), 1)  # tokens of each row, right-aligned
        pick = lp - 1 - jax.random.randint(key, (b, length), 0, 1 << 30) % real[:, None]
        return jnp.take_along_axis(prompt, pick, axis=1)

    def commit(self, logits, candidates, ctx):
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        agree = ctx.draft == tokens
        exact = jnp.concatenate([jnp.ones_like(agree[:, :1]), jnp.cumprod(agree[:, :-1], axis=1).astype(bool)], 1)
        return Commit(candidates & exact, tokens, ctx.state, draft=tokens)
