"""Learn2PD: a tiny learned filter reads the block's top-1 probabilities and accepts positions whose
prediction is already final (sigmoid > `filter_threshold`); the LLaDA schedule's top-k is
committed too. With `eot_prediction` (EoTP), an accepted EOS ends the answer: everything after it
becomes EOS and later blocks are never decoded.

The filter is any module `[B, block_length] -> [B, block_length]` accept logits passed as
`generate(..., policy_params=module)`; `Learn2PDFilter` is the published 2-layer MLP (32 -> 32).
Train it with BCE on oracle traces (the sampler's `max_trajectory` recordings).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxdllm.decoding.policies.base import Commit, ConfidencePolicy, in_unit_interval, rank_among, scheduled_count


class Learn2PDFilter(nnx.Module):
    """`[B, block_length]` top-1 probabilities -> `[B, block_length]` accept logits."""

    def __init__(self, block_length: int = 32, hidden: int = 32, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(block_length, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, block_length, rngs=rngs)

    def __call__(self, top1_probs: jax.Array) -> jax.Array:
        return self.out(jax.nn.relu(self.hidden(top1_probs)))


@dataclasses.dataclass(frozen=True)
class Learn2PD(ConfidencePolicy):
    filter_threshold: float = 0.96
    eot_prediction: bool = True
    name = "learn2pd"
    scheduled = True
    needs_params = True

    def check(self, config):
        in_unit_interval(self.filter_threshold, "filter_threshold", self.name)
        super().check(config)

    def commit(self, logits, candidates, ctx):
        cfg = ctx.config
        tokens, conf = self.greedy(logits, ctx)
        p1 = jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1)
        accept = candidates & (jax.nn.sigmoid(ctx.policy_params(p1)) > self.filter_threshold)
        k = scheduled_count(cfg, jnp.minimum(ctx.block_step, cfg.steps_per_block - 1))
        commit = accept | (candidates & (rank_among(conf, candidates) < k))
        if not (self.eot_prediction and ctx.eos_id is not None):
            return Commit(commit, tokens, ctx.state)
        # EoTP: the first accepted EOS cuts the answer: everything after it becomes EOS (the rest of
        # this block, committed or not, and every later block, which is then never decoded).
        eos_here = accept & (tokens == ctx.eos_id)
        cut = ctx.block * logits.shape[1] + jnp.argmax(eos_here, axis=-1)  # answer index of the EOS
        fill = eos_here.any(-1, keepdims=True) & (jnp.arange(cfg.gen_length)[None] > cut[:, None])
        return Commit(commit, tokens, ctx.state, fill=fill, fill_tokens=jnp.full(fill.shape, ctx.eos_id, jnp.int32))
