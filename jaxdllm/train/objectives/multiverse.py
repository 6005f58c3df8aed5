"""Multiverse SFT (`multiverse`): next-token cross-entropy on the response under Multiverse Attention.

Yang et al. 2025 (arXiv 2506.09991; `train/utils.py` and `train/sft_multiverse.py` of
Infini-AI-Lab/Multiverse): the loss is the causal LM loss on the completion, but the forward attends with
the Multiverse mask (two different `<Path>` spans of one `<Parallel>` never see each other) at the
published shifted position ids (every path of a block starts at `</Goal>` + 1, the Conclusion right after
the longest path). Both are computed inside the jitted step from the batch's tokens
(`jaxdllm.attention.multiverse.multiverse_attention`, one scan over the ids), so the data pipeline stays
the plain prompt/response one. A row without tags has positions `0, 1, ...` and a causal mask: the loss
is exactly `causal_lm`'s. Rows hold one example each (no packing: the tag scan runs over the whole row).

Tokens the fork/merge decoder supplies are not scored (`jaxdllm/decoding/policies/multiverse.py` feeds
path k "<Path>k:" and a merged parent "<Conclusion>"):

* a path's label, the token(s) after each `<Path>` up to (not including) the next `:` ("2" in
  "<Path>2:"): under the mask a path does not see its siblings, so its number is not the model's to
  predict;
* the token right after each `</Path>`: a path cannot see whether it was the last one, so whether
  `<Path>` or `<Conclusion>` follows is the decoder's to say.

The published SFT scores every response token; this departs from it only for these tokens, which the
published engine also writes itself. Rows without tags have none of them.

Settings: `first_tag_id` (the 12 tags' ids are `first_tag_id + 0..11` in the published order; 101 for
the character tokenizer, `jaxdllm/data/multiverse_tags.py`), `colon_id` (the id of ':', which ends a
path's label; 32 for the character tokenizer) and `max_depth` (deepest nesting tracked).
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
    colon_id: int = 32
    max_depth: int = 4

    def __post_init__(self):
        if not isinstance(self.first_tag_id, int) or isinstance(self.first_tag_id, bool) or self.first_tag_id < 0:
            raise ConfigError(f"[objective] first_tag_id must be a non-negative int, got {self.first_tag_id!r}")
        if not isinstance(self.colon_id, int) or isinstance(self.colon_id, bool) or self.colon_id < 0:
            raise ConfigError(f"[objective] colon_id must be a non-negative int, got {self.colon_id!r}")
        if not isinstance(self.max_depth, int) or isinstance(self.max_depth, bool) or not 1 <= self.max_depth <= 16:
            raise ConfigError(f"[objective] max_depth must be an int in [1, 16], got {self.max_depth!r}")

    @property
    def tag_ids(self) -> tuple[int, ...]:
        return tuple(range(self.first_tag_id, self.first_tag_id + 12))

    def check(self, config: ModelConfig) -> None:
        if config.vocab_size < self.first_tag_id + 12:
            raise ConfigError(f"objective 'multiverse' needs the 12 tag ids {self.first_tag_id}.."
                              f"{self.first_tag_id + 11}, but the model has {config.vocab_size} rows: grow it first "
                              "(python -m jaxdllm.checkpoint.resize_vocab SRC OUT)")
        if config.attention != "causal" or config.shift_logits:
            raise ConfigError("objective 'multiverse' trains a causal model (attention = 'causal', no logit shift)")

    def decoder_supplied(self, tokens: jax.Array) -> jax.Array:
        """`[B, L]` bool: the tokens a fork/merge decoder writes itself (a path's label after `<Path>`, up to
        the `:`; the token after `</Path>`), which the loss does not score."""
        path_open, path_close = self.first_tag_id + 8, self.first_tag_id + 9
        index = jnp.arange(tokens.shape[1])
        last_open = jax.lax.cummax(jnp.where(tokens == path_open, index, -1), axis=1)
        last_colon = jax.lax.cummax(jnp.where(tokens == self.colon_id, index, -1), axis=1)
        before = lambda x, fill: jnp.pad(x[:, :-1], ((0, 0), (1, 0)), constant_values=fill)  # noqa: E731
        opened = before(last_open, -1)  # the latest <Path> strictly before each token
        label = (opened >= 0) & (last_colon < opened) & (tokens != path_open)
        return label | before(tokens == path_close, False)

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        del key  # deterministic
        tokens, seg = batch["tokens"], batch["segment_ids"]
        mask, positions = multiverse_attention(tokens, self.tag_ids, segment_ids=seg, max_depth=self.max_depth)
        logits = views.student(tokens, positions, mask)[:, :-1]
        targets = tokens[:, 1:]
        scored = batch["target_mask"][:, 1:]
        scored = jnp.where(scored.any(), scored, seg[:, 1:] > 0) & (seg[:, 1:] == seg[:, :-1])
        scored = scored & ~self.decoder_supplied(tokens)[:, 1:]
        ce = jnp.where(scored, token_ce(logits, targets), 0.0)
        loss = ce.sum() / jnp.maximum(scored.sum(), 1)
        return loss, {"loss": loss, "masked_accuracy": accuracy(logits, targets, scored),
                      "masked_tokens": scored.sum()}
