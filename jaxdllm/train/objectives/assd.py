"""ASSD's "joint" objective (`assd`; Guo & Ermon, arXiv 2504.20456, `finetune_xlnet_distributed.py`):
train an any-order model (XLNet, `jaxdllm.models.families.xlnet`) on p(x_M | x_V) for random subsets M of
the answer, factorised left to right over M.

Per row, a masking rate r; `num_predict = int(n_answer * r)` answer tokens (`target_mask`: the answer,
its EOS and the EOS fill) are masked, at least one; the prompt is always visible. The order is
sigma = [visible ascending | masked ascending] (MAC's 2^N orders, not N!), the permutation mask
`perm_mask[i, j] = sigma_i <= sigma_j` with the visible x visible block cleared (the prompt attends both
ways), and every masked position is a target of the query stream. The model reads the true tokens
everywhere (a masked token's content is what later masked tokens condition on; its own query never sees
it). Loss: the mean cross-entropy over all targets of the batch, unweighted (the published
`scale_by_none`). So the model learns prod_{m in M ascending} p(x_m | x_V, x_{M<m}): ASSD's verify pass.

Masking-rate curriculum (the published `start_masking_rate`, `masking_warmup_steps`, final range): at
optimizer step s the rates are drawn from [lo(s), hi(s)], `lo` ramping linearly from
`start_masking_rate` to `final_min` and `hi` to `final_max` over `masking_warmup_steps`. The published
code draws one rate per micro-batch from a stratified bin; here each row of a batch draws its own, one
per bin of B equal bins of the range (stratified over rows). Outside the trainer (no step) the final
range is used.

Draft conditionals: with `parallel_rate > 0` that share of rows predicts every masked token from the
visible tokens alone (the published `parallel` objective: no masked token sees another), the conditionals
ASSD's draft forward reads; the joint objective never trains them (its targets always see the masked
positions before them), so its drafts rely on generalisation and are often rejected.

Infilling: with `infill_rate > 0` that share of rows masks one contiguous span of `num_predict` answer
tokens at a uniform offset (the middle hidden, prefix and suffix visible), ASSD's infilling evaluation
layout; the other rows mask a uniform random subset (the published objective, which covers any pattern
but rarely a whole span).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.errors import ConfigError
from jaxdllm.models.families.xlnet.orders import order_perm_mask
from jaxdllm.train.objectives.base import Objective, Views, accuracy, token_ce


def masking_range(step, start: float, final_min: float, final_max: float, warmup_steps: int):
    """`(lo, hi)` float32 scalars: the curriculum's rate range at optimizer step `step` (None: the final one)."""
    if step is None:
        return jnp.float32(final_min), jnp.float32(final_max)
    progress = jnp.clip(jnp.asarray(step, jnp.float32) / max(warmup_steps, 1), 0.0, 1.0)
    return start + (final_min - start) * progress, start + (final_max - start) * progress


