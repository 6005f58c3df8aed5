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

A tree layout (`VerifyLayout.tree`, policies deriving from `TreeDraftPolicy`: Medusa, blockwise
parallel decoding, Token Recycling) replaces the branches by a token tree,

    [current | nodes: one token each, parent given by the static tuple `tree`]

fed under `MaskSpec(kind="tree")`: each node sees the decided text, the current token and its
ancestors. Node n is verified when its parent is and its token is the parent's prediction; the
deepest verified node wins (`tree_accept`) and its path's K/V move into place.

The accepted branch's K/V are moved to the slots after the current token, so the KV cache stays
exact for every decided token (see `draft_canvas.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdllm.attention.mask import tree_ancestry, tree_depths
from jaxdllm.decoding.policies.base import Policy
from jaxdllm.errors import ConfigError


class VerifyLayout(NamedTuple):
    """Static shape of one row's draft-and-verify forward (hashable).

    Attributes:
      levels, width: the lookahead window (0, 0 for none).
      branches: verification branches C per forward.
      branch_len: draft tokens per branch; a step accepts at most `branch_len + 1` tokens.
      tree: a token tree instead (then levels = width = branches = branch_len = 0): the parent of
        each node, `-1` for a child of the current token, else an earlier node's index.
    """

    levels: int
    width: int
    branches: int
    branch_len: int
    tree: tuple[int, ...] = ()

    @property
    def lookahead_len(self) -> int:
        """E: tokens of the lookahead window."""
        return self.levels * self.width

    @property
    def length(self) -> int:
        """Tokens fed per row and step."""
        return 1 + self.lookahead_len + self.branches * self.branch_len + len(self.tree)

    @property
    def accept_width(self) -> int:
        """W: positions one step can accept."""
        if self.tree:
            return int(tree_depths(self.mask_tree()).max()) + 1
        return self.branch_len + 1

    def mask_tree(self) -> tuple[int, ...]:
        """`MaskSpec.tree` of a tree layout: the current token (node 0) and the draft nodes after it."""
        return (-1, *(p + 1 for p in self.tree))

    def position_offsets(self) -> np.ndarray:
        """`[length]` RoPE positions relative to the current token: lookahead (level l, column j)
        sits at `1 + l + j` (each level one Jacobi step ahead of the last), branch token k at `1 + k`,
        a tree node at its depth."""
        if self.tree:
            return tree_depths(self.mask_tree()).astype(np.int32)
        look = [1 + l + j for l in range(self.levels) for j in range(self.width)]
        branch = list(range(1, self.branch_len + 1)) * self.branches
        return np.asarray([0] + look + branch, np.int32)

    def mask_fields(self, start) -> dict:
        """The `MaskSpec` fields of this layout's forward for rows whose current token sits at `start`."""
        if self.tree:
            return dict(kind="tree", prefix_len=start, tree=self.mask_tree())
        return dict(kind="lookahead", prefix_len=start, window_shape=self.window_shape())

    def window_shape(self) -> tuple[int, int, int]:
        """`MaskSpec.window_shape` of this layout."""
        return self.levels, self.width, self.branch_len


class Proposal(NamedTuple):
    """What a step feeds besides the current token.

    Attributes:
      lookahead: `[B, E]` int32 tokens of the lookahead window (E may be 0).
      branches: `[B, C, branch_len]` int32 drafts to verify.
      valid: `[B, C]` bool; an invalid branch is fed but never accepted.
      nodes: `[B, N]` int32 tokens of a tree layout's nodes (None for branch layouts).
      draft_probs: `[B, N, V]` float32 the distribution each node's token was drawn from, for
        sampling acceptance rules (None when drafts are not sampled).
    """

    lookahead: jax.Array
    branches: jax.Array
    valid: jax.Array
    nodes: jax.Array | None = None
    draft_probs: jax.Array | None = None


class Accepted(NamedTuple):
    """A step's verdict per row.

    Attributes:
      branch: `[B]` int32, the branch whose K/V and predictions are kept.
      commit: `[B, W]` bool, the positions decided now (a prefix of the candidates).
      tokens: `[B, W]` int32, the chosen branch's predictions (exact where committed; the next
        draft elsewhere).
      path: tree layouts: `[B, W - 1]` int32 layout indices of the accepted nodes, root side
        first (their K/V move into place); None for branch layouts (the chosen branch's slots).
      last: tree layouts: `[B]` int32 layout index of the deepest accepted node (the current
        token's, 0, when no node was accepted); None for branch layouts.
    """

    branch: jax.Array
    commit: jax.Array
    tokens: jax.Array
    path: jax.Array | None = None
    last: jax.Array | None = None


class Seen(NamedTuple):
    """What a step's forward computed, for policies that learn from it (`update(..., seen=)`).

    Attributes:
      ids: `[B, length]` int32 tokens fed (the current token first).
      logits: `[B, length, V]` float32 logits at every fed position.
      hidden: `[B, length, D]` final-normed hidden states (policies with `reads_hidden`), else None.
      verdict: the step's `Accepted`.
      params: the policy's own parameters (`needs_params`), else None.
      unembed: the model's LM head (`Transformer.unembed`).
      temperature: the sampler's temperature (a Python float).
      lay: the generation's static `Layout` (prompt length, canvas length).
    """

    ids: jax.Array
    logits: jax.Array
    hidden: jax.Array | None
    verdict: Accepted
    params: Any
    unembed: Any
    temperature: float = 0.0
    lay: Any = None


def exact_prefix(tokens: jax.Array, draft: jax.Array) -> jax.Array:
    """`[..., W]` bool: predictions `tokens` whose inputs were all right, i.e. position 0 and every
    position whose earlier drafts equal their predictions (`draft`, `tokens`: `[..., W]`)."""
    agree = (draft == tokens).astype(jnp.int32)
    return jnp.concatenate([jnp.ones_like(agree[..., :1]), jnp.cumprod(agree[..., :-1], axis=-1)], -1).astype(bool)


@dataclasses.dataclass(frozen=True)
class DraftVerifyPolicy(Policy):
    """Base class of the draft-and-verify policies (see the module docstring). Greedy: the
    output equals greedy autoregressive decoding token for token."""

    canvas: ClassVar[str] = "draft_canvas"

    def check(self, config) -> None:
        if config.temperature != 0:
            raise ConfigError(f"policy={self.name!r} verifies drafts against greedy decoding: set temperature = 0")

    def layout(self) -> VerifyLayout:
        """The forward's layout, from the policy's own settings (a draft-and-verify policy has no
        diffusion block: `SamplerConfig.block_length` is not its setting; Jacobi's draft window is
        its `window`)."""
        raise NotImplementedError

    def in_flight_end(self, first: jax.Array, answer_start: int) -> jax.Array:
        """`[B]` canvas index where the positions a step may accept end, for rows whose first
        undecided position is `first [B]` (default: every position a branch reaches)."""
        return first + self.layout().accept_width

    def start(self, prompt: jax.Array, seg: jax.Array, gen_length: int,
              key: jax.Array) -> tuple[jax.Array, Any]:
        """`(first draft [B, gen_length], carry)` for left-padded `prompt [B, Lp]` (`seg` 0 on padding)."""
        raise NotImplementedError

    def for_model(self, state, vocab_size: int):
        """The carry `start` returned, completed with what depends on the model (its vocabulary
        size; e.g. Token Recycling's `[B, V, k]` table); default unchanged."""
        return state

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
               tokens: jax.Array, active: jax.Array, seen: Seen | None = None):
        """The carry after a step: `lookahead_predictions [B, E]` (the argmax after each lookahead
        token), the accepted branch's predictions `tokens [B, W]`, rows that decoded `active [B]`,
        and what the forward computed (`seen`)."""
        return state

    def seed(self, state, hidden: jax.Array | None, params, unembed, temperature: float = 0.0):
        """The carry after the prompt's prefill (it may differ in structure from `start`'s: the
        loop starts here). `hidden [B, D]`: for policies with `reads_hidden`, the final-normed
        hidden state of the token before the last prompt token, else None; `params`: the policy's
        own parameters; `temperature`: the sampler's."""
        return state


@dataclasses.dataclass(frozen=True)
class TreeDraftPolicy(DraftVerifyPolicy):
    """Draft-and-verify policies over a token tree (`VerifyLayout.tree`): `tree_parents()` gives
    the static tree; `propose` fills `Proposal.nodes`; `accept` is `tree_accept` (greedy) unless
    overridden. `reads_hidden`: the engine hands `update` (and `seed`, after the prefill) the
    forward's hidden states."""

    reads_hidden: ClassVar[bool] = False

    def tree_parents(self) -> tuple[int, ...]:
        """The draft tree: each node's parent (-1: the current token)."""
        raise NotImplementedError

    def layout(self) -> VerifyLayout:
        return VerifyLayout(0, 0, 0, 0, self.tree_parents())

    def accept(self, predictions, proposal, candidates, logits=None, key=None, temperature=0.0) -> Accepted:
        """Greedy: `predictions [B, 1 + N]` the argmax at the current token and at every node
        (`logits [B, 1 + N, V]`, the step's `key` and the sampler's `temperature` are there for
        sampling rules)."""
        tree = self.layout().mask_tree()
        parent = np.asarray(tree[1:])
        verified = tree_verified(tree, proposal.nodes == predictions[:, parent])
        return tree_accept(tree, proposal.nodes, predictions, verified, candidates)


def tree_verified(mask_tree: tuple[int, ...], passes: jax.Array) -> jax.Array:
    """`[B, 1 + N]` bool: the current token (always) and every node that `passes [B, N]` its
    parent's test and whose parent is verified."""
    ok = [jnp.ones(passes.shape[:1], bool)]
    for i, parent in enumerate(mask_tree[1:]):
        ok.append(ok[parent] & passes[:, i])
    return jnp.stack(ok, 1)


def tree_accept(mask_tree: tuple[int, ...], nodes: jax.Array, predictions: jax.Array, verified: jax.Array,
                candidates: jax.Array, bonus: jax.Array | None = None) -> Accepted:
    """The deepest verified node's path (ties: the lowest layout index) and the token after it.

    Args:
      mask_tree: the layout's `mask_tree()` (node 0 the current token).
      nodes: `[B, N]` node tokens; predictions: `[B, 1 + N]` the argmax at every layout position.
      verified: `[B, 1 + N]` from `tree_verified`; candidates: `[B, W]` positions the row may accept.
      bonus: `[B, 1 + N]` the token committed after each node if it ends the path (default:
        `predictions`; typical acceptance samples it).
    """
    depths = tree_depths(mask_tree)
    depth = jnp.asarray(depths)
    n, w = len(mask_tree), int(depths.max()) + 1
    best = jnp.argmax(jnp.where(verified, depth * n - jnp.arange(n), -1), axis=1).astype(jnp.int32)
    # Ancestors of every node by depth: `above[node, d]` is its ancestor at depth d + 1 (itself at its own).
    above = np.zeros((n, max(w - 1, 1)), np.int32)
    for node, a in zip(*np.nonzero(tree_ancestry(mask_tree))):
        if depths[a] >= 1:
            above[node, depths[a] - 1] = a
    path = jnp.asarray(above)[best][:, :w - 1]                                   # [B, W - 1]
    fed = jnp.concatenate([jnp.zeros_like(nodes[:, :1]), nodes], 1)              # [B, 1 + N]
    after = predictions if bonus is None else bonus
    path_tokens = jnp.take_along_axis(fed, path, axis=1)
    k = depth[best]                                                              # accepted draft tokens
    tokens = jnp.concatenate([path_tokens, jnp.zeros_like(path_tokens[:, :1])], 1)
    tokens = jnp.where(jnp.arange(w)[None] == k[:, None], jnp.take_along_axis(after, best[:, None], axis=1), tokens)
    commit = candidates & (jnp.arange(w)[None] <= k[:, None])
    return Accepted(jnp.zeros_like(best), commit, tokens.astype(jnp.int32), path, best)
