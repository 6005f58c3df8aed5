"""Medusa decoding (Cai et al., 2024) and blockwise parallel decoding (Stern et al., 2018) for
causal models: heads on the last hidden state draft the next tokens, a token tree of their top-k
is verified in one forward (`TreeDraftPolicy`, `MaskSpec(kind="tree")`).

Each step feeds `[current | tree]`. The current token is the last decided one; head k's top-k at
the hidden state *before* it (the previous step's deepest accepted node, or the prompt's
second-to-last token after the prefill) fill the tree's depth-(k+1) nodes: a node is a path of
ranks `(r_1, .., r_d)`, its token head (d-1)'s r_d-th choice. `choices` is the tree as published
(`medusa_choices.py`); the default is the 63-node tree for 7B models (`MEDUSA_63`, 4 heads, top-10).

Acceptance:

* `greedy` (temperature 0): a node is verified when its parent is and it equals the parent's
  argmax; the deepest verified node wins (ties: the lowest index; two siblings share a token only
  when a head repeats a token among its top-k, and then both paths are the same text), and the
  argmax after it is committed too. The output equals greedy decoding token for token.
* `typical` (temperature T > 0; Medusa's typical acceptance): a node is accepted when its parent is
  and `p(token) > min(epsilon, alpha * exp(-H(p)))`, p the parent's softmax(logits / T) (published:
  epsilon 0.09, alpha 0.3). Among the deepest accepted paths the one with the largest sum of log p
  wins; the token after it is drawn from p restricted to the tokens passing the same bar. Not
  lossless: it trades exactness for acceptance, as published.

`bpd` is blockwise parallel decoding on the same heads: a chain with each head's top-1.

The heads (`jaxdllm.models.medusa.MedusaHeads`) are the policy's parameters (`needs_params`),
found beside the model (`medusa_heads.safetensors`); the policy's carry is the heads' top-k.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxdllm.attention.mask import tree_ancestry, tree_depths
from jaxdllm.checkpoint.side_files import load_module, read_facts, save_module, side_file_path
from jaxdllm.decoding.policies.draft_verify import Proposal, TreeDraftPolicy, tree_accept, tree_verified
from jaxdllm.errors import ConfigError
from jaxdllm.models.medusa import MedusaHeads

HEADS_FILE = "medusa_heads.safetensors"

# The published 63-node tree for 7B models (Medusa's `mc_sim_7b_63`): paths of top-k ranks.
MEDUSA_63 = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,), (9,),
    (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1),
    (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0),
    (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0),
    (0, 0, 0, 1), (1, 6), (0, 7, 0))

ACCEPTANCE = ("greedy", "typical")


def chain(depth: int) -> tuple[tuple[int, ...], ...]:
    """The chain of each head's top-1 (`depth` heads): blockwise parallel decoding's draft."""
    return tuple((0,) * d for d in range(1, depth + 1))


def check_choices(choices, policy: str) -> None:
    """Raise `ConfigError` unless `choices` is a tree of rank paths (every path's parent present)."""
    if (not isinstance(choices, tuple) or not choices
            or any(not isinstance(c, tuple) or not c or any(not isinstance(r, int) or r < 0 for r in c)
                   for c in choices)):
        raise ConfigError(f"choices must be a non-empty tuple of paths, each a non-empty tuple of ranks >= 0, got "
                          f"{choices!r} (policy {policy!r})")
    choices_tree(choices)


def choices_tree(choices) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """`(parents, depth, rank)` of a tree given as paths of ranks, sorted by (length, path) as
    published: `parents` the `TreeDraftPolicy` tuple (-1 under the current token), `depth [N]`
    (1-based: the head is depth - 1), `rank [N]` each node's top-k rank."""
    paths = sorted({tuple(c) for c in choices}, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(paths)}
    for p in paths:
        if len(p) > 1 and p[:-1] not in index:
            raise ConfigError(f"Medusa choices: path {list(p)} has no parent {list(p[:-1])} in the tree")
    parents = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in paths)
    return parents, np.asarray([len(p) for p in paths], np.int32), np.asarray([p[-1] for p in paths], np.int32)


