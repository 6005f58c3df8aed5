"""Token Recycling (Luo et al., ACL 2025, "Turning Trash into Treasure: Accelerating Inference of
Large Language Models with Token Recycling"): training-free drafts from the model's own past top-k.

The policy's carry is an adjacency table `[B, V, k]`: for every token, the k tokens the model
last ranked highest right after it. After each forward, every fed position (the current token,
accepted and rejected draft nodes alike) writes its top-k into the row of its token (when a token
appears at several fed positions, the one latest in the layout is kept). Each step drafts a
static tree from the current token by breadth-first expansion through the table (a node at rank
r under its parent is `table[parent token, r]`) and verifies it in one forward under a tree mask
(`TreeDraftPolicy`, greedy: the output equals greedy decoding token for token).

The tree is the published template (`TR_TEMPLATE_80`: 80 nodes, up to 6 deep, ranks below k = 8;
a node is a path of ranks, breadth-first from the current token). The table starts at zeros, so
a row's first steps draft little until its forwards have filled it (the published code keeps
its table across generations; here it lives in one generation's carry, per row, so a row's
output and forwards do not depend on its batch). State size: `B * V * k` int32 (151,936 x 8 x 4 bytes =
4.9 MB per row for Qwen2.5's vocabulary).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.draft_verify import Proposal, TreeDraftPolicy
from jaxdllm.decoding.policies.medusa import check_choices, choices_tree


# The published tree template (version 2.2.2 of the authors' code): 80 nodes, 6 deep, ranks below 8 (the table's k).
TR_TEMPLATE_80 = (
    (0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,),
    (0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 6), (0, 7), (1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1),
    (2, 2), (3, 0), (3, 1), (4, 0), (5, 0), (6, 0), (7, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3), (0, 0, 4), (0, 0, 5), (0, 0, 6), (0, 0, 7), (0, 1, 0), (0, 1, 1),
    (0, 1, 2), (0, 2, 0), (0, 2, 1), (0, 3, 0), (0, 4, 0), (0, 5, 0), (0, 6, 0), (0, 7, 0), (1, 0, 0), (1, 0, 1),
    (1, 1, 0), (2, 0, 0), (3, 0, 0), (4, 0, 0), (5, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 3), (0, 0, 0, 4), (0, 0, 1, 0), (0, 0, 1, 1), (0, 0, 2, 0),
    (0, 0, 3, 0), (0, 0, 4, 0), (0, 1, 0, 0), (0, 2, 0, 0), (1, 0, 0, 0), (2, 0, 0, 0), (3, 0, 0, 0),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 2), (0, 0, 0, 1, 0), (0, 0, 0, 2, 0), (0, 0, 1, 0, 0),
    (0, 1, 0, 0, 0), (1, 0, 0, 0, 0),
    (0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 1), (0, 0, 0, 1, 0, 0))


@dataclasses.dataclass(frozen=True)
class TokenRecycling(TreeDraftPolicy):
    """`choices`: the draft tree as paths of table ranks (default the published `TR_TEMPLATE_80`);
    the table keeps `k = max rank + 1` tokens per row. See the module docstring."""

    choices: tuple = TR_TEMPLATE_80
    name = "token_recycling"

    def check(self, config):
        super().check(config)
        check_choices(self.choices, self.name)

    @property
    def k(self) -> int:
        return max(max(c) for c in self.choices) + 1

    def tree_parents(self):
        return choices_tree(self.choices)[0]

    def start(self, prompt, seg, gen_length, key):
        b = prompt.shape[0]
        return jnp.broadcast_to(prompt[:, -1:], (b, gen_length)), jnp.zeros((b,), jnp.int32)

    def for_model(self, state, vocab_size):
        """The table, all zeros: `[B, V, k]` int32."""
        return jnp.zeros((state.shape[0], vocab_size, self.k), jnp.int32)

    def propose(self, state, last, draft):
        parents, _, rank = choices_tree(self.choices)
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
            later = jnp.triu(ids[:, None] == ids[None, :], k=1).any(1)   # the same token fed again later
            new = table.at[jnp.where(later, table.shape[0], ids)].set(top, mode="drop")  # the latest one wins
            return jnp.where(on, new, table)

        return jax.vmap(one)(state, seen.ids, top, active)
