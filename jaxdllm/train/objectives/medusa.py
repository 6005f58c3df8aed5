"""Medusa head training (`medusa`): K heads on a causal model's final hidden state, head k
predicting the token `2 + k` positions after its input (`jaxdllm.models.medusa`).

* `train_backbone = false` (Medusa-1, default): the model is frozen (only the heads are in the
  optimiser) and the loss is `sum_k decay^k L_k`.
* `train_backbone = true` (Medusa-2, joint): `L_LM + head_weight * sum_k decay^k L_k`, model and
  heads in one optimiser (the published recipe gives the heads 4x the learning rate; here they
  share the recipe's one schedule).

`L_k` is the cross-entropy of head k over the positions whose target `t + 2 + k` is a scored
token (an answer token, or every real token when the batch marks none) of the same packed
example. The heads are written beside the exported model (`medusa_heads.safetensors`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.errors import ConfigError
from jaxdllm.decoding.policies.medusa import save_heads
from jaxdllm.models.medusa import MedusaHeads
from jaxdllm.train.objectives.base import Objective, Views, accuracy, padding_mask, token_ce


@dataclasses.dataclass(frozen=True)
class MedusaObjective(Objective):
    """`num_heads` K, `layers` residual blocks per head, `train_backbone` (Medusa-2), `head_weight`
    and `decay` (the published 0.2 and 0.8). See the module docstring."""

    num_heads: int = 4
    layers: int = 1
    train_backbone: bool = False
    head_weight: float = 0.2
    decay: float = 0.8
    name = "medusa"

    def check(self, config):
        if config.attention != "causal":
            raise ConfigError(f"Medusa heads draft for causal models; this model's attention is {config.attention!r}")
        for field, low in (("num_heads", 1), ("layers", 1)):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"[objective] {field} must be an integer >= {low}, got {value!r}")
        if not 0 < self.decay <= 1 or self.head_weight <= 0:
            raise ConfigError(f"[objective] decay must be in (0, 1] and head_weight > 0, got {self.decay}, "
                              f"{self.head_weight}")

    def extra_module(self, config):
        return MedusaHeads(self.num_heads, config.embed_dim, self.layers)

    @property
    def freezes_backbone(self) -> bool:
        return not self.train_backbone

    def save_extra(self, module, directory, **facts):
        save_heads(module, directory, objective="medusa-2" if self.train_backbone else "medusa-1", **facts)

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        del key  # deterministic
        tokens, seg = batch["tokens"], batch["segment_ids"]
        out = views.forward(tokens, batch["positions"], padding_mask(batch, "causal"), return_hidden=True)
        hidden = out.hidden if self.train_backbone else jax.lax.stop_gradient(out.hidden)
        scored = batch["target_mask"]
        scored = jnp.where(scored.any(), scored, seg > 0)
        heads = views.extra.logits(hidden, views.unembed)                   # [K, B, L, V]
        metrics, head_loss = {}, 0.0
        for k in range(self.num_heads):
            ahead = 2 + k
            logits, targets = heads[k][:, :-ahead], tokens[:, ahead:]
            where = scored[:, ahead:] & (seg[:, ahead:] == seg[:, :-ahead]) & (seg[:, :-ahead] > 0)
            loss_k = jnp.where(where, token_ce(logits, targets), 0.0).sum() / jnp.maximum(where.sum(), 1)
            head_loss = head_loss + self.decay ** k * loss_k
            metrics[f"head{k}_loss"] = loss_k
            metrics[f"head{k}_accuracy"] = accuracy(logits, targets, where)
        if not self.train_backbone:
            return head_loss, {"loss": head_loss, **metrics}
        logits, targets = out.logits[:, :-1], tokens[:, 1:]
        where = scored[:, 1:] & (seg[:, 1:] == seg[:, :-1])
        lm = jnp.where(where, token_ce(logits, targets), 0.0).sum() / jnp.maximum(where.sum(), 1)
        loss = lm + self.head_weight * head_loss
        return loss, {"loss": loss, "lm_loss": lm, "masked_accuracy": accuracy(logits, targets, where), **metrics}
