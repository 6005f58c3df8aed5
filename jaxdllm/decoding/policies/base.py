"""The policy interface and the helpers the published commit rules share.

A policy is a frozen dataclass: its fields are its settings (the published argument names), and
it owns its per-generation state and says what it needs from the loop. Each step the loop gives
it the current block's logits and calls

    policy.commit(logits [B, L, V] f32, candidates [B, L] bool, ctx: StepContext) -> Commit

`candidates` marks the block's undecided positions in rows that are still decoding. The commit
must be a subset of `candidates` holding at least one position per row that has a candidate, so
every step makes progress (a policy that `holding` reports on may also re-decide the block's decided
positions: LLaDA2.1's token editing). What a policy may ask for (class attributes):

* `canvas`: the name of the canvas it decodes on (`jaxdllm.decoding.canvases`: `"masked_canvas"`,
  MASK until committed; `"draft_canvas"`, draft tokens verified by a causal model, whose policies
  derive from `draft_verify.DraftVerifyPolicy` and define `propose` / `accept` / `update` instead of
  `commit`; ...). The policy derives from that canvas's `policy_base`.
* `scheduled`: it commits a fixed number per step, so `steps` sets the steps per block.
* `answer_logits`: it also reads the whole answer's logits each step (`ctx.answer_logits`).
* `needs_params`: it has parameters of its own (e.g. Learn2PD's filter), passed as
  `generate(..., policy_params=module)` and read as `ctx.policy_params`; its `load_params`
  finds them beside a checkpoint (what `jaxdllm.policy_params` and the command line call).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from jaxdllm.errors import ConfigError
from jaxdllm.registry import Settings


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepContext:
    """What a policy may read besides the logits (built by keyword only).

    Attributes:
      config: the `SamplerConfig`.
      block, block_step: current block and steps already taken in it (int32 scalars).
      key: PRNG key of this step.
      state: the policy's own carry (`Policy.init_state`), as the previous step left it.
      eos_eot_ids: the model's EOS / end-of-turn ids.
      eos_id: the model's EOS id (or None).
      policy_params: the policy's own parameters, the module passed to `generate` (policies with
        `needs_params`).
      answer_logits: `[B, G', V]` logits of the decoded columns (policies with `answer_logits`);
        G' = G, plus a block on a block-causal canvas whose first block holds prompt tails.
      undecided: `[B, G']` the decoded columns' undecided positions before this step.
      block_tokens: `[B, L]` the block's tokens before this step (MASK where undecided).
      decoding: `[B]` rows still decoding (not done).
      answer: `[B, L]` bool, the block's answer positions (False on a prompt tail that shares the
        block, and past a row's last block): a policy never changes the others.
    """

    config: Any
    block: jax.Array
    block_step: jax.Array
    key: jax.Array
    state: Any
    eos_eot_ids: tuple[int, ...] = ()
    eos_id: int | None = None
    policy_params: Any = None
    answer_logits: jax.Array | None = None
    undecided: jax.Array | None = None
    block_tokens: jax.Array | None = None
    decoding: jax.Array | None = None
    answer: jax.Array | None = None


class Commit(NamedTuple):
    """A policy's decision for one step.

    Attributes:
      commit: `[B, L]` bool, positions decided now.
      tokens: `[B, L]` int32, the token each committed position gets.
      state: the policy's carry for the next step.
      fill: `[B, G']` bool over the decoded columns: positions set to `fill_tokens` after the commit,
        decided or not (an early finish, an end-of-text cut), or None.
      fill_tokens: `[B, G]` int32, their tokens.
      stop: `[B]` bool, rows the policy finishes now, or None.
    """

    commit: jax.Array
    tokens: jax.Array
    state: Any
    fill: jax.Array | None = None
    fill_tokens: jax.Array | None = None
    stop: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Policy(Settings):
    """Base class: subclasses set `name`, declare their settings as fields, and define `commit`."""

    name: ClassVar[str] = ""
    role: ClassVar[str] = "policy"
    canvas: ClassVar[str] = "masked_canvas"
    scheduled: ClassVar[bool] = False
    answer_logits: ClassVar[bool] = False
    needs_params: ClassVar[bool] = False
    params_kind: ClassVar[str] = ""  # what its parameters are, for errors ("its trained filter", "its drafter")
    companion: ClassVar[str] = ""  # the role of the second model it runs ("drafter", "verifier"), if any

    def check(self, config) -> None:
        """Raise `ConfigError` if this policy cannot run with `config` (called at construction)."""
        if self.scheduled:
            width = config.num_blocks * config.block_length  # gen_length in whole blocks
            if config.steps % config.num_blocks:
                fit = max(config.num_blocks, min(config.steps, width) // config.num_blocks * config.num_blocks)
                raise ConfigError(f"steps ({config.steps}) must be a multiple of the number of blocks "
                                  f"(gen_length / block_length = {config.num_blocks}): pass steps={fit}")
            if config.steps > width:
                whole = f", {width} in whole blocks" if width != config.gen_length else ""
                raise ConfigError(f"steps ({config.steps}) cannot exceed gen_length ({config.gen_length}{whole}): "
                                  f"every step commits at least one token; pass steps={width} or fewer")

    def tokenizer_settings(self, tokenizer) -> dict:
        """Settings this policy reads from a checkpoint's tokenizer (`sampler_defaults` passes the checkpoint's
        own): ids of its special texts (Multiverse's tags, Hogwild!'s headers); none by default."""
        return {}

    def load_params(self, directory, config):
        """This policy's parameters for `config`, read from a checkpoint `directory` (policies with
        `needs_params` override it; e.g. Learn2PD reads its filter file there)."""
        raise ConfigError(f"policy {self.name!r} has no parameters of its own to load")

    def companion_footprints(self, prompt_len: int, config) -> tuple:
        """`CompanionFootprint`s (`jaxdllm.decoding.canvas`) of the second models this policy runs in
        the loop (e.g. SpecDiff's drafter), for prompts of `prompt_len` tokens; () for none."""
        return ()

    def resized_settings(self, gen_length: int, new_gen_length: int) -> dict:
        """Settings of this policy that a preset published at `gen_length` changes for a canvas of
        `new_gen_length` (`SamplerConfig.resized`; e.g. Jacobi's window, at most the canvas); {} for none."""
        return {}

    def init_state(self, batch: int, block_length: int, vocab_size: int):
        """The policy's carry at the start of a generation (a pytree of arrays)."""
        return jnp.zeros((), jnp.float32)

    def holding(self, state) -> jax.Array | None:
        """`[B]` rows that keep the current block open although none of its positions is masked
        (the block advances once no row holds it and none has a masked position; a holding row's
        forwards count in its NFE), from the policy's carry; None: the block closes when full."""
        return None

    def extra_steps_per_block(self) -> int:
        """Steps a block may take beyond one per masked position (`holding` policies)."""
        return 0

    def commit(self, logits: jax.Array, candidates: jax.Array, ctx: StepContext) -> Commit:
        raise NotImplementedError


def in_unit_interval(value, name: str, policy: str) -> None:
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{name} must be in (0, 1], got {value} (policy {policy!r})")


def choose_tokens(logits: jax.Array, temperature: float, key: jax.Array) -> jax.Array:
    """`argmax` (T = 0) or a Gumbel-max sample of softmax(logits / T); `[B, L]` int32.

    The published code computes `exp(l) / (-log u)^T` in float64; `l + T * gumbel(u)` has the
    same argmax and is stable in float32.
    """
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    gumbel = jax.random.gumbel(key, logits.shape, jnp.float32)
    return jnp.argmax(logits + temperature * gumbel, axis=-1).astype(jnp.int32)


def token_confidence(logits: jax.Array, tokens: jax.Array, zero_ids: tuple[int, ...] = ()) -> jax.Array:
    """softmax(logits)[token] `[B, L]`; tokens in `zero_ids` get 0 (EOS/EoT committed last)."""
    probs = jax.nn.softmax(logits, axis=-1)
    conf = jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]
    for tid in zero_ids:
        conf = jnp.where(tokens == tid, 0.0, conf)
    return conf


