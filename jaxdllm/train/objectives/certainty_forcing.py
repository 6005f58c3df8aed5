"""dParallel's certainty-forcing distillation (`certainty_forcing`): a masked model trained on its
own (teacher) answers to become certain of masked tokens early, so an entropy-threshold sampler
can commit many at once.

Per row, over the response region (the row's target tokens: answer, its EOS and the EOS fill):

* **Active region.** `active = "block"` (LLaDA family): one block of `block_length` response
  tokens, its index drawn uniformly among the blocks that hold a response token. Earlier blocks
  stay clean; later blocks are MASK in both views and carry no loss. `active = "response"`
  (Dream): the whole response is active. `"auto"` picks `"response"` for token-shifted models.
* **Two views.** Inside the active region each token is masked with probability `mask_prob`
  (set `m`); the second view masks the complement (active minus `m`). Both views run in one
  forward of `2B` rows.
* **Loss.** `CE_A + CE_B + w (Ent_A + Ent_B)`. `CE_v` is the mean cross-entropy over the view's
  masked tokens (over the whole batch); `Ent_v` is the mean entropy of `softmax(logits /
  temperature)` over the view's masked tokens whose argmax already equals the label (0 if none),
  so the certainty term sharpens only right predictions. `w = entropy_weight`, default 2 (LLaDA)
  or 1 (token-shifted models, Dream).
* **Mask ratio** (`mask_ratio`): `"fixed"` (published) masks with probability `mask_prob` in
  every row; `"uniform"` draws each row's probability from U(0, 1), so the views together cover
  every ratio, including the nearly all-masked states a sampler's first forwards see.
* **One view** (`num_views = 1`, an ablation): only view A is run and scored, `CE_A + w Ent_A`; the
  active positions outside `m` get no loss in that step.

Masks are drawn per row. The published trainer draws one mask for the whole batch (it is only
right at batch 1); the published block index may also pick an empty last block, which is skipped
here. Token-shifted models are scored with the logit that predicts each token.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

from jaxdllm.errors import ConfigError
from jaxdllm.train.objectives.base import (Objective, Views, accuracy, aligned_logits, has_predictor, padding_mask,
                                           token_ce)
from jaxdllm.validation import require_positive_int


def entropy_of(logits: jax.Array, temperature: float) -> jax.Array:
    """`[B, L]` entropy (nats) of `softmax(logits / temperature)`, float32; `logits [B, L, V]`."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def active_regions(response: jax.Array, key: jax.Array, block_length: int | None) -> tuple[jax.Array, jax.Array]:
    """`(active [B, L], later [B, L])` bool over the response tokens `response [B, L]`.

    `block_length` None: the whole response is active. Otherwise each row draws one block index
    uniformly among its `ceil(len / block_length)` response blocks (counted from the row's
    first response token); `later` is the response after that block.
    """
    if block_length is None:
        return response, jnp.zeros_like(response)
    rank = jnp.cumsum(response, axis=1) - 1              # index of each response token in its row
    length = response.sum(axis=1)
    blocks = jnp.maximum((length + block_length - 1) // block_length, 1)
    chosen = jnp.floor(jax.random.uniform(key, length.shape) * blocks).astype(jnp.int32)
    block = rank // block_length
    active = response & (block == chosen[:, None])
    later = response & (block > chosen[:, None])
    return active, later


@dataclasses.dataclass(frozen=True)
class CertaintyForcing(Objective):
    """Settings (recipe `[objective]` keys): `block_length` (32), `active` ("auto" | "block" |
    "response"), `mask_prob` (0.5), `temperature` (0.5, of the entropy term), `entropy_weight`
    (None: 2, or 1 for token-shifted models), `num_views` (2: the published complementary pair; 1: view A only), `mask_ratio` ("fixed" |
    "uniform")."""

    block_length: int = 32
    active: Literal["auto", "block", "response"] = "auto"
    mask_prob: float = 0.5
    temperature: float = 0.5
    entropy_weight: float | None = None
    num_views: int = 2
    mask_ratio: Literal["fixed", "uniform"] = "fixed"

    name = "certainty_forcing"
    needs_mask_token = True
    packing = False  # one example per row: the block index counts from the row's response start

    def __post_init__(self):
        super().__post_init__()
        require_positive_int(self.block_length, "[objective] block_length")
        if not 0 < self.mask_prob < 1:
            raise ConfigError(f"[objective] mask_prob must be in (0, 1), got {self.mask_prob}")
        if self.temperature <= 0:
            raise ConfigError(f"[objective] temperature must be positive, got {self.temperature}")
        if self.entropy_weight is not None and self.entropy_weight < 0:
            raise ConfigError(f"[objective] entropy_weight must be >= 0, got {self.entropy_weight}")
        if self.mask_ratio not in ("fixed", "uniform"):
            raise ConfigError(f"[objective] mask_ratio must be 'fixed' (mask_prob in every row) or 'uniform' "
                              f"(a U(0, 1) probability per row), got {self.mask_ratio!r}")
        if self.num_views not in (1, 2):
            raise ConfigError(f"[objective] num_views must be 1 (view A only) or 2 (the complementary pair), "
                              f"got {self.num_views!r}")

    @property
    def stacked_views(self) -> int:
        return self.num_views  # view A (and view B) in one forward of n * B rows

    def check(self, config):
        if config.attention == "causal":
            raise ConfigError("objective 'certainty_forcing' distils a diffusion model; this model's attention is "
                              "causal")

    def resolved(self, config) -> tuple[int | None, float]:
        """`(block_length or None for the whole response, entropy weight)` for a model `config`."""
        active = self.active if self.active != "auto" else ("response" if config.shift_logits else "block")
        weight = self.entropy_weight if self.entropy_weight is not None else (1.0 if config.shift_logits else 2.0)
        return (self.block_length if active == "block" else None), weight

    def views(self, batch: dict, key: jax.Array, config) -> tuple[jax.Array, jax.Array, jax.Array]:
        """`(masked_a, masked_b, later)`, each `[B, L]` bool: the two views' loss positions and the
        positions masked in both views without loss."""
        block_length, _ = self.resolved(config)
        response = batch["target_mask"] & has_predictor(batch["segment_ids"], config)
        k_block, k_mask = jax.random.split(key)
        active, later = active_regions(response, k_block, block_length)
        prob = self.mask_prob
        if self.mask_ratio == "uniform":  # (the fixed ratio keeps the published key use)
            k_mask, k_ratio = jax.random.split(k_mask)
            prob = jax.random.uniform(k_ratio, (response.shape[0], 1))
        drawn = jax.random.uniform(k_mask, response.shape) < prob
        return active & drawn, active & ~drawn, later

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        config = views.config
        _, weight = self.resolved(config)
        tokens = batch["tokens"]
        masked_a, masked_b, later = self.views(batch, key, config)
        n = self.num_views                                                  # rows: view A, then view B
        masked = jnp.concatenate([masked_a, masked_b][:n])
        noisy = jnp.where(masked | jnp.concatenate([later] * n), config.mask_token_id, jnp.concatenate([tokens] * n))
        both = {k: jnp.concatenate([batch[k]] * n) for k in ("segment_ids", "positions")}
        logits = aligned_logits(views.student(noisy, both["positions"], padding_mask(both, config.attention,
                                                                                    config.block_size)), config)
        targets = jnp.concatenate([tokens] * n)
        ce = token_ce(logits, targets)
        ent = entropy_of(logits, self.temperature)
        right = masked & (jnp.argmax(logits, -1) == targets)             # argmax carries no gradient
        rows = tokens.shape[0]

        def view_mean(values, where, lo):
            w = where[lo:lo + rows]
            return jnp.where(w, values[lo:lo + rows], 0.0).sum() / jnp.maximum(w.sum(), 1)

        ce_total = sum(view_mean(ce, masked, v * rows) for v in range(n))
        ent_total = sum(view_mean(ent, right, v * rows) for v in range(n))
        loss = ce_total + weight * ent_total
        return loss, {"loss": loss, "ce": ce_total, "entropy": ent_total,
                      "masked_accuracy": accuracy(logits, targets, masked), "masked_tokens": masked.sum()}