@dataclasses.dataclass(frozen=True)
class Medusa(TreeDraftPolicy):
    """`choices`: the tree as paths of top-k ranks (default `MEDUSA_63`); `acceptance`: `greedy`
    or `typical`; `posterior_threshold` epsilon and `posterior_alpha` alpha of typical acceptance.
    See the module docstring."""

    choices: tuple = MEDUSA_63
    acceptance: str = "greedy"
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    name = "medusa"
    needs_params = True
    params_kind = "its draft heads (medusa_heads.safetensors beside the model)"
    reads_hidden = True

    def check(self, config):
        if self.acceptance not in ACCEPTANCE:
            raise ConfigError(f"acceptance must be one of {ACCEPTANCE}, got {self.acceptance!r} (policy {self.name!r})")
        if self.acceptance == "greedy" and config.temperature != 0:
            raise ConfigError(f"policy={self.name!r} with greedy acceptance verifies drafts against greedy decoding: "
                              "set temperature = 0, or acceptance='typical' to sample")
        if self.acceptance == "typical" and config.temperature <= 0:
            raise ConfigError("typical acceptance samples at temperature > 0; at temperature 0 use acceptance='greedy'")
        check_choices(self.choices, self.name)

    def tree_parents(self):
        return choices_tree(self.choices)[0]

    @property
    def num_heads(self) -> int:
        return max(len(c) for c in self.choices)

    @property
    def top_k(self) -> int:
        return max(max(c) for c in self.choices) + 1

    def load_params(self, directory, config):
        """The heads saved beside a model (`directory/medusa_heads.safetensors`), with at least as
        many heads as the tree is deep."""
        heads = load_heads(directory)
        if heads.num_heads < self.num_heads:
            raise ConfigError(f"the tree needs {self.num_heads} Medusa heads, {directory} has {heads.num_heads}: "
                              "pass choices no deeper than that")
        return heads

    def start(self, prompt, seg, gen_length, key):
        b = prompt.shape[0]
        return (jnp.broadcast_to(prompt[:, -1:], (b, gen_length)),
                jnp.zeros((b, self.num_heads, self.top_k), jnp.int32))

    def seed(self, state, hidden, params, unembed, temperature=0.0):
        if not isinstance(params, MedusaHeads) or params.num_heads < self.num_heads:
            have = f"{params.num_heads} heads" if isinstance(params, MedusaHeads) else repr(type(params).__name__)
            raise ConfigError(f"policy {self.name!r} needs MedusaHeads with at least {self.num_heads} heads as "
                              f"policy_params (jaxdllm.policy_params(model_dir, config) reads them), got {have}")
        return self._top_k(hidden, params, unembed)

    def _top_k(self, hidden, params, unembed):
        """`[B, heads, top_k]` int32: each head's best tokens from `hidden [B, D]`."""
        logits = params.logits(hidden[:, None], unembed)[:self.num_heads, :, 0]       # [K, B, V]
        return jnp.swapaxes(jax.lax.top_k(logits, self.top_k)[1], 0, 1).astype(jnp.int32)

    def propose(self, state, last, draft):
        _, depth, rank = choices_tree(self.choices)
        nodes = state[:, depth - 1, rank]                                                # [B, N]
        b = last.shape[0]
        return Proposal(jnp.zeros((b, 0), jnp.int32), jnp.zeros((b, 0, 0), jnp.int32), jnp.ones((b, 0), bool),
                        nodes)

    def accept(self, predictions, proposal, candidates, logits=None, key=None, temperature=0.0):
        if self.acceptance == "greedy":
            return super().accept(predictions, proposal, candidates)
        return typical_accept(self.layout().mask_tree(), proposal.nodes, logits, candidates, key, temperature,
                              self.posterior_threshold, self.posterior_alpha)

    def update(self, state, last, proposal, lookahead_predictions, tokens, active, seen=None):
        """The heads' top-k at the deepest accepted node: they draft the next step's tree."""
        hidden = jnp.take_along_axis(seen.hidden, seen.verdict.last[:, None, None], axis=1)[:, 0]
        return jnp.where(active[:, None, None], self._top_k(hidden, seen.params, seen.unembed), state)


