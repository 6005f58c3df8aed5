"""Dream's `diffusion_generate`: one block over the whole answer; timesteps `linspace(1, eps,
steps + 1)`; step i reveals `int(M (1 - s/t))` masks (all that remain at the last step), ordered
by `dream_alg` (`maskgit_plus`: p of the chosen token, `topk_margin`: p1 - p2, `entropy`:
-entropy), or each mask independently with probability 1 - s/t (`origin`). `alg_temp` > 0
samples the positions from softmax(conf / alg_temp); `top_p` / `top_k` filter the tokens."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxdllm.decoding.policies.base import Commit, Policy, rank_among
from jaxdllm.errors import ConfigError

DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")


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


def filter_top_p_top_k(logits: jax.Array, top_p: float, top_k: int) -> jax.Array:
    """Logits outside the nucleus `top_p` and the `top_k` best set to -inf (1.0 / 0 = off)."""
    if top_p < 1.0:
        sorted_logits = -jnp.sort(-logits, axis=-1)
        cum = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
        keep_sorted = jnp.concatenate([jnp.ones_like(cum[..., :1], bool), cum[..., :-1] <= top_p], -1)
        cutoff = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits >= cutoff, logits, -jnp.inf)
    if top_k > 0:
        kth = jax.lax.top_k(logits, min(top_k, logits.shape[-1]))[0][..., -1:]
        logits = jnp.where(logits >= kth, logits, -jnp.inf)
    return logits


@dataclasses.dataclass(frozen=True)
class Dream(Policy):
    dream_alg: str = "maskgit_plus"
    alg_temp: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    eps: float = 1e-3
    name = "dream"
    scheduled = True

    def check(self, config):
        if self.dream_alg not in DREAM_ALGS:
            raise ConfigError(f"dream_alg must be one of {DREAM_ALGS}, got {self.dream_alg!r}")
        if not 0 < self.top_p <= 1 or self.top_k < 0 or self.alg_temp < 0 or not 0 < self.eps < 1:
            raise ConfigError("top_p must be in (0, 1], top_k >= 0, alg_temp >= 0 and eps in (0, 1)")
        if config.block_length != config.gen_length:
            raise ConfigError("policy='dream' decodes the whole canvas: set block_length = gen_length")
        super().check(config)

    def commit(self, logits, candidates, ctx):
        cfg = ctx.config
        i = ctx.block_step  # one block: the block step is the global step
        ts = jnp.asarray(dream_timesteps(cfg.steps, self.eps))
        t, s = ts[i], ts[i + 1]
        ratio = jnp.where(i < cfg.steps - 1, 1 - s / t, jnp.float32(1.0))
        filtered = filter_top_p_top_k(logits / (cfg.temperature if cfg.temperature > 0 else 1.0),
                                      self.top_p, self.top_k)
        probs = jax.nn.softmax(filtered, axis=-1)
        token_key, order_key = jax.random.split(ctx.key)
        if cfg.temperature > 0:
            tokens = jax.random.categorical(token_key, filtered).astype(jnp.int32)
            conf = jnp.take_along_axis(probs, tokens[..., None], -1)[..., 0]
        else:
            tokens = jnp.argmax(probs, axis=-1).astype(jnp.int32)
            conf = jnp.max(probs, axis=-1)
        if self.dream_alg == "origin":
            reveal = jax.random.uniform(order_key, conf.shape) < ratio
            return Commit(candidates & reveal, tokens, ctx.state)
        if self.dream_alg == "topk_margin":
            top2 = jax.lax.top_k(probs, 2)[0]
            conf = top2[..., 0] - top2[..., 1]
        elif self.dream_alg == "entropy":
            conf = jnp.sum(probs * jnp.log(probs + 1e-10), axis=-1)
        masks = jnp.sum(candidates, axis=-1, keepdims=True).astype(jnp.float32)
        k = jnp.where(i < cfg.steps - 1, (masks * ratio).astype(jnp.int32), masks.astype(jnp.int32))
        if self.alg_temp > 0:  # sample k positions without replacement from softmax(conf / alg_temp)
            conf = conf / self.alg_temp + jax.random.gumbel(order_key, conf.shape)
        return Commit(candidates & (rank_among(conf, candidates) < k), tokens, ctx.state)
