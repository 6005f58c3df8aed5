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
import numpy as np

from jaxdllm.sampler.config import SamplerConfig

NEG_INF = -jnp.inf


class StepContext(NamedTuple):
    """What a policy may read besides the logits."""

    config: SamplerConfig
    block_step: jax.Array        # steps already taken in this block (scalar int32)
    key: jax.Array               # PRNG key for this step
    policy_state: jax.Array      # per-policy carry (CreditDecoding credits), or a dummy
    eos_eot_ids: tuple[int, ...]  # ids whose confidence is zeroed when confidence_eos_eot_inf
    learned_filter: object = None  # Learn2PD: a module mapping block confidences to accept logits
    eos_id: int | None = None


class Commit(NamedTuple):
    commit: jax.Array        # [B, L] bool
    tokens: jax.Array        # [B, L] int32, the token each committed position gets
    policy_state: jax.Array
    eos_cut: jax.Array | None = None  # [B] in-block index of an accepted EOS (-1: none): EoTP


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


def learn2pd(logits, candidates, ctx: StepContext) -> Commit:
    """Learn2PD: commit what the learned filter accepts (sigmoid > `filter_threshold`) plus the
    LLaDA schedule's top-k. The filter reads the block's top-1 probabilities `[B, L]` (committed
    positions included) and returns accept logits `[B, L]`.

    End-of-text prediction: an accepted EOS cuts the answer there (`eos_cut`); the engine fills
    everything after it with EOS, so later blocks are never decoded.
    """
    cfg = ctx.config
    tokens, conf = _greedy(logits, ctx)
    p1 = jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1)
    accept = candidates & (jax.nn.sigmoid(ctx.learned_filter(p1)) > cfg.filter_threshold)
    k = scheduled_count(cfg, jnp.minimum(ctx.block_step, cfg.steps_per_block - 1))
    commit = accept | (candidates & (rank_among(conf, candidates) < k))
    cut = None
    if cfg.eot_prediction and ctx.eos_id is not None:
        eos_here = accept & (tokens == ctx.eos_id)
        cut = jnp.where(eos_here.any(-1), jnp.argmax(eos_here, axis=-1), -1)
    return Commit(commit, tokens, ctx.policy_state, cut)


def dream_timesteps(steps: int, eps: float) -> np.ndarray:
    """`torch.linspace(1, eps, steps + 1)` in float32, bit for bit: a float32 step, the first half
    `1 + step * i` and the second `eps - step * (steps - i)`, each rounded once (torch's CPU
    kernel fuses the multiply-add; float64 then one rounding reproduces it)."""
    n = steps + 1
    start, end = np.float64(1.0), np.float64(np.float32(eps))
    step = np.float64(np.float32((np.float32(eps) - np.float32(1.0)) / np.float32(n - 1)))
    i = np.arange(n, dtype=np.float64)
    values = np.where(np.arange(n) < n // 2, start + step * i, end - step * (n - 1 - i))
    return values.astype(np.float32)


def _filter_top_p_top_k(logits: jax.Array, top_p: float, top_k: int) -> jax.Array:
    if top_p < 1.0:
        sorted_logits = -jnp.sort(-logits, axis=-1)
        cum = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
        keep_sorted = jnp.concatenate([jnp.ones_like(cum[..., :1], bool), cum[..., :-1] <= top_p], -1)
        cutoff = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits >= cutoff, logits, NEG_INF)
    if top_k > 0:
        kth = jax.lax.top_k(logits, min(top_k, logits.shape[-1]))[0][..., -1:]
        logits = jnp.where(logits >= kth, logits, NEG_INF)
    return logits


def dream(logits, candidates, ctx: StepContext) -> Commit:
    """Dream's `diffusion_generate` step i: `int(M * (1 - s / t))` tokens (all left at the last
    step), ordered by the algorithm's confidence; `origin` reveals each mask w.p. 1 - s/t."""
    cfg = ctx.config
    i = ctx.block_step  # one block: the block step is the global step
    ts = jnp.asarray(dream_timesteps(cfg.steps, cfg.eps))
    t, s = ts[i], ts[i + 1]
    ratio = jnp.where(i < cfg.steps - 1, 1 - s / t, jnp.float32(1.0))
    filtered = _filter_top_p_top_k(logits / (cfg.temperature if cfg.temperature > 0 else 1.0),
                                   cfg.top_p, cfg.top_k)
    probs = jax.nn.softmax(filtered, axis=-1)
    token_key, order_key = jax.random.split(ctx.key)
    if cfg.temperature > 0:
        tokens = jax.random.categorical(token_key, filtered).astype(jnp.int32)
        conf = jnp.take_along_axis(probs, tokens[..., None], -1)[..., 0]
    else:
        tokens = jnp.argmax(probs, axis=-1).astype(jnp.int32)
        conf = jnp.max(probs, axis=-1)
    if cfg.dream_alg == "origin":
        reveal = jax.random.uniform(order_key, conf.shape) < ratio
        return Commit(candidates & reveal, tokens, ctx.policy_state)
    if cfg.dream_alg == "topk_margin":
        top2 = jax.lax.top_k(probs, 2)[0]
        conf = top2[..., 0] - top2[..., 1]
    elif cfg.dream_alg == "entropy":
        conf = jnp.sum(probs * jnp.log(probs + 1e-10), axis=-1)
    masks = jnp.sum(candidates, axis=-1, keepdims=True).astype(jnp.float32)
    k = jnp.where(i < cfg.steps - 1, (masks * ratio).astype(jnp.int32), masks.astype(jnp.int32))
    if cfg.alg_temp > 0:  # sample k positions without replacement from softmax(conf / alg_temp)
        conf = conf / cfg.alg_temp + jax.random.gumbel(order_key, conf.shape)
    return Commit(candidates & (rank_among(conf, candidates) < k), tokens, ctx.policy_state)


POLICY_FNS: dict[str, Callable[..., Commit]] = {
    "llada": llada, "prophet": llada, "threshold": threshold, "factor": factor,
    "entropy": entropy, "local_leap": local_leap, "credit": credit, "dream": dream,
    "learn2pd": learn2pd,
}