def token_entropy(logits: jax.Array) -> jax.Array:
    """`[B, L]` float32 entropy in nats of softmax(logits) over the last axis; `logits [B, L, V]`.

    `entr(p) = -p log p` is 0 at p = 0, so a `-inf` logit (the MASK logit the loop removes) adds
    nothing instead of `0 * -inf = nan`.
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.sum(jax.scipy.special.entr(probs), axis=-1)


def rank_among(score: jax.Array, valid: jax.Array) -> jax.Array:
    """Rank of each position by descending `score` among `valid` ones (0 = best); `[B, L]`.

    Invalid positions rank after every valid one. Ties go to the lower index.
    """
    order = jnp.argsort(jnp.where(valid, -score, jnp.inf), axis=-1, stable=True)
    return jnp.argsort(order, axis=-1, stable=True).astype(jnp.int32)


def scheduled_count(config, block_step: jax.Array) -> jax.Array:
    """LLaDA's tokens-per-step schedule: `block_length // s`, the first `block_length % s` steps
    one more (every block starts fully masked, so the count is the same for every row)."""
    s = config.steps_per_block
    base, rem = divmod(config.block_length, s)
    return base + (block_step < rem).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class ConfidencePolicy(Policy):
    """Policies ranking positions by the probability of their chosen token.

    `confidence_eos_eot_inf`: EOS/EoT predictions get confidence 0, so they are committed last
    (LLaDA's published option).
    """

    confidence_eos_eot_inf: bool = False

    def greedy(self, logits: jax.Array, ctx: StepContext) -> tuple[jax.Array, jax.Array]:
        """`(tokens [B, L], confidence [B, L])` at the config's temperature."""
        tokens = choose_tokens(logits, ctx.config.temperature, ctx.key)
        zero = ctx.eos_eot_ids if self.confidence_eos_eot_inf else ()
        return tokens, token_confidence(logits, tokens, zero)


def top_plus_threshold(candidates: jax.Array, score: jax.Array, passes: jax.Array) -> jax.Array:
    """The best-scoring candidate plus every candidate that `passes` (Fast-dLLM's shape of rule)."""
    return candidates & ((rank_among(score, candidates) == 0) | passes)
