"""GenMol's confidence sampler (`MDLM.step_confidence` of bionemo-moco, "method taken from GenMol"), with
molecular context guidance; it decodes on the GenMol canvas (`jaxdllm/decoding/genmol_canvas.py`).

At loop step i of S, over every position that is still MASK:

    logp  = log_softmax(logits with the MASK logit lowered by 1e6)      # the substitution parameterisation
    pred  ~ Categorical(softmax(logp / T))                                # T: the loop's `temperature`
    conf  = log softmax(logp / T)[pred] + r * (1 - i / (S - 1)) * Gumbel(0, 1)   # r: `randomness`
    commit the `tokens_per_step` MASK positions of the row with the highest conf

* S = max(ceil(max over the batch of #MASK / tokens_per_step), 2), the published
  `max(get_num_steps_confidence(x), 2)`. The number of MASKs is data: the canvas counts them in the
  canvas it starts from (`Genmol.start`) and S is carried in the policy's state, so one compiled loop
  serves every batch. (The published `get_num_steps_confidence` with N > 1 divides with `//`, so its S
  can be too small to unmask everything; GenMol itself always uses N = 1. Here a row decodes until it
  has no MASK left, S only sets the noise's annealing.)
* Rows finish independently: a row with n MASKs takes ceil(n / tokens_per_step) steps and does nothing
  after (the published loop runs S steps for every row; the extra ones change nothing).
* `pred` is a Gumbel-max sample (`argmax(logp / T + Gumbel)`, the same distribution as the published
  `Categorical`), and conf is computed with `log_softmax`, not `log(softmax)`: the same value where the
  latter is finite. T = 0 takes the argmax token and ranks by its log-probability (the T -> 0 limit ties
  every confidence at 0). Ties of conf go to the lower column (the published `conf >= kth value` would
  commit every tied position; with r > 0 or T > 0 ties have probability 0).
* The draws: `genmol_draws(key, shape)` gives both Gumbel arrays of a step from its key (the token
  draws `[B, T, V]` and the order noise `[B, T]`), so a test can drive another implementation with them.

Molecular context guidance (MCG, the published `Sampler.generate`): with `guidance_gamma` = gamma > 0
each step runs a second forward on x_poor, the canvas with floor(gamma * #context) context tokens set to
MASK, and the policy reads `w * logits(x) + (1 - w) * logits(x_poor)` (raw logits, as published; w =
`guidance_weight`, 2). The context, as published, is the current canvas's tokens that are not BOS, EOS,
MASK or PAD (the prompt fragment and, as decoding goes on, the tokens decided so far), drawn afresh each
step. `guidance_rows="first"` (the published rule): the columns are drawn from row 0's context and masked
in every row; `"each"`: each row draws from its own context. Both forwards count in `nfe` (2 per step).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.decoding.policies.base import Commit, Policy, rank_among
from jaxdllm.errors import ConfigError

GUIDANCE_ROWS = ("first", "each")
MASK_LOGIT_SHIFT = -1e6  # bionemo-moco's `_subs_parameterization`: the MASK logit += -1e6

# `min_add_len` of each task (the published defaults: de novo 40, linker design 30; `fragment_completion`
# (motif extension, scaffold decoration, superstructure; PMO's addmask) never forwards its own, so 18).
TASK_MIN_ADD_LEN = {"denovo": 40, "linker": 30, "linker_onestep": 30, "motif": 18, "scaffold": 18,
                    "superstructure": 18, "fragment_completion": 18}


@struct.dataclass
class GenmolState:
    """The policy's carry. `num_steps`: S (int32 scalar), fixed at the start of a generation."""

    num_steps: jax.Array


def genmol_draws(key: jax.Array, shape: tuple[int, int, int]) -> tuple[jax.Array, jax.Array]:
    """`(token_gumbel [B, T, V], order_gumbel [B, T])`: the standard Gumbel draws of one step with `key`
    (`shape` = the logits' `[B, T, V]`): the first samples `pred`, the second is the confidence noise."""
    return (jax.random.gumbel(jax.random.fold_in(key, 0), shape, jnp.float32),
            jax.random.gumbel(jax.random.fold_in(key, 1), shape[:2], jnp.float32))


