"""The Learn2PD filter: a tiny network over a block's top-1 probabilities that predicts, per
position, whether the current prediction is already final (published: logistic regression or
a 2-layer MLP, 32 -> 32). Pass an instance to `generate(..., learned_filter=...)` with
`SamplerConfig(policy="learn2pd")`; train it with BCE on oracle traces (the sampler's
`max_trajectory` recordings)."""

from __future__ import annotations

import jax
from flax import nnx


class Learn2PDFilter(nnx.Module):
    """`[B, block_length]` top-1 probabilities -> `[B, block_length]` accept logits."""

    def __init__(self, block_length: int = 32, hidden: int = 32, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(block_length, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, block_length, rngs=rngs)

    def __call__(self, top1_probs: jax.Array) -> jax.Array:
        return self.out(jax.nn.relu(self.hidden(top1_probs)))
