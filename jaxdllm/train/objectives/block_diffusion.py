"""BD3-LM block diffusion (`block_diffusion`): the model reads `[x_t ; x_0]` under the
block-diffusion mask, both halves at positions `0..n-1`; a masking probability `p = (1 - eps) t
+ eps` per block (`t ~ U(0, 1)`); loss `CE / p` on the masked tokens of `x_t`, over the number
of real tokens. Rows must hold one example each (no packing).

Token-shifted models (Fast-dLLM v2) predict token i from the logit at i-1, and the predictor is
the one the block-causal sampler uses: inside a block, the noisy stream's previous position; for
the first token of a block, the clean stream's last token of the block before (at sampling time
the token before a block is final and sees only earlier blocks).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.attention import MaskSpec
from jaxdllm.errors import ConfigError
from jaxdllm.train.objectives.base import Objective, Views, has_predictor, masked_metrics, token_ce


@dataclasses.dataclass(frozen=True)
class BlockDiffusion(Objective):
    """`block_size`: default the model's `block_size`; `eps`: the smallest masking probability."""

    block_size: int | None = None
    eps: float = 1e-3
    name = "block_diffusion"
    needs_mask_token = True
    packing = False

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.eps < 1:
            raise ConfigError(f"[objective] eps must be in (0, 1), got {self.eps}")
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size <= 0):
            raise ConfigError(f"[objective] block_size must be a positive integer, got {self.block_size!r}")

    @property
    def stacked_views(self) -> int:
        """The model reads two copies of each row, `[x_t ; x_0]`, along its length."""
        return 2

    def check(self, config):
        if not (self.block_size or config.block_size):
            raise ConfigError(f"objective {self.name!r} needs a block size: set [objective] block_size "
                              "or the model's block_size")

    def blocks(self, config) -> int:
        return self.block_size or config.block_size

    def noise(self, batch: dict, key: jax.Array, config) -> tuple[jax.Array, jax.Array]:
        """`(masked [B, n] bool, p [B, n])`: the masked tokens of `x_t` and each token's block probability."""
        tokens = batch["tokens"]
        b, n = tokens.shape
        bs = self.blocks(config)
        k_t, k_m = jax.random.split(key)
        t = jax.random.uniform(k_t, (b, -(-n // bs)))
        p = jnp.repeat((1.0 - self.eps) * t + self.eps, bs, axis=1)[:, :n]
        real = (batch["segment_ids"] > 0) & has_predictor(batch["segment_ids"], config)
        return (jax.random.uniform(k_m, tokens.shape) < p) & real, p

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        config = views.config
        tokens, seg = batch["tokens"], batch["segment_ids"]
        n, bs = tokens.shape[1], self.blocks(config)
        masked, p = self.noise(batch, key, config)
        x_t = jnp.where(masked, config.mask_token_id, tokens)
        both_seg = jnp.concatenate([seg, seg], axis=1)
        mask = MaskSpec(kind="block_diffusion", block_size=bs, q_segment_ids=both_seg, kv_segment_ids=both_seg)
        logits = views.student(jnp.concatenate([x_t, tokens], axis=1),
                               jnp.concatenate([batch["positions"]] * 2, axis=1), mask)
        logits = _predictors(logits, n, bs) if config.shift_logits else logits[:, :n]
        weighted = jnp.where(masked, token_ce(logits, tokens) / p, 0.0)
        loss = weighted.sum() / self.normaliser(batch)
        return loss, masked_metrics(loss, logits, tokens, masked)

    def normaliser(self, batch: dict) -> jax.Array:
        """What the summed weighted loss is divided by: the real tokens."""
        return jnp.maximum((batch["segment_ids"] > 0).sum(), 1)


def _predictors(logits: jax.Array, n: int, block_size: int) -> jax.Array:
    """`[B, n, V]` for a shifted model over `[x_t ; x_0]`: entry i is the logit predicting x_t token i."""
    noisy, clean = logits[:, :n], logits[:, n:]
    prev_noisy = jnp.concatenate([noisy[:, :1], noisy[:, :-1]], axis=1)
    prev_clean = jnp.concatenate([clean[:, :1], clean[:, :-1]], axis=1)
    block_start = (jnp.arange(n) % block_size == 0)[None, :, None]
    return jnp.where(block_start, prev_clean, prev_noisy)
