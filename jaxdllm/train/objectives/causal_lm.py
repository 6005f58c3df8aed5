"""Next-token cross-entropy (`causal_lm`) under causal attention, on the target tokens (or every
real token when the batch marks none), never across packed examples. A causal model's logit at
i always predicts token i + 1, so `shift_logits` does not change this objective."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.train.objectives.base import Objective, Views, accuracy, padding_mask, token_ce


@dataclasses.dataclass(frozen=True)
class CausalLM(Objective):
    name = "causal_lm"

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        del key  # deterministic
        tokens, seg = batch["tokens"], batch["segment_ids"]
        logits = views.student(tokens, batch["positions"], padding_mask(batch, "causal"))[:, :-1]
        targets = tokens[:, 1:]
        scored = batch["target_mask"][:, 1:]
        scored = jnp.where(scored.any(), scored, seg[:, 1:] > 0) & (seg[:, 1:] == seg[:, :-1])
        ce = jnp.where(scored, token_ce(logits, targets), 0.0)
        loss = ce.sum() / jnp.maximum(scored.sum(), 1)
        return loss, {"loss": loss, "masked_accuracy": accuracy(logits, targets, scored),
                      "masked_tokens": scored.sum()}