def num_steps(masks: jax.Array, tokens_per_step: int) -> jax.Array:
    """S = max(ceil(max(masks) / tokens_per_step), 2) for `masks [B]`, the MASK count of each row."""
    most = jnp.max(masks, initial=0).astype(jnp.int32)
    return jnp.maximum(-(-most // tokens_per_step), 2).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Genmol(Policy):
    """GenMol's confidence sampler. `randomness` (r): scale of the annealed Gumbel noise on the
    confidences; `tokens_per_step` (N): positions committed per step and row (GenMol 1, the paper's faster
    variant 3); `guidance_gamma` (gamma): share of the context masked for guidance (0: none);
    `guidance_weight` (w); `guidance_rows`: "first" (row 0's columns for every row, as published) or
    "each". The softmax temperature is the loop's `temperature`."""

    randomness: float = 0.5
    tokens_per_step: int = 1
    guidance_gamma: float = 0.0
    guidance_weight: float = 2.0
    guidance_rows: str = "first"
    name = "genmol"
    canvas = "genmol_canvas"

    def check(self, config) -> None:
        if self.tokens_per_step < 1:
            raise ConfigError(f"tokens_per_step must be >= 1, got {self.tokens_per_step} (policy 'genmol')")
        if self.randomness < 0:
            raise ConfigError(f"randomness must be >= 0, got {self.randomness} (policy 'genmol')")
        if not 0.0 <= self.guidance_gamma <= 1.0:
            raise ConfigError(f"guidance_gamma must be in [0, 1], got {self.guidance_gamma} (policy 'genmol')")
        if self.guidance_rows not in GUIDANCE_ROWS:
            raise ConfigError(f"guidance_rows must be one of {GUIDANCE_ROWS}, got {self.guidance_rows!r}")

    @property
    def passes(self) -> int:
        """Forwards per step: 2 with guidance."""
        return 2 if self.guidance_gamma > 0 else 1

    def init_state(self, batch: int, block_length: int, vocab_size: int) -> GenmolState:
        return GenmolState(num_steps=jnp.int32(2))

    def start(self, undecided: jax.Array) -> GenmolState:
        """The carry for a canvas whose positions to decode are `undecided [B, T]` (finished rows: none)."""
        return GenmolState(num_steps=num_steps(undecided.sum(1), self.tokens_per_step))

    # -- guidance -----------------------------------------------------------------------------
    def poor_positions(self, context: jax.Array, key: jax.Array) -> jax.Array:
        """`[B, T]` bool: the positions masked in x_poor, floor(gamma * #context) of the `context [B, T]`
        positions, uniformly without replacement (`guidance_rows`: row 0's for every row, or each row's)."""
        shape = context.shape
        if self.guidance_rows == "first":
            context = context[:1]
        count = jnp.floor(self.guidance_gamma * context.sum(1).astype(jnp.float32)).astype(jnp.int32)
        score = jax.random.uniform(key, context.shape)
        chosen = context & (rank_among(score, context) < count[:, None])
        return jnp.broadcast_to(chosen, shape)

    def guide(self, logits: jax.Array, poor_logits: jax.Array) -> jax.Array:
        """w * logits(x) + (1 - w) * logits(x_poor)."""
        w = self.guidance_weight
        return w * logits + (1.0 - w) * poor_logits

    # -- the step -----------------------------------------------------------------------------
    def confidence(self, logits: jax.Array, step, num_steps_, temperature: float, key: jax.Array):
        """`(pred [B, T], conf [B, T])` of step `step` of `num_steps_` (before masking decided positions);
        `logits [B, T, V]` with the MASK logit already lowered (the canvas does it: `MASK_LOGIT_SHIFT`)."""
        logp = jax.nn.log_softmax(logits, axis=-1)
        token_gumbel, order_gumbel = genmol_draws(key, logits.shape)
        if temperature == 0:
            pred = jnp.argmax(logp, axis=-1)
            conf = jnp.max(logp, axis=-1)
        else:
            scaled = jax.nn.log_softmax(logp / temperature, axis=-1)
            pred = jnp.argmax(scaled + token_gumbel, axis=-1)
            conf = jnp.take_along_axis(scaled, pred[..., None], axis=-1)[..., 0]
        ratio = step.astype(jnp.float32) / (num_steps_ - 1).astype(jnp.float32)
        noise = self.randomness * jnp.maximum(1.0 - ratio, 0.0)
        return pred.astype(jnp.int32), conf + noise * order_gumbel

    def commit(self, logits, candidates, ctx) -> Commit:
        """`logits [B, T, V]`: the whole canvas's (guided) logits, MASK logit lowered; `candidates [B, T]`
        its MASK positions in rows still decoding; `ctx.block_step` is the step i."""
        pred, conf = self.confidence(logits, ctx.block_step, ctx.state.num_steps, ctx.config.temperature, ctx.key)
        chosen = candidates & (rank_among(conf, candidates) < self.tokens_per_step)
        return Commit(chosen, pred, ctx.state)
