"""LLaDA2.1's decoding with token editing: masks are committed as in LLaDA2.0 (every masked position
of the block whose top-1 probability exceeds `threshold`, at least the most confident one), and
every step also re-decides the block's already committed answer tokens (never a prompt token that
shares the block): one whose top-1 now differs from
it, with probability above `editing_threshold`, is replaced. A block stays open after its last mask
while edits continue: it ends at the first step without a mask that edits nothing, or after
`max_post_steps` steps without masks (the published loop's count: it stops before a forward that
would exceed it).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxdllm.decoding.policies.base import Commit, ConfidencePolicy, in_unit_interval, top_plus_threshold
from jaxdllm.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TokenEditing(ConfidencePolicy):
    threshold: float = 0.95
    editing_threshold: float = 0.9
    max_post_steps: int = 16
    name = "token_editing"

    def check(self, config):
        in_unit_interval(self.threshold, "threshold", self.name)
        in_unit_interval(self.editing_threshold, "editing_threshold", self.name)
        if not isinstance(self.max_post_steps, int) or isinstance(self.max_post_steps, bool) or self.max_post_steps < 0:
            raise ConfigError(f"max_post_steps must be an integer >= 0, got {self.max_post_steps!r}")

    def init_state(self, batch, block_length, vocab_size):
        # post: forwards of this block that started with no mask; closed: the row is done with the block
        return {"post": jnp.zeros((batch,), jnp.int32), "closed": jnp.ones((batch,), bool)}

    def holding(self, state):
        return ~state["closed"]

    def extra_steps_per_block(self):
        return self.max_post_steps

    def commit(self, logits, candidates, ctx):
        tokens, conf = self.greedy(logits, ctx)
        fresh = ctx.block_step == 0  # a new block: every row works on it
        post = jnp.where(fresh, 0, ctx.state["post"])
        closed = jnp.where(fresh, False, ctx.state["closed"])
        working = ctx.decoding & ~closed
        masks_left = candidates.any(1)
        fill = top_plus_threshold(candidates, conf, conf > self.threshold)
        editable = ~candidates if ctx.answer is None else ctx.answer & ~candidates  # never a prompt token
        edits = (editable & working[:, None] & (conf > self.editing_threshold)
                 & (tokens != ctx.block_tokens))
        post = post + (working & ~masks_left).astype(jnp.int32)
        masks_after = (candidates & ~fill).any(1)
        # The published loop leaves the block after a mask-free step that edits nothing, or before
        # a mask-free forward that would be number max_post_steps + 1.
        done_now = (~masks_left & ~edits.any(1)) | (~masks_after & (post >= self.max_post_steps))
        closed = closed | (working & done_now)
        return Commit(fill | edits, tokens, {"post": post, "closed": closed})
