"""WeDLM's conversion of a causal LM into a parallel decoder that keeps causal attention (`wedlm`; Tencent
WeDLM, arXiv 2512.22737 §4 and Eq. 10, `finetune/src/{masking,batch,loss,trainer}.py`).

The model reads `[x0 ; xt]`: the clean row, then a masked copy of it, both at the row's logical
positions (the positions array; RoPE never reads the physical index). The copy `xt` is cut into blocks
of `block_size` counted from the row's start (the published `blk = idx // B`, prompt included). Each
block draws `gamma_b ~ U(0, 1)` (clamped at 1e-8); exactly `round(n_b * gamma_b)` of its `n_b` maskable
tokens (answer tokens, `target_mask`; the prompt is never masked), chosen by a uniformly random order,
become the mask token. The block is then reordered: its observed tokens first, then its masked ones,
each group in ascending order, every token keeping its logical position (the xt stream's positions,
segment ids and targets are permuted the same way). Under the `wedlm` mask (`jaxdllm.attention.mask`)
the clean stream is causal, and an xt token sees the clean tokens of the blocks before its block and
the tokens of its own block up to itself in the reordered order: so a masked slot sees every observed
token of its block and the masked slots before it, which is what WeDLM's decoding window gives it
(`jaxdllm.decoding.wedlm_canvas`: the window reordered, causal attention over the cache and the window).

Losses (the published `compute_mlm_loss`, `compute_ar_loss` and the trainer's combination):
  * MLM: cross-entropy at each masked xt slot's own logit (no shift) against the original token,
    weighted by `w = 1 / (gamma_b + 1e-8)` and normalised so the weights of the batch's masked tokens
    sum to 1 (a weighted mean; 0 when the batch has none);
  * AR: the clean stream's next-token cross-entropy (logit i predicts token i + 1) over the answer
    tokens, a plain mean;
  * total `(mlm + ar_weight * ar) / (1 + ar_weight)`, `ar_weight` 1 as published.
Rows hold one example each (no packing). The paper's continued pretraining uses blocks of 32.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.attention import MaskSpec
from jaxdllm.errors import ConfigError
from jaxdllm.train.objectives.base import Objective, Views, accuracy, token_ce
from jaxdllm.train.objectives.sdar import scored_tokens

GAMMA_FLOOR = 1e-8  # the smallest block masking ratio, and the eps of the 1 / gamma weight (as published)


def block_reorder(masked: jax.Array, block_size: int) -> jax.Array:
    """`[B, n]` int32: the permutation that lays out each block of `block_size` (from column 0) as its
    unmasked columns, then its masked ones, each group ascending.

    Physical slot j of the reordered row holds logical column `perm[:, j]`, so
    `jnp.take_along_axis(x, perm, axis=1)` reorders any `[B, n]` array `x` (tokens, positions, segment ids).

    Args:
      masked: `[B, n]` bool, the masked columns.
      block_size: the block length; a last block may be shorter.
    """
    n = masked.shape[1]
    key = (jnp.arange(n, dtype=jnp.int32) // block_size)[None, :] * 2 + masked.astype(jnp.int32)
    return jnp.argsort(key, axis=1, stable=True).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class WeDLMConversion(Objective):
    """`block_size`: the xt stream's block length (published 32); `ar_weight`: the clean stream's
    next-token loss weight in `(mlm + ar_weight * ar) / (1 + ar_weight)` (published 1)."""

    block_size: int = 32
    ar_weight: float = 1.0
    name = "wedlm"
    needs_mask_token = True
    packing = False

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.block_size, int) or isinstance(self.block_size, bool) or self.block_size < 1:
            raise ConfigError(f"[objective] block_size must be a positive integer (WeDLM trains with 32), "
                              f"got {self.block_size!r}")
        if not isinstance(self.ar_weight, (int, float)) or isinstance(self.ar_weight, bool) or self.ar_weight < 0:
            raise ConfigError(f"[objective] ar_weight must be a number >= 0 (WeDLM uses 1.0), got {self.ar_weight!r}")

    @property
    def stacked_views(self) -> int:
        """The model reads two copies of each row, `[x0 ; xt]`, along its length."""
        return 2

    def check(self, config):
        if config.attention != "causal" or config.shift_logits:
            raise ConfigError("objective 'wedlm' fine-tunes a causal model whose masked slots read their own logits "
                              f"(attention \"causal\", shift_logits false); this model has attention "
                              f"{config.attention!r}, shift_logits {config.shift_logits}")

    def noise(self, batch: dict, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """`(masked [B, n] bool, gamma [B, n] float32)` in logical (unreordered) column order: the masked
        answer tokens, exactly `round(n_b * gamma_b)` per block, and each column's block ratio `gamma_b`."""
        tokens = batch["tokens"]
        rows, n = tokens.shape
        bs = self.block_size
        blocks = -(-n // bs)
        k_gamma, k_order = jax.random.split(key)
        gamma = jnp.maximum(jax.random.uniform(k_gamma, (rows, blocks)), GAMMA_FLOOR)
        maskable = jnp.pad(scored_tokens(batch), ((0, 0), (0, blocks * bs - n))).reshape(rows, blocks, bs)
        # a uniformly random order of each block's maskable tokens: rank by a uniform draw (ties by column)
        u = jax.random.uniform(k_order, (rows, blocks, bs))
        col = jnp.arange(bs)
        before = (u[..., None, :] < u[..., :, None]) | ((u[..., None, :] == u[..., :, None])
                                                         & (col[None, :] < col[:, None]))
        rank = (before & maskable[..., None, :]).sum(-1)
        count = jnp.round(maskable.sum(-1) * gamma)  # round half to even, as Python's round
        masked = maskable & (rank < count[..., None])
        return (masked.reshape(rows, blocks * bs)[:, :n],
                jnp.repeat(gamma, bs, axis=1)[:, :n])

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        config = views.config
        tokens, seg, positions = batch["tokens"], batch["segment_ids"], batch["positions"]
        n = tokens.shape[1]
        masked, gamma = self.noise(batch, key)
        perm = block_reorder(masked, self.block_size)

        def reordered(x):
            return jnp.take_along_axis(x, perm, axis=1)

        x_t = reordered(jnp.where(masked, config.mask_token_id, tokens))
        both_seg = jnp.concatenate([seg, reordered(seg)], axis=1)
        mask = MaskSpec(kind="wedlm", block_size=self.block_size, q_segment_ids=both_seg, kv_segment_ids=both_seg)
        logits = views.student(jnp.concatenate([tokens, x_t], axis=1),
                               jnp.concatenate([positions, reordered(positions)], axis=1), mask)
        clean, noisy = logits[:, :n], logits[:, n:]

        slot_masked, slot_target = reordered(masked), reordered(tokens)
        weight = jnp.where(slot_masked, 1.0 / (reordered(gamma) + GAMMA_FLOOR), 0.0)
        mlm = (weight * token_ce(noisy, slot_target)).sum() / jnp.maximum(weight.sum(), 1e-30)

        ar_at = scored_tokens(batch)[:, 1:] & (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)
        ar_ce = jnp.where(ar_at, token_ce(clean[:, :-1], tokens[:, 1:]), 0.0)
        ar = ar_ce.sum() / jnp.maximum(ar_at.sum(), 1)
        loss = (mlm + self.ar_weight * ar) / (1.0 + self.ar_weight)
        return loss, {"loss": loss, "mlm_loss": mlm, "ar_loss": ar,
                      "masked_accuracy": accuracy(noisy, slot_target, slot_masked),
                      "ar_accuracy": accuracy(clean[:, :-1], tokens[:, 1:], ar_at),
                      "masked_tokens": masked.sum()}
