"""Commit rules: pure functions from a block's logits to the positions to commit this step.

Every policy has the signature

    policy(logits [B, L, V] f32, candidates [B, L] bool, ctx: StepContext) -> Commit

where the L positions are the current block, `candidates` marks its still-masked positions of
active rows, and `Commit.commit` must be a subset of `candidates` holding at least one
position per row that has a candidate (so every step makes progress).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxdllm.sampler.config import SamplerConfig

NEG_INF = -jnp.inf


class StepContext(NamedTuple):
    """What a policy may read besides the logits."""

    config: SamplerConfig
    block_step: jax.Array        # steps already taken in this block (scalar int32)
    key: jax.Array               # PRNG key for this step
    policy_state: jax.Array      # per-policy carry (CreditDecoding credits), or a dummy
    eos_eot_ids: tuple[int, ...]  # ids whose confidence is zeroed when confidence_eos_eot_inf


class Commit(NamedTuple):
    commit: jax.Array        # [B, L] bool
    tokens: jax.Array        # [B, L] int32, the token each committed position gets
    policy_state: jax.Array


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


def rank_among(score: jax.Array, valid: jax.Array) -> jax.Array:
    """Rank of each position by descending `score` among `valid` ones (0 = best); `[B, L]`.

    Invalid positions rank after every valid one. Ties go to the lower index.
    """
    order = jnp.argsort(jnp.where(valid, -score, jnp.inf), axis=-1, stable=True)
    return jnp.argsort(order, axis=-1, stable=True).astype(jnp.int32)


def _greedy(logits, ctx):
    cfg = ctx.config
    tokens = choose_tokens(logits, cfg.temperature, ctx.key)
    zero = ctx.eos_eot_ids if cfg.confidence_eos_eot_inf else ()
    return tokens, token_confidence(logits, tokens, zero)


def scheduled_count(config: SamplerConfig, block_step: jax.Array) -> jax.Array:
    """LLaDA's tokens-per-step schedule: `block_length // s`, the first `block_length % s` steps
    one more (every block starts fully masked, so the count is the same for every row)."""
    s = config.steps_per_block
    base, rem = divmod(config.block_length, s)
    return base + (block_step < rem).astype(jnp.int32)


def llada(logits, candidates, ctx: StepContext) -> Commit:
    """LLaDA low-confidence (or random) remasking: commit the top-k candidates, k scheduled."""
    tokens, conf = _greedy(logits, ctx)
    if ctx.config.remasking == "random":
        conf = jax.random.uniform(jax.random.fold_in(ctx.key, 1), conf.shape)
    k = scheduled_count(ctx.config, ctx.block_step)
    commit = candidates & (rank_among(conf, candidates) < k)
    return Commit(commit, tokens, ctx.policy_state)


def threshold(logits, candidates, ctx: StepContext) -> Commit:
    """Fast-dLLM: the most confident candidate plus every candidate with p >= threshold."""
    tokens, conf = _greedy(logits, ctx)
    top = rank_among(conf, candidates) == 0
    return Commit(candidates & (top | (conf >= ctx.config.threshold)), tokens, ctx.policy_state)


def factor(logits, candidates, ctx: StepContext) -> Commit:
    """Fast-dLLM factor rule: longest rank prefix n = 1.. with c_n >= 1 - factor / (n + 1)."""
    tokens, conf = _greedy(logits, ctx)
    rank = rank_among(conf, candidates)
    sorted_conf = -jnp.sort(jnp.where(candidates, -conf, jnp.inf), axis=-1)  # descending, -inf pad
    n = jnp.arange(1, conf.shape[-1] + 1, dtype=jnp.float32)
    ok = sorted_conf >= 1.0 - ctx.config.factor / (n + 1.0)
    count = jnp.maximum(jnp.sum(jnp.cumprod(ok, axis=-1), axis=-1, keepdims=True), 1)
    return Commit(candidates & (rank < count), tokens, ctx.policy_state)


def entropy(logits, candidates, ctx: StepContext) -> Commit:
    """dParallel: the lowest-entropy candidate plus every candidate with entropy <= tau."""
    tokens, _ = _greedy(logits, ctx)
    ent = jnp.sum(jax.scipy.special.entr(jax.nn.softmax(logits, axis=-1)), axis=-1)  # 0 log 0 = 0
    top = rank_among(-ent, candidates) == 0
    return Commit(candidates & (top | (ent <= ctx.config.entropy_threshold)), tokens, ctx.policy_state)


def local_leap(logits, candidates, ctx: StepContext) -> Commit:
    """LocalLeap: anchors (p >= threshold) relax the bar to `leap_relaxed` within `leap_radius`."""
    cfg = ctx.config
    tokens, conf = _greedy(logits, ctx)
    anchors = candidates & (conf >= cfg.threshold)
    idx = jnp.arange(conf.shape[-1])
    within = jnp.abs(idx[:, None] - idx[None, :]) <= cfg.leap_radius  # [L, L], blocks are short
    near = (anchors[:, None, :] & within[None]).any(-1)
    bar = jnp.where(near, cfg.leap_relaxed, cfg.threshold)
    top = rank_among(conf, candidates) == 0
    return Commit(candidates & (top | (conf >= bar)), tokens, ctx.policy_state)


def credit(logits, candidates, ctx: StepContext) -> Commit:
    """CreditDecoding: decayed per-token credits, fused as `z + lambda * log1p(C)`.

    `policy_state` holds the credits `[B, L, V]`, zeroed at the start of each block.
    """
    cfg = ctx.config
    credits = jnp.where(ctx.block_step == 0, 0.0, ctx.policy_state) * cfg.credit_gamma
    probs = jax.nn.softmax(logits, axis=-1)
    top1 = jnp.argmax(logits, axis=-1)
    p1 = jnp.max(probs, axis=-1)
    credits = credits + jax.nn.one_hot(top1, logits.shape[-1], dtype=credits.dtype) * (p1 ** cfg.credit_alpha)[..., None]
    fused = logits + cfg.credit_lambda * jnp.log1p(credits)
    tokens = choose_tokens(fused, cfg.temperature, ctx.key)
    conf = jnp.maximum(p1, jnp.max(jax.nn.softmax(fused, axis=-1), axis=-1))
    top = rank_among(conf, candidates) == 0
    return Commit(candidates & (top | (conf >= cfg.credit_threshold)), tokens, credits)


def prophet_gap(answer_logits: jax.Array) -> jax.Array:
    """Mean top-1 minus top-2 logit over the answer positions; `[B]`."""
    top2 = jax.lax.top_k(answer_logits, 2)[0]
    return jnp.mean(top2[..., 0] - top2[..., 1], axis=-1)


def prophet_threshold(config: SamplerConfig, step: jax.Array) -> jax.Array:
    """Prophet's gap threshold at global step `step` (0-based): falls as progress passes 1/3, 2/3."""
    progress = step.astype(jnp.float32) / config.steps
    early, middle, late = config.prophet_thresholds
    return jnp.where(progress < 1 / 3, early, jnp.where(progress < 2 / 3, middle, late))


POLICY_FNS: dict[str, Callable[..., Commit]] = {
    "llada": llada, "prophet": llada, "threshold": threshold, "factor": factor,
    "entropy": entropy, "local_leap": local_leap, "credit": credit,
}
