"""Token Recycling (Luo et al., ACL 2025, "Turning Trash into Treasure: Accelerating Inference of
Large Language Models with Token Recycling"): training-free drafts from the model's own past top-k.

The policy's carry is an adjacency table `[B, V, k]`: for every token, the k tokens the model
last ranked highest right after it. After each forward, every fed position (the current token,
accepted and rejected draft nodes alike) writes its top-k into the row of its token (when a token
appears at several fed positions, the one latest in the layout is kept). Each step drafts a
static tree from the current token by breadth-first expansion through the table (a node at rank
r under its parent is `table[parent token, r]`) and verifies it in one forward under a tree mask
(`TreeDraftPolicy`, greedy: the output equals greedy decoding token for token).

The tree (`recycling_tree`): the `nodes` paths of ranks with the largest prior `prod 1/(1 + r)`,
depth at most `max_depth`, ranks below `k`; ties by (depth, path). The table starts at zeros,
so a row's first steps draft little until its forwards have filled it. Per row: a row's output
and forwards do not depend on its batch. State size: `B * V * k` int32 (151,936 x 8 x 4 bytes =
4.9 MB per row for Qwen2.5's vocabulary).
"""

from __future__ import annotations

import dataclasses
import heapq

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.draft_verify import Proposal, TreeDraftPolicy
from jaxdllm.decoding.policies.medusa import choices_tree
from jaxdllm.errors import ConfigError


def recycling_tree(nodes: int, k: int, max_depth: int) -> tuple[tuple[int, ...], ...]:
    """The `nodes` rank paths of largest prior `prod_j 1 / (1 + r_j)` (depth <= `max_depth`, ranks
    < `k`), a tree by construction (a path's prefix has a larger prior). Ties: shallower first,
    then by path."""
    heap = [(-1.0 / (1 + r), 1, (r,)) for r in range(k)]
    heapq.heapify(heap)
    out = []
    while heap and len(out) < nodes:
        score, depth, path = heapq.heappop(heap)
        out.append(path)
        if depth < max_depth:
            for r in range(k):
                heapq.heappush(heap, (score / (1 + r), depth + 1, path + (r,)))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class TokenRecycling(TreeDraftPolicy):
    """`k` candidates per token in the table, a draft tree of `nodes` nodes at most `max_depth`
    deep. See the module docstring."""

    k: int = 8
    nodes: int = 64
    max_depth: int = 6
    name = "token_recycling"

    def check(self, config):
        super().check(config)
        for field, low in (("k", 1), ("nodes", 1), ("max_depth", 1)):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"{field} must be an integer >= {low}, got {value!r} (policy {self.name!r})")

    def choices(self):
        return recycling_tree(self.nodes, self.k, self.max_depth)

    def tree_parents(self):
        return choices_tree(self.choices())[0]

    def start(self, prompt, seg, gen_length, block_length, key):
        b = prompt.shape[0]
        return jnp.broadcast_to(prompt[:, -1:], (b, gen_length)), jnp.zeros((b,), jnp.int32)

    def for_model(self, state, vocab_size):
        """The table, all zeros: `[B, V, k]` int32."""
        return jnp.zeros((state.shape[0], vocab_size, self.k), jnp.int32)

    def propose(self, state, last, draft):
        parents, _, rank = choices_tree(self.choices())
        rows = jnp.arange(last.shape[0])
        tokens = []
        for i, parent in enumerate(parents):  # parents come first: breadth-first through the table
            above = last if parent < 0 else tokens[parent]
            tokens.append(state[rows, above, int(rank[i])])
        b = last.shape[0]
        return Proposal(jnp.zeros((b, 0), jnp.int32), jnp.zeros((b, 0, 0), jnp.int32), jnp.ones((b, 0), bool),
                        jnp.stack(tokens, 1))

    def update(self, state, last, proposal, lookahead_predictions, tokens, active, seen=None):
        """Every fed position's top-k into its token's row (rows that decoded this step)."""
        top = jax.lax.top_k(seen.logits, self.k)[1].astype(jnp.int32)                    # [B, L, k]

        def one(table, ids, top, on):
            new = table.at[ids].set(top)  # duplicates: XLA keeps one of them
            return jnp.where(on, new, table)

        return jax.vmap(one)(state, seen.ids, top, active)
