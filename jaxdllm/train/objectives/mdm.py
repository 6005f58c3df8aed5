"""LLaDA's masked-diffusion objectives: pre-training (`mdm_pretrain`) and SFT (`mdm_sft`).

Per row `t ~ U(0, 1)`, `p = (1 - eps) t + eps`; each candidate token is replaced by MASK with
probability `p` and the model, run under its own attention mode (bidirectional, or block-causal
for block-diffusion models) on the noisy row, is scored by `CE / p` on the masked tokens.

* `mdm_pretrain`: candidates are every real token; `loss = sum CE / p / num_real_tokens` (LLaDA
  divides by `B * L`, the same when rows have no padding).
* `mdm_sft`: the prompt stays clean; candidates are the answer tokens (`target_mask`, EOS fill
  included); each masked token's `CE / p` is divided by its example's answer length and the
  sum by the number of examples.

Token-shifted models (Dream) predict token i from the logit at i-1; a token with no predictor
(the first of a row or of a packed example) is never a candidate.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.errors import ConfigError
from jaxdllm.train.objectives.base import (Objective, Views, aligned_logits, has_predictor, masked_metrics,
                                           padding_mask, token_ce)


@dataclasses.dataclass(frozen=True)
class MaskedDiffusion(Objective):
    """Shared by pre-training and SFT; `eps` is the smallest masking probability."""

    eps: float = 1e-3
    needs_mask_token = True
    sft = False

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.eps < 1:
            raise ConfigError(f"[objective] eps must be in (0, 1), got {self.eps}")

    def check(self, config):
        if config.attention == "causal":
            raise ConfigError(f"objective {self.name!r} trains a diffusion model; this model's attention is "
                              "causal (use causal_lm, or attention = \"bidirectional\")")

    def candidates(self, batch: dict, config) -> jax.Array:
        """`[B, L]` tokens that may be masked and scored."""
        base = batch["target_mask"] if self.sft else batch["segment_ids"] > 0
        return base & has_predictor(batch["segment_ids"], config)

    def noise(self, batch: dict, key: jax.Array, config) -> tuple[jax.Array, jax.Array]:
        """`(masked [B, L] bool, p [B, 1])`: which tokens become MASK, and each row's probability."""
        tokens = batch["tokens"]
        k_t, k_m = jax.random.split(key)
        t = jax.random.uniform(k_t, (tokens.shape[0], 1))
        p = (1.0 - self.eps) * t + self.eps
        masked = (jax.random.uniform(k_m, tokens.shape) < p) & self.candidates(batch, config)
        return masked, p

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        config = views.config
        tokens, seg = batch["tokens"], batch["segment_ids"]
        masked, p = self.noise(batch, key, config)
        noisy = jnp.where(masked, config.mask_token_id, tokens)
        logits = aligned_logits(views.student(noisy, batch["positions"], padding_mask(batch, config.attention,
                                                                                      config.block_size)), config)
        weighted = jnp.where(masked, token_ce(logits, tokens) / p, 0.0)
        if self.sft:
            candidates = self.candidates(batch, config)
            same = (seg[:, :, None] == seg[:, None, :]) & candidates[:, None, :]
            answer_len = jnp.maximum(same.sum(-1), 1)  # target tokens of each token's example
            loss = (weighted / answer_len).sum() / jnp.maximum(_count_examples(seg, candidates), 1)
        else:
            loss = weighted.sum() / jnp.maximum((seg > 0).sum(), 1)
        return loss, masked_metrics(loss, logits, tokens, masked)


def _count_examples(seg: jax.Array, candidates: jax.Array) -> jax.Array:
    """Number of (row, segment) pairs with at least one candidate token."""
    one_hot = (seg[:, :, None] == jnp.arange(1, seg.shape[1] + 1)[None, None, :]) & candidates[:, :, None]
    return one_hot.any(axis=1).sum()


@dataclasses.dataclass(frozen=True)
class MdmPretrain(MaskedDiffusion):
    name = "mdm_pretrain"


@dataclasses.dataclass(frozen=True)
class MdmSft(MaskedDiffusion):
    name = "mdm_sft"
    sft = True
