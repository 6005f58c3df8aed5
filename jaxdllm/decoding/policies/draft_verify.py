"""The draft-and-verify interface: policies for causal models that propose draft tokens and accept
the longest verified prefix, all in one forward per step (Jacobi decoding, Lookahead decoding;
later self-speculative dLLM decoding, APD, Medusa-style heads).

Each step, for every row still decoding, the engine (`decoding/draft_canvas.py`) calls

    policy.propose(state, last [B], draft [B, W])  -> Proposal (lookahead tokens, branches)
    ... one forward over the policy's `VerifyLayout` under its structured mask ...
    policy.accept(predictions [B, C, W], proposal, candidates [B, W]) -> Accepted
    policy.update(state, last, proposal, lookahead_predictions [B, E], accepted tokens [B, W], active [B])

and nothing else of the policy. The layout of the forward, per row, is

    [current | lookahead window: levels x width | branches: C x branch_len]

`current` is the row's last decided token (its prediction is exact). A branch is a draft of the
next `branch_len` tokens; the prediction after branch token k is exact when the branch's tokens
before it equal their predictions, so branch c verifies `1 + (leading matches)` tokens and the
step accepts the best branch (`W = branch_len + 1` positions at most). The lookahead window is
the policy's own scratch (Lookahead decoding's 2-D Jacobi window); the engine feeds it, reads its
predictions back and hands them to `update`. The mask is `MaskSpec(kind="lookahead")`, so the
tile kernels skip what no token may see.

The accepted branch's K/V are moved to the slots after the current token, so the KV cache stays
exact for every decided token (see `draft_canvas.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdllm.decoding.policies.base import Policy
from jaxdllm.errors import ConfigError


class VerifyLayout(NamedTuple):
    """Static shape of one row's draft-and-verify forward (hashable).

    Attributes:
      levels, width: the lookahead window (0, 0 for none).
      branches: verification branches C per forward.
      branch_len: draft tokens per branch; a step accepts at most `branch_len + 1` tokens.
    """

    levels: int
    width: int
    branches: int
    branch_len: int

    @property
    def lookahead_len(self) -> int:
        """E: tokens of the lookahead window."""
        return self.levels * self.width

    @property
    def length(self) -> int:
        """Tokens fed per row and step."""
        return 1 + self.lookahead_len + self.branches * self.branch_len

    @property
    def accept_width(self) -> int:
        """W: positions one step can accept."""
        return self.branch_len + 1

    def position_offsets(self) -> np.ndarray:
        """`[length]` RoPE positions relative to the current token: lookahead (level l, column j)
        sits at `1 + l + j` (each level one Jacobi step ahead of the last), branch token k at `1 + k`."""
        look = [1 + l + j for l in range(self.levels) for j in range(self.width)]
        branch = list(range(1, self.branch_len + 1)) * self.branches
        return np.asarray([0] + look + branch, np.int32)

    def window_shape(self) -> tuple[int, int, int]:
        """`MaskSpec.window_shape` of this layout."""
        return self.levels, self.width, self.branch_len


class Proposal(NamedTuple):
    """What a step feeds besides the current token.

    Attributes:
      lookahead: `[B, E]` int32 tokens of the lookahead window (E may be 0).
      branches: `[B, C, branch_len]` int32 drafts to verify.
      valid: `[B, C]` bool; an invalid branch is fed but never accepted.
    """

    lookahead: jax.Array
    branches: jax.Array
    valid: jax.Array


class Accepted(NamedTuple):
    """A step's verdict per row.

    Attributes:
      branch: `[B]` int32, the branch whose K/V and predictions are kept.
      commit: `[B, W]` bool, the positions decided now (a prefix of the candidates).
      tokens: `[B, W]` int32, the chosen branch's predictions (exact where committed; the next
        draft elsewhere).
    """

    branch: jax.Array
    commit: jax.Array
    tokens: jax.Array


def exact_prefix(tokens: jax.Array, draft: jax.Array) -> jax.Array:
    """`[..., W]` bool: predictions `tokens` whose inputs were all right, i.e. position 0 and every
    position whose earlier drafts equal their predictions (`draft`, `tokens`: `[..., W]`)."""
    agree = (draft == tokens).astype(jnp.int32)
    return jnp.concatenate([jnp.ones_like(agree[..., :1]), jnp.cumprod(agree[..., :-1], axis=-1)], -1).astype(bool)


@dataclasses.dataclass(frozen=True)
class DraftVerifyPolicy(Policy):
    """Base class of the draft-and-verify policies (see the module docstring). Greedy: the
    output equals greedy autoregressive decoding token for token."""

    method: ClassVar[str] = "draft_canvas"

    def check(self, config) -> None:
        if config.temperature != 0:
            raise ConfigError(f"policy={self.name!r} verifies drafts against greedy decoding: set temperature = 0")

    def layout(self, block_length: int) -> VerifyLayout:
        """The forward's layout for the config's `block_length`."""
        raise NotImplementedError

    def in_flight_end(self, first: jax.Array, answer_start: int, block_length: int) -> jax.Array:
        """`[B]` canvas index where the positions a step may accept end, for rows whose first
        undecided position is `first [B]` (default: every position a branch reaches)."""
        return first + self.layout(block_length).accept_width

    def start(self, prompt: jax.Array, seg: jax.Array, gen_length: int, block_length: int,
              key: jax.Array) -> tuple[jax.Array, Any]:
        """`(first draft [B, gen_length], carry)` for left-padded `prompt [B, Lp]` (`seg` 0 on padding)."""
        raise NotImplementedError

    def propose(self, state, last: jax.Array, draft: jax.Array) -> Proposal:
        """The step's feed, from the carry, each row's last decided token `last [B]` and the draft
        the canvas holds for the next W positions `draft [B, W]`."""
        raise NotImplementedError

    def accept(self, predictions: jax.Array, proposal: Proposal, candidates: jax.Array) -> Accepted:
        """Greedy verification: each branch's exact prefix among `candidates [B, W]`, the longest
        wins (ties: the lowest branch). `predictions [B, C, W]`: the argmax after the current
        token and after each branch token."""
        exact = exact_prefix(predictions, jnp.concatenate([proposal.branches, predictions[..., -1:]], -1))
        first_only = jnp.arange(predictions.shape[-1]) == 0  # an invalid branch verifies nothing of its own
        exact = exact & (proposal.valid[..., None] | first_only)
        counts = (exact & candidates[:, None]).sum(-1)                     # [B, C]
        branch = jnp.argmax(counts, axis=1).astype(jnp.int32)
        tokens = jnp.take_along_axis(predictions, branch[:, None, None], axis=1)[:, 0]
        commit = candidates & (jnp.arange(tokens.shape[1])[None] < jnp.max(counts, axis=1)[:, None])
        return Accepted(branch, commit, tokens)

    def update(self, state, last: jax.Array, proposal: Proposal, lookahead_predictions: jax.Array,
               tokens: jax.Array, active: jax.Array):
        """The carry after a step: `lookahead_predictions [B, E]` (the argmax after each lookahead
        token), the accepted branch's predictions `tokens [B, W]`, rows that decoded `active [B]`."""
        return state