def typical_threshold(probs: jax.Array, epsilon: float, alpha: float) -> jax.Array:
    """`[...]` Medusa's typical-acceptance bar `min(epsilon, alpha * exp(-H(p)))` for
    `probs [..., V]` (H in nats)."""
    entropy = jnp.sum(jax.scipy.special.entr(probs), axis=-1)
    return jnp.minimum(epsilon, alpha * jnp.exp(-entropy))


def typical_accept(mask_tree, nodes, logits, candidates, key, temperature, epsilon, alpha):
    """Typical acceptance over a tree (see the module docstring): `nodes [B, N]` node tokens,
    `logits [B, 1 + N, V]` at the current token and every node, `candidates [B, W]`."""
    probs = jax.nn.softmax(logits.astype(jnp.float32) / temperature, axis=-1)            # [B, 1 + N, V]
    bar = typical_threshold(probs, epsilon, alpha)                                         # [B, 1 + N]
    parent = np.asarray(mask_tree[1:])
    p_node = jnp.take_along_axis(probs[:, parent], nodes[..., None], axis=-1)[..., 0]    # [B, N]
    verified = tree_verified(mask_tree, p_node > bar[:, parent])
    # Among the deepest accepted nodes, the path with the largest log-likelihood.
    logp = jnp.concatenate([jnp.zeros_like(p_node[:, :1]), jnp.log(jnp.maximum(p_node, 1e-30))], 1)
    path_logp = logp @ jnp.asarray(tree_ancestry(mask_tree), jnp.float32).T              # [B, 1 + N]
    depth = jnp.asarray(tree_depths(mask_tree))
    deepest = jnp.max(jnp.where(verified, depth, -1), axis=1, keepdims=True)
    score = jnp.where(verified & (depth == deepest), path_logp, -jnp.inf)
    best_only = jnp.arange(len(mask_tree))[None] == jnp.argmax(score, axis=1)[:, None]
    # The token after the path: drawn from p restricted to the tokens that pass the bar.
    typical = probs > bar[..., None]
    gumbel = jax.random.gumbel(key, probs.shape)
    bonus = jnp.argmax(jnp.where(typical, jnp.log(jnp.maximum(probs, 1e-30)) + gumbel, -jnp.inf), -1)
    predictions = jnp.argmax(logits, -1).astype(jnp.int32)
    bonus = jnp.where(typical.any(-1), bonus, predictions).astype(jnp.int32)
    return tree_accept(mask_tree, nodes, predictions, verified & best_only, candidates, bonus=bonus)


@dataclasses.dataclass(frozen=True)
class Bpd(Medusa):
    """Blockwise parallel decoding on Medusa heads: the chain of each head's top-1 (`choices`
    defaults to `chain(4)`)."""

    choices: tuple = chain(4)
    name = "bpd"


def save_heads(heads: MedusaHeads, path, **facts) -> Path:
    """Write `heads` to `path` (a model folder: `medusa_heads.safetensors` in it); `facts`
    (JSON-able: the model they belong to, how they were trained) go in the metadata."""
    meta = {"num_heads": heads.num_heads, "embed_dim": heads.embed_dim, "layers": heads.num_layers, **facts}
    return save_module(heads, side_file_path(path, HEADS_FILE), "medusa", meta, "medusa heads")


def heads_facts(path) -> dict:
    """The metadata `save_heads` wrote (`num_heads`, `embed_dim`, `layers`, and the facts given)."""
    target = side_file_path(path, HEADS_FILE)
    return read_facts(target, "medusa", f"Medusa heads at {target}: train them with a recipe of objective "
                                         "'medusa' (training/medusa_tasks_cpu.toml)")


def load_heads(path) -> MedusaHeads:
    """The heads in `path` (a model folder holding `medusa_heads.safetensors`, or the file)."""
    facts = heads_facts(path)
    return load_module(side_file_path(path, HEADS_FILE),
                       lambda: MedusaHeads(facts["num_heads"], facts["embed_dim"], facts["layers"]),
                       f"{facts['num_heads']} Medusa heads of width {facts['embed_dim']}")
