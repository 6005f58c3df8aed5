"""Speculative decoding of a causal model with a masked-diffusion drafter (SpecDiff, Christopher
et al., NAACL 2025; DiffuSpec's lattice drafts and adaptive length), on the draft canvas.

Each step the causal model (the target) verifies a draft of `gamma` tokens in one forward, as a
token tree (`TreeDraftPolicy`): one chain, or `beams` chains. The drafter is a second model in the
loop (`policy_params`, its own KV cache in the carry; `decoding/second_model.py`): after every
step it reads the tokens the step decided and the rest of the canvas as MASK (as a masked-diffusion
model is trained to see an answer) in one window after its cached prefix, and unmasks the next
`gamma` positions, `tokens_per_step` per drafter forward: the most confident first at temperature
0 (as its own sampler would), left to right when sampling.

* Greedy (temperature 0): the deepest chain node whose tokens all equal the target's argmax wins,
  plus the argmax after it; the output equals the target's greedy decoding token for token.
* Speculative sampling (temperature T > 0, one chain): draft token x_i, drawn from the drafter's
  q_i = softmax(logits / T), is accepted with probability min(1, p_i(x_i) / q_i(x_i)), p_i the
  target's softmax(logits / T); at the first rejection the token is drawn from
  norm(max(p_i - q_i, 0)) and the step ends; when every draft token is accepted, one more is drawn
  from p. The output follows the target's own sampling distribution exactly. Exactness needs
  each draft token's law given the tokens before it to be the q used: when sampling, the drafter
  unmasks left to right, so a token is drawn given the tokens left of it (and independently of the
  others of its chunk).
* `beams` > 1 (DiffuSpec's lattice, greedy only): one drafter forward over all `gamma` positions;
  each position keeps its smallest top set with probability mass >= `lattice_mass` (at most
  `lattice_top` tokens); a beam search scored by the drafter's log-probabilities keeps the `beams`
  best drafts, verified together as sibling chains.
* `adaptive`: each row drafts `min(gamma, round(mean accepted) + 1)` tokens, the mean a running
  average (halved weight each step) of the draft tokens its steps accepted; the drafter runs only
  as many forwards as the longest row needs. Tokens past a row's length are fed but never accepted.

The drafter's cache is approximate where a bidirectional drafter would have seen later tokens
(its K/V of decided text are written in the window that decided it); that changes drafts, never
the output, which the target decides.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdllm.decoding import branching
from jaxdllm.decoding.policies.base import in_unit_interval, rank_among
from jaxdllm.decoding.policies.draft_verify import Proposal, TreeDraftPolicy, tree_accept, tree_verified
from jaxdllm.decoding.second_model import check_second_model, load_companion, row_forward, window_mask
from jaxdllm.errors import ConfigError


class _Pending(NamedTuple):
    """What `start` knows, for `seed` (the drafter's prefill) to turn into `SpecState`."""

    prompt: jax.Array
    seg: jax.Array
    gen_length: int
    key: jax.Array
    vocab_size: int = 0


class SpecState(NamedTuple):
    """The carry.

    Attributes:
      cache: the drafter's `KVCache` `[B, S]`.
      end: `[B]` int32 canvas index of the drafter's next window (the decided text before it is cached).
      pad: `[B]` int32 left padding of each row's prompt (RoPE position = canvas index - pad).
      nodes: `[B, N]` int32 the next draft (chains laid out one after another).
      valid: `[B, N]` bool, draft tokens the next step may accept (within the row's draft length).
      probs: `[B, gamma, V]` float32 the drafter's distribution each chain-0 token was drawn from
        (`[B, gamma, 0]` at temperature 0, where nothing reads it).
      mean_accepted: `[B]` float32 running average of accepted draft tokens (`adaptive`).
      key: PRNG key of the drafter's draws.
      drafter_forwards: `[B]` int32 drafter forwards each row took part in (the prefill's included).
    """

    cache: Any
    end: jax.Array
    pad: jax.Array
    nodes: jax.Array
    valid: jax.Array
    probs: jax.Array
    mean_accepted: jax.Array
    key: jax.Array
    drafter_forwards: jax.Array


@dataclasses.dataclass(frozen=True)
class SpecDiffusion(TreeDraftPolicy):
    """A masked-diffusion drafter for a causal model (see the module docstring). `drafter`: the
    drafter's folder or shipped name (default: the one the model's `companions.json` names)."""

    gamma: int = 8
    tokens_per_step: int = 4
    beams: int = 1
    lattice_top: int = 4
    lattice_mass: float = 0.9
    adaptive: bool = True
    drafter: str = ""
    name = "spec_diffusion"
    needs_params = True
    params_kind = "its drafter, a masked-diffusion model with the same tokenizer (companions.json names it)"
    companion = "drafter"

    def check(self, config):
        for field in ("gamma", "tokens_per_step", "beams", "lattice_top"):
            if not isinstance(getattr(self, field), int) or getattr(self, field) < 1:
                raise ConfigError(f"{field} must be an integer >= 1, got {getattr(self, field)!r} "
                                  f"(policy {self.name!r})")
        if self.tokens_per_step > self.gamma:
            raise ConfigError(f"tokens_per_step ({self.tokens_per_step}) exceeds gamma ({self.gamma}): a drafter "
                              "forward unmasks at most the whole draft")
        in_unit_interval(self.lattice_mass, "lattice_mass", self.name)
        if self.beams > 1 and self.tokens_per_step != self.gamma:
            raise ConfigError(f"beams > 1 drafts the lattice of one drafter forward: set tokens_per_step = gamma "
                              f"({self.gamma})")
        if self.beams > 1 and config.temperature != 0:
            raise ConfigError("beams > 1 verifies several drafts greedily: set temperature = 0, or beams = 1 for "
                              "speculative sampling")

    def tree_parents(self):
        g = self.gamma
        return tuple(-1 if j == 0 else c * g + j - 1 for c in range(self.beams) for j in range(g))

    def companion_footprints(self, prompt_len: int, config) -> tuple:
        """The drafter: its cache of the prompt, the answer and a draft past it; its widest forward is
        the prefill window (the prompt and the answer as MASK), whose logits it keeps."""
        from jaxdllm.decoding.canvas import CompanionFootprint
        window = prompt_len + config.gen_length
        slots = window + self.layout().accept_width + config.gen_length
        return (CompanionFootprint("drafter", kv_slots=slots, widest=window, logits=window),)

    def load_params(self, directory, config, **load_options):
        """The drafter (`drafter`, or the one `directory/companions.json` names), after checking that
        its tokenizer is the model's; `load_options` go to `from_pretrained` (`mesh=`, `dtype=`)."""
        return load_companion(directory, self.drafter, self.name, "drafter", **load_options)

    def start(self, prompt, seg, gen_length, key):
        b = prompt.shape[0]
        return jnp.broadcast_to(prompt[:, -1:], (b, gen_length)), _Pending(prompt, seg, gen_length, key)

    def for_model(self, state, vocab_size):
        return state._replace(vocab_size=vocab_size)

    def seed(self, state: _Pending, hidden, params, unembed, temperature=0.0):
        """The drafter's prefill: the prompt and the answer's positions as MASK in one window (its
        K/V cached), and its first draft."""
        check_second_model(params, state.vocab_size, self.name, "drafter")
        if params.config.mask_token_id is None or params.config.attention == "causal":
            raise ConfigError(f"policy {self.name!r} drafts with a masked-diffusion model; the drafter given has "
                              f"attention {params.config.attention!r} and mask_token_id {params.config.mask_token_id}")
        prompt, seg = state.prompt, state.seg
        b, lp = prompt.shape
        if lp + state.gen_length > params.config.max_position:
            raise ConfigError(f"prompt ({lp} tokens after padding) + gen_length ({state.gen_length}) exceeds the "
                              f"drafter's max_position ({params.config.max_position}): lower gen_length")
        g = state.gen_length
        cache = params.init_cache(b, lp + g + self.layout().accept_width + g)
        pad = (lp - seg.sum(1)).astype(jnp.int32)
        tokens = jnp.concatenate([prompt, jnp.zeros((b, g), prompt.dtype)], 1).astype(jnp.int32)
        window_seg = jnp.concatenate([seg, jnp.ones((b, g), seg.dtype)], 1).astype(jnp.int32)
        start = jnp.zeros((b,), jnp.int32)
        decided = jnp.full((b,), lp, jnp.int32)
        lengths = jnp.full((b,), self.gamma, jnp.int32)
        cache, nodes, valid, probs, forwards = self._draft(params, cache, tokens, window_seg, start, decided, pad,
                                                           lengths, state.key, temperature)
        return SpecState(cache, decided, pad, nodes, valid, probs, jnp.full((b,), float(self.gamma), jnp.float32),
                         jax.random.fold_in(state.key, 1), jnp.full((b,), forwards, jnp.int32))

    def propose(self, state: SpecState, last, draft):
        b = last.shape[0]
        return Proposal(jnp.zeros((b, 0), jnp.int32), jnp.zeros((b, 0, 0), jnp.int32), state.valid, state.nodes,
                        draft_probs=state.probs)

    def accept(self, predictions, proposal, candidates, logits=None, key=None, temperature=0.0):
        tree = self.layout().mask_tree()
        if temperature == 0:
            parent = np.asarray(tree[1:])
            passes = (proposal.nodes == predictions[:, parent]) & proposal.valid
            return tree_accept(tree, proposal.nodes, predictions, tree_verified(tree, passes), candidates)
        return speculative_accept(tree, proposal.nodes, proposal.valid, proposal.draft_probs, logits, candidates, key,
                                  temperature)

    def update(self, state: SpecState, last, proposal, lookahead_predictions, tokens, active, seen=None):
        """The drafter reads the step's decided tokens and drafts the next `gamma` positions."""
        verdict = seen.verdict
        decided = verdict.commit.sum(1).astype(jnp.int32)                       # [B] tokens decided this step
        accepted = jnp.maximum(decided - 1, 0).astype(jnp.float32)
        mean = jnp.where(active, 0.5 * state.mean_accepted + 0.5 * accepted, state.mean_accepted)
        lengths = self._lengths(mean)
        b, w = tokens.shape
        lay = seen.lay
        window = jnp.concatenate([tokens, jnp.zeros((b, lay.total - lay.prompt_len), jnp.int32)], 1)
        inside = (state.end[:, None] + jnp.arange(window.shape[1])[None] < lay.total).astype(jnp.int32)
        key = jax.random.fold_in(state.key, 0)
        cache, nodes, valid, probs, forwards = self._draft(seen.params, state.cache, window, inside, state.end,
                                                 jnp.maximum(decided, 1), state.pad, lengths, key, seen.temperature)
        keep = active[:, None]
        return SpecState(cache, jnp.where(active, state.end + decided, state.end), state.pad,
                         jnp.where(keep, nodes, state.nodes), jnp.where(keep, valid, state.valid),
                         jnp.where(keep[..., None], probs, state.probs), mean, jax.random.fold_in(state.key, 1),
                         state.drafter_forwards + jnp.where(active, forwards, 0))

    def _lengths(self, mean):
        """`[B]` int32 each row's next draft length."""
        if not self.adaptive:
            return jnp.full(mean.shape, self.gamma, jnp.int32)
        return jnp.clip(jnp.round(mean).astype(jnp.int32) + 1, 1, self.gamma)

    def _draft(self, drafter, cache, tokens, seg, start, decided, pad, lengths, key, temperature):
        """Unmask the `gamma` positions after each row's `decided [B]` tokens of the window
        `tokens [B, L]` (written at slot `start [B]`), `tokens_per_step` per forward: the most
        confident first at temperature 0, left to right when sampling.
        Returns `(cache, nodes [B, N], valid [B, N], probs [B, gamma, V], forwards)`, forwards the
        drafter forwards run (an int32 scalar)."""
        b, length = tokens.shape
        g, chunk, shift = self.gamma, self.tokens_per_step, int(drafter.config.shift_logits)
        mask_id = drafter.config.mask_token_id
        column = jnp.arange(length)[None]
        draft_cols = decided[:, None] + jnp.arange(g)                                     # [B, gamma]
        positions = (start - pad)[:, None] + column
        canvas = jnp.where(column < decided[:, None], tokens, mask_id).astype(jnp.int32)
        rounds = jnp.max(-(-lengths // chunk))                                           # the longest row's forwards

        def one_round(r, carry):
            canvas, cache, draft, probs, open_ = carry
            logits, cache = row_forward(drafter, canvas, positions, start, cache, window_mask, seg)
            at = jnp.take_along_axis(logits, (draft_cols - shift)[..., None], axis=1)      # [B, gamma, V]
            if temperature == 0:  # the most confident masked positions, as the drafter's own sampler
                drawn, p = jnp.argmax(at, -1).astype(jnp.int32), jax.nn.softmax(at, -1)
                wanted = open_ & (jnp.arange(g)[None] < lengths[:, None])
                score = jnp.where(wanted, p.max(-1), jnp.where(open_, -1.0, -2.0))
                here = (rank_among(score, jnp.ones_like(open_)) < chunk) & open_
            else:  # left to right: each token drawn given the tokens before it (exact speculative sampling)
                p = jax.nn.softmax(at / temperature, -1)
                drawn = jax.random.categorical(jax.random.fold_in(key, r), at / temperature).astype(jnp.int32)
                here = jnp.broadcast_to((jnp.arange(g) >= r * chunk) & (jnp.arange(g) < (r + 1) * chunk), open_.shape)
            draft = jnp.where(here, drawn, draft)
            if temperature:  # only speculative sampling reads q
                probs = jnp.where(here[..., None], p, probs)
            put = jnp.zeros_like(canvas).at[jnp.arange(b)[:, None], draft_cols].set(draft, mode="drop")
            filled = jnp.zeros(canvas.shape, bool).at[jnp.arange(b)[:, None], draft_cols].set(here, mode="drop")
            return jnp.where(filled, put, canvas), cache, draft, probs, open_ & ~here, at

        draft = jnp.zeros((b, g), jnp.int32)
        probs = jnp.zeros((b, g, drafter.config.vocab_size if temperature else 0), jnp.float32)
        open_ = jnp.ones((b, g), bool)
        if self.beams > 1:
            _, cache, draft, probs, _, at = one_round(0, (canvas, cache, draft, probs, open_))
            chains, chain_ok = lattice_beams(jax.nn.log_softmax(at, -1), self.beams, self.lattice_top,
                                             self.lattice_mass)
            within = jnp.arange(g)[None] < lengths[:, None]
            return (cache, chains.reshape(b, -1), (chain_ok[..., None] & within[:, None]).reshape(b, -1), probs,
                    jnp.int32(1))
        carry = (canvas, cache, draft, probs, open_)
        for r in range(-(-g // chunk)):  # rounds the longest row does not need are skipped (no inner loop)
            carry = branching.cond(r < rounds, lambda c, r=r: one_round(r, c)[:5], lambda c: c, carry)
        _, cache, draft, probs, _ = carry
        return cache, draft, jnp.arange(g)[None] < lengths[:, None], probs, rounds.astype(jnp.int32)


def speculative_accept(mask_tree, nodes, valid, draft_probs, logits, candidates, key, temperature):
    """Speculative sampling over a chain (see the module docstring).

    Args:
      mask_tree: the chain's `mask_tree()`; nodes: `[B, N]` draft tokens; valid: `[B, N]` tokens
        that may be accepted; draft_probs: `[B, N, V]` the drafter's q of each token.
      logits: `[B, 1 + N, V]` the target's logits at the current token and every node.
      candidates: `[B, W]`; key: the step's PRNG key; temperature: T > 0.
    """
    p = jax.nn.softmax(logits.astype(jnp.float32) / temperature, axis=-1)              # [B, 1 + N, V]
    n = nodes.shape[1]
    p_x = jnp.take_along_axis(p[:, :n], nodes[..., None], axis=-1)[..., 0]
    q_x = jnp.take_along_axis(draft_probs, nodes[..., None], axis=-1)[..., 0]
    coin, pick = jax.random.split(key)
    passes = (jax.random.uniform(coin, p_x.shape) * q_x < p_x) & valid
    verified = tree_verified(mask_tree, passes)
    # After layout position j: the residual max(p_j - q_{j+1}, 0) where node j + 1 was a valid
    # draft (rejected, if the path ends at j), else p_j itself.
    next_valid = jnp.concatenate([valid, jnp.zeros_like(valid[:, :1])], 1)[..., None]  # [B, 1 + N, 1]
    q_next = jnp.concatenate([draft_probs, jnp.zeros_like(draft_probs[:, :1])], 1)
    residual = jnp.where(next_valid, jnp.maximum(p - q_next, 0.0), p)
    residual = jnp.where(residual.sum(-1, keepdims=True) > 0, residual, p)
    bonus = jax.random.categorical(pick, jnp.log(residual)).astype(jnp.int32)          # [B, 1 + N]
    predictions = jnp.argmax(logits, -1).astype(jnp.int32)
    return tree_accept(mask_tree, nodes, predictions, verified, candidates, bonus=bonus)


def lattice_beams(logprobs, beams: int, top: int, mass: float):
    """DiffuSpec's drafts from one drafter forward: the `beams` best token sequences under the sum
    of per-position log-probabilities, each position limited to its smallest top set with
    probability >= `mass` (at most `top` tokens).

    Args:
      logprobs: `[B, G, V]` the drafter's log-probabilities at the G draft positions.

    Returns:
      `(chains [B, beams, G] int32, ok [B, beams] bool)`: ok False for a beam the lattice could not
      fill (fewer paths than beams).
    """
    b, g, _ = logprobs.shape
    k = min(top, logprobs.shape[-1])
    values, tokens = jax.lax.top_k(logprobs, k)                                           # [B, G, k]
    before = jnp.cumsum(jnp.exp(values), -1) - jnp.exp(values)
    values = jnp.where(before < mass, values, -jnp.inf)              # the smallest top set reaching the mass
    score = jnp.pad(values[:, 0], ((0, 0), (0, max(beams - k, 0))), constant_values=-jnp.inf)[:, :beams]
    first = jnp.pad(tokens[:, 0], ((0, 0), (0, max(beams - k, 0))))[:, :beams]
    chains = first[..., None]                                                             # [B, beams, 1]
    for j in range(1, g):
        total = (score[..., None] + values[:, j, None, :]).reshape(b, beams * k)          # [B, beams * k]
        score, flat = jax.lax.top_k(total, beams)
        parent, choice = flat // k, flat % k
        chains = jnp.concatenate([jnp.take_along_axis(chains, parent[..., None], axis=1),
                                  jnp.take_along_axis(tokens[:, j], choice, axis=1)[..., None]], -1)
    return chains.astype(jnp.int32), jnp.isfinite(score)