@dataclasses.dataclass(frozen=True)
class AssdJoint(Objective):
    """Settings: `start_masking_rate`, `final_min`, `final_max` (rates in (0, 1]), `masking_warmup_steps`
    (the curriculum's ramp, optimizer steps), `infill_rate` (share of rows that mask one contiguous span),
    `parallel_rate` (share of rows whose masked tokens see only the visible ones: the draft conditionals),
    `max_targets` (the query stream's width K; default the row length: every position may be a target;
    a smaller K caps `num_predict` at K)."""

    start_masking_rate: float = 0.15
    final_min: float = 0.85
    final_max: float = 0.99
    masking_warmup_steps: int = 5000
    infill_rate: float = 0.0
    parallel_rate: float = 0.0
    max_targets: int | None = None
    name = "assd"
    packing = False

    def __post_init__(self):
        super().__post_init__()
        for key in ("start_masking_rate", "final_min", "final_max"):
            if not 0 < getattr(self, key) <= 1:
                raise ConfigError(f"[objective] {key} must be in (0, 1], got {getattr(self, key)}")
        if self.final_min > self.final_max:
            raise ConfigError(f"[objective] final_min ({self.final_min}) exceeds final_max ({self.final_max})")
        if self.masking_warmup_steps < 0:
            raise ConfigError(f"[objective] masking_warmup_steps must be >= 0, got {self.masking_warmup_steps}")
        for key in ("infill_rate", "parallel_rate"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"[objective] {key} must be in [0, 1], got {getattr(self, key)}")
        if self.max_targets is not None and self.max_targets < 1:
            raise ConfigError(f"[objective] max_targets must be a positive integer, got {self.max_targets}")

    def check(self, config):
        if config.model_type != "xlnet":
            raise ConfigError(f"objective 'assd' trains an any-order model with a query stream (model_type "
                              f"'xlnet', e.g. [model] preset = \"tiny-xlnet\"); this model is {config.model_type!r}")

    def noise(self, batch: dict, key: jax.Array, step=None) -> tuple[jax.Array, jax.Array]:
        """`(masked [B, L] bool, rate [B] float32)`: each row's masked answer tokens and its masking rate."""
        answer = (batch["target_mask"] > 0) & (batch["segment_ids"] > 0)
        b, length = answer.shape
        k_rate, k_bins, k_pick, k_span, k_offset = jax.random.split(key, 5)
        lo, hi = masking_range(step, self.start_masking_rate, self.final_min, self.final_max,
                               self.masking_warmup_steps)
        bins = jax.random.permutation(k_bins, b)  # one bin of the range per row (stratified)
        rate = lo + (hi - lo) * (bins + jax.random.uniform(k_rate, (b,))) / b
        n_answer = answer.sum(1)
        cap = length if self.max_targets is None else min(self.max_targets, length)
        n_predict = jnp.minimum(jnp.maximum((n_answer * rate).astype(jnp.int32), 1), n_answer)
        n_predict = jnp.minimum(n_predict, cap)
        # a uniform random subset of the answer: its n_predict highest random scores
        score = jnp.where(answer, jax.random.uniform(k_pick, (b, length)), -1.0)
        rank = jnp.argsort(jnp.argsort(-score, axis=1), axis=1)
        subset = answer & (rank < n_predict[:, None])
        # a contiguous span of the answer at a uniform offset
        index = jnp.cumsum(answer, axis=1) - 1
        offset = jnp.floor(jax.random.uniform(k_offset, (b,)) * (n_answer - n_predict + 1)).astype(jnp.int32)
        span = answer & (index >= offset[:, None]) & (index < (offset + n_predict)[:, None])
        spans = jax.random.uniform(k_span, (b,)) < self.infill_rate
        return jnp.where(spans[:, None], span, subset), rate

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        tokens = batch["tokens"]
        b, length = tokens.shape
        masked, rate = self.noise(batch, key, views.step)
        perm_mask = order_perm_mask(masked, batch["segment_ids"] > 0)
        if self.parallel_rate:  # these rows' targets see the visible tokens only (ASSD's draft conditionals)
            parallel = jax.random.uniform(jax.random.fold_in(key, 1), (b,)) < self.parallel_rate
            perm_mask = perm_mask | (parallel[:, None, None] & masked[:, None, :])
        width = length if self.max_targets is None else min(self.max_targets, length)
        # the masked columns in ascending order first, then the others (their logits are not scored)
        column = jnp.arange(length)[None, :]
        targets = jnp.argsort(jnp.where(masked, column, length + column), axis=1)[:, :width].astype(jnp.int32)
        scored = jnp.arange(width)[None, :] < masked.sum(1, keepdims=True)
        logits = views.forward(tokens, None, None, perm_mask=perm_mask, target_positions=targets).logits
        labels = jnp.take_along_axis(tokens, targets, axis=1)
        ce = jnp.where(scored, token_ce(logits, labels), 0.0)
        loss = ce.sum() / jnp.maximum(scored.sum(), 1)
        return loss, {"loss": loss, "masked_accuracy": accuracy(logits, labels, scored),
                      "masked_tokens": scored.sum(), "masking_rate": rate.mean()}
