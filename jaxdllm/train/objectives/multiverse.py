"""Multiverse SFT (`multiverse`): next-token cross-entropy on the response under Multiverse Attention.

Yang et al. 2025 (arXiv 2506.09991; `train/utils.py` and `train/sft_multiverse.py` of
Infini-AI-Lab/Multiverse): the loss is the causal LM loss on the completion, but the forward attends with
the Multiverse mask (two different `<Path>` spans of one `<Parallel>` never see each other) at the
published shifted position ids (every path of a block starts at `</Goal>` + 1, the Conclusion right after
the longest path). Both are computed inside the jitted step from the batch's tokens
(`jaxdllm.attention.multiverse.multiverse_attention`, one scan over the ids), so the data pipeline stays
the plain prompt/response one. A row without tags has positions `0, 1, ...` and a causal mask: the loss
is exactly `causal_lm`'s. Rows hold one example each (no packing: the tag scan runs over the whole row).

Settings: `first_tag_id` (the 12 tags' ids are `first_tag_id + 0..11` in the published order; 101 for
the character tokenizer, `jaxdllm/data/multiverse_tags.py`) and `max_depth` (deepest nesting tracked).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxdllm.attention.multiverse import multiverse_attention
from jaxdllm.errors import ConfigError
from jaxdllm.models.config import ModelConfig
from jaxdllm.train.objectives.base import Objective, Views, accuracy, token_ce


@dataclasses.dataclass(frozen=True)
class MultiverseSft(Objective):
    name: ClassVar[str] = "multiverse"
    packing: ClassVar[bool] = False
    first_tag_id: int = 101
    max_depth: int = 4

    def __post_init__(self):
        if not isinstance(self.first_tag_id, int) or self.first_tag_id < 0:
            raise ConfigError(f"[objective] first_tag_id must be a non-negative int, got {self.first_tag_id!r}")
        if not isinstance(self.max_depth, int) or not 1 <= self.max_depth <= 16:
            raise ConfigError(f"[objective] max_depth must be an int in [1, 16], got {self.max_depth!r}")

    @property
    def tag_ids(self) -> tuple[int, ...]:
        return tuple(range(self.first_tag_id, self.first_tag_id + 12))

    def check(self, config: ModelConfig) -> None:
        if config.vocab_size < self.first_tag_id + 12:
            raise ConfigError(f"objective 'multiverse' needs the 12 tag ids {self.first_tag_id}.."
                              f"{self.first_tag_id + 11}, but the model has {config.vocab_size} rows: grow it first "
                              "(python -m jaxdllm.models.resize_vocab SRC OUT)")
        if config.attention != "causal" or config.shift_logits:
            raise ConfigError("objective 'multiverse' trains a causal model (attention = 'causal', no logit shift)")

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        del key  # deterministic
        tokens, seg = batch["tokens"], batch["segment_ids"]
        mask, positions = multiverse_attention(tokens, self.tag_ids, segment_ids=seg, max_depth=self.max_depth)
        logits = views.student(tokens, positions, mask)[:, :-1]
        targets = tokens[:, 1:]
        scored = batch["target_mask"][:, 1:]
        scored = jnp.where(scored.any(), scored, seg[:, 1:] > 0) & (seg[:, 1:] == seg[:, :-1])
        ce = jnp.where(scored, token_ce(logits, targets), 0.0)
        loss = ce.sum() / jnp.maximum(scored.sum(), 1)
        return loss, {"loss": loss, "masked_accuracy": accuracy(logits, targets, scored),
                      "masked_tokens": scored.sum()}
