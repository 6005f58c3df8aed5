"""Jacobi decoding (greedy) for causal models: a window of draft tokens is refined in parallel
until it reaches a fixed point; each step accepts the longest prefix whose inputs were already
right. The output equals greedy autoregressive decoding token for token.

A draft-and-verify policy (`draft_verify.py`): the regular branch is the window's draft, fed
after the last decided token, so the prediction after branch token j is for the window's
(j+1)-th undecided position. Position 0's prediction is exact (its whole context is decided);
position j's is exact when the drafts before it equal their own predictions. Exact predictions
are committed; the others become the next draft.

Which positions are in flight:

* `blocks = 0` (default): a sliding window of `window` positions from the first undecided
  one.
* `blocks = K >= 1`: the published block schedule (Jacobi Forcing's multi-block decoding). The
  answer is cut into blocks of `n = window`; the block holding the first undecided
  position is real-active, and the next block joins (up to K in flight) once the newest one has
  accepted at least `ceil(spawn_ratio * n)` tokens. The window is `K n` wide; positions past the
  blocks in flight keep their draft and are not accepted. `blocks = 1` is plain block-by-block
  Jacobi decoding (CLLM).

Rejection recycling (`recycle = R > 0`): each row keeps a pool of `recycle_capacity` n-grams: each
step's greedy output over its window (the accepted prefix and the rejected tail), keyed by the
decided token the window started from. A step also verifies, in the same forward, up to R pool
entries whose key is the row's last decided token, as further branches of the verification
layout; the branch with the longest accepted prefix wins (the regular draft on a tie). When a token recurs, the text that
followed it last time is offered again, so repeated spans are accepted many tokens at a time.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.draft_verify import DraftVerifyPolicy, Proposal, VerifyLayout
from jaxdllm.errors import ConfigError

DRAFT_INITS = ("prompt", "repeat")


@dataclasses.dataclass(frozen=True)
class Jacobi(DraftVerifyPolicy):
    """`window`: the draft window n (the published 16; 1 is autoregressive decoding); it is this
    policy's own setting, not the sampler's diffusion `block_length`. `draft_init`: the first
    draft; `prompt` (published: tokens drawn at random from the row's
    prompt) or `repeat` (the last prompt token repeated). `blocks`, `spawn_ratio`: multi-block
    decoding (0: sliding window; published K = 2, r = 0.85). `recycle`, `recycle_capacity`:
    rejection recycling (0: off; published 4 candidates). See the module docstring."""

    window: int = 16
    draft_init: str = "prompt"
    blocks: int = 0
    spawn_ratio: float = 0.85
    recycle: int = 0
    recycle_capacity: int = 64
    name = "jacobi"

    @property
    def samples(self) -> bool:
        """Window 1 is autoregressive decoding: at a temperature above 0 each step samples its token
        (ancestral sampling); wider windows verify drafts against greedy decoding only."""
        return self.window == 1 and self.blocks == 0 and self.recycle == 0

    def check(self, config):
        if not (self.samples and config.temperature > 0):
            super().check(config)
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 1:
            raise ConfigError(f"window must be an integer >= 1 (the draft window), got {self.window!r}")
        if self.draft_init not in DRAFT_INITS:
            raise ConfigError(f"draft_init must be one of {DRAFT_INITS}, got {self.draft_init!r}")
        for name in ("blocks", "recycle"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.recycle_capacity, int) or self.recycle_capacity < max(self.recycle, 1):
            raise ConfigError(f"recycle_capacity must be an integer >= recycle ({self.recycle}), "
                              f"got {self.recycle_capacity!r}")
        if not 0.0 < self.spawn_ratio <= 1.0:
            raise ConfigError(f"spawn_ratio must be in (0, 1], got {self.spawn_ratio}")

    def resized_settings(self, gen_length: int, new_gen_length: int) -> dict:
        """The draft window stays the published one, at most the new canvas."""
        return {"window": min(self.window, new_gen_length)}

    def layout(self) -> VerifyLayout:
        """No lookahead window; the regular draft plus `recycle` pooled ones, each `W - 1` tokens
        (`W = window * max(blocks, 1)` positions in flight)."""
        return VerifyLayout(0, 0, 1 + self.recycle, self.window * max(self.blocks, 1) - 1)

    def in_flight_end(self, first: jax.Array, answer_start: int) -> jax.Array:
        """The sliding window's end, or the end of the blocks in flight (multi-block decoding)."""
        n = self.window
        if not self.blocks:
            return first + n
        block_start = answer_start + (first - answer_start) // n * n
        accepted = first - block_start
        need = math.ceil(round(self.spawn_ratio * n, 6))
        extra = sum((accepted >= (i - 1) * n + need).astype(jnp.int32) for i in range(1, self.blocks))
        return block_start + (1 + extra) * n

    def initial_draft(self, prompt: jax.Array, seg: jax.Array, length: int, key: jax.Array) -> jax.Array:
        """`[B, length]` first draft for rows of left-padded `prompt [B, Lp]` (`seg` 0 on padding)."""
        b, lp = prompt.shape
        if self.draft_init == "repeat":
            return jnp.broadcast_to(prompt[:, -1:], (b, length))
        real = jnp.maximum(seg.sum(1), 1)  # tokens of each row, right-aligned
        pick = lp - 1 - jax.random.randint(key, (b, length), 0, 1 << 30) % real[:, None]
        return jnp.take_along_axis(prompt, pick, axis=1)

    def start(self, prompt, seg, gen_length, key):
        draft = self.initial_draft(prompt, seg, gen_length, key)
        if not self.recycle:
            return draft, jnp.zeros((), jnp.float32)
        b, cap, w = prompt.shape[0], self.recycle_capacity, self.layout().accept_width
        return draft, {"keys": jnp.full((b, cap), -1, jnp.int32), "tails": jnp.zeros((b, cap, w), jnp.int32),
                       "next": jnp.zeros((b,), jnp.int32)}

    def propose(self, state, last, draft):
        branches, valid = draft[:, None, :-1], jnp.ones((draft.shape[0], 1), bool)
        if self.recycle:
            pooled, ok = self.recycled_drafts(state, last)
            branches, valid = jnp.concatenate([branches, pooled[..., :-1]], 1), jnp.concatenate([valid, ok], 1)
        return Proposal(jnp.zeros((draft.shape[0], 0), jnp.int32), branches, valid)

    def update(self, state, last, proposal, lookahead_predictions, tokens, active, seen=None):
        """With recycling: this window's greedy output (verified prefix, rejected tail), keyed by
        the token before it, joins the pool."""
        return self.remember(state, last, tokens, active) if self.recycle else state

    # -- rejection recycling: the pool is the policy's carry ------------------------------------
    def recycled_drafts(self, state, last: jax.Array) -> tuple[jax.Array, jax.Array]:
        """`(drafts [B, R, W], valid [B, R])`: the R most recent pool entries keyed by `last [B]`."""
        keys, cap = state["keys"], self.recycle_capacity
        age = (state["next"][:, None] - 1 - jnp.arange(cap)[None]) % cap
        score = jnp.where(keys == last[:, None], cap - age, 0)
        best, index = jax.lax.top_k(score, self.recycle)
        return jnp.take_along_axis(state["tails"], index[..., None], axis=1), best > 0

    def remember(self, state, key_token: jax.Array, tail: jax.Array, store: jax.Array):
        """Add `tail [B, W]` under `key_token [B]` for rows where `store [B]` (the oldest entry goes)."""
        rows = jnp.arange(key_token.shape[0])
        slot = state["next"]
        keys = state["keys"].at[rows, slot].set(jnp.where(store, key_token, state["keys"][rows, slot]))
        tails = state["tails"].at[rows, slot].set(jnp.where(store[:, None], tail, state["tails"][rows, slot]))
        return {"keys": keys, "tails": tails, "next": jnp.where(store, (slot + 1) % self.recycle_capacity, slot)}
