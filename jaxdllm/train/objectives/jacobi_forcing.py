"""Jacobi Forcing (`jacobi_forcing`, Hu et al. 2025) and its baseline CLLM (`cllm`, Kou et al.
2024): a causal model trained on its own Jacobi trajectories to predict the right next tokens
from a partly wrong draft, so that Jacobi decoding accepts several tokens per forward.

A batch row is `prompt ++ noisy_0 ++ clean_0 ++ noisy_1 ++ clean_1 ++ ...` in blocks of
`block_length` (`jaxdllm.train.distill.trajectories`, which also picks the noisy states);
`prompt_mask` marks the prompt. One forward under the `jacobi_forcing` mask gives both streams.

* **AR term** (weight `ar_weight`, published 10): next-token cross-entropy on the clean stream,
  each clean token scored by the logit that precedes it *in the clean stream* (the previous
  clean token; for a block's first token, the last token of the previous clean block, or of the
  prompt). This is plain greedy AR training on the fixed point (the teacher's answer).
* **Consistency term**: in each pair, from the first position where `noisy_j` differs from
  `clean_j` on, the soft cross-entropy from the clean logits at the same offset (detached: the
  teacher side takes no gradient) to the noisy logits, both at temperature `temperature`,
  averaged over the pair's positions, summed over pairs and divided by the number of pairs,
  times `temperature**2`.

`cllm` is the same loss on CLLM's data (one random intermediate state of one block against the
fixed point, earlier blocks clean); the two differ only in which states the rows hold. Prompt
tokens are not scored (the published recipe also trains on the prompt: our task prompts are
random digits a model should not learn to predict).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxdllm.attention import MaskSpec
from jaxdllm.errors import ConfigError
from jaxdllm.train.objectives.base import Objective, Views, accuracy, token_ce
from jaxdllm.validation import require_positive_int


def stream_layout(prompt_len: jax.Array, length: int, n: int):
    """`(stream, offset)` of every position of packed rows, each `[B, length]`: `stream` 0 for the
    prompt, 1 noisy, 2 clean; `offset` the index inside its block (-1 in the prompt).
    `prompt_len`: `[B]`."""
    rel = jnp.arange(length)[None] - prompt_len[:, None]
    stream = jnp.where(rel < 0, 0, 1 + (rel // n) % 2)
    return stream, jnp.where(rel >= 0, rel % n, -1)


def packed_mask(batch: dict, n: int) -> MaskSpec:
    """The `jacobi_forcing` mask of a packed batch (prompt length from `prompt_mask`, padding from
    `segment_ids`)."""
    seg = batch["segment_ids"]
    return MaskSpec(kind="jacobi_forcing", block_size=n, prefix_len=batch["prompt_mask"].sum(1).astype(jnp.int32),
                    q_segment_ids=seg, kv_segment_ids=seg)


def soft_ce(teacher_logits: jax.Array, student_logits: jax.Array, temperature: float) -> jax.Array:
    """`[...]` cross-entropy from `softmax(teacher / T)` (no gradient) to `log_softmax(student / T)`."""
    target = jax.nn.softmax(jax.lax.stop_gradient(teacher_logits).astype(jnp.float32) / temperature, axis=-1)
    logp = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    return -jnp.sum(target * logp, axis=-1)


def _shifted(x: jax.Array, by: int, fill) -> jax.Array:
    """`x[:, i + by]` along axis 1 (`fill` past either end)."""
    length = x.shape[1]
    pad = jnp.full((x.shape[0], abs(by), *x.shape[2:]), fill, x.dtype)
    if by >= 0:
        return jnp.concatenate([x[:, by:], pad], 1)[:, :length]
    return jnp.concatenate([pad, x[:, :by]], 1)


@dataclasses.dataclass(frozen=True)
class JacobiForcing(Objective):
    """`block_length`: the Jacobi block `n` the rows were packed with; `ar_weight`: the AR term's
    weight; `temperature`: the consistency term's softmax temperature."""

    block_length: int = 16
    ar_weight: float = 10.0
    temperature: float = 1.0
    name: ClassVar[str] = "jacobi_forcing"
    packing: ClassVar[bool] = False
    trajectory_selection: ClassVar[str] = "progressive"

    def __post_init__(self):
        super().__post_init__()
        require_positive_int(self.block_length, "[objective] block_length")
        if not self.ar_weight >= 0:
            raise ConfigError(f"[objective] ar_weight must be >= 0, got {self.ar_weight}")
        if not self.temperature > 0:
            raise ConfigError(f"[objective] temperature must be positive, got {self.temperature}")

    def check(self, config):
        if config.attention != "causal" or config.shift_logits:
            raise ConfigError(f"objective {self.name!r} trains causal models (Qwen2, Llama); this model's attention "
                              f"is {config.attention!r}" + (" with shifted logits" if config.shift_logits else ""))

    def terms(self, logits: jax.Array, batch: dict) -> dict:
        """The loss terms of packed rows from their raw logits `[B, L, V]`: `ar`, `consistency`
        (without weights) and the counts and accuracy behind them."""
        n = self.block_length
        tokens, real = batch["tokens"], batch["segment_ids"] > 0
        length = tokens.shape[1]
        stream, offset = stream_layout(batch["prompt_mask"].sum(1), length, n)
        stream = jnp.where(real, stream, -1)
        # AR: clean token i is predicted at i - 1 inside its block, else at i - n - 1 (previous clean block / prompt)
        clean = stream == 2
        before = jnp.where((offset == 0)[..., None], _shifted(logits, -(n + 1), 0.0), _shifted(logits, -1, 0.0))
        ce = jnp.where(clean, token_ce(before, tokens), 0.0)
        ar = ce.sum() / jnp.maximum(clean.sum(), 1)
        # consistency: noisy position i against clean position i + n, from the pair's first difference on
        noisy = stream == 1
        differs = noisy & (tokens != _shifted(tokens, n, -1))
        scored = noisy & (_within_pair(jnp.cumsum(differs, axis=1), noisy, offset) > 0)
        # the scored positions are a suffix of their block: its length is n minus the offset where it starts
        first = offset - _within_pair(jnp.cumsum(scored, axis=1), noisy, offset) + 1
        per_token = soft_ce(_shifted(logits, n, 0.0), logits, self.temperature) / jnp.maximum(n - first, 1)
        pairs = noisy & (offset == 0)
        consistency = self.temperature ** 2 * jnp.where(scored, per_token, 0.0).sum() / jnp.maximum(pairs.sum(), 1)
        return {"ar": ar, "consistency": consistency, "clean_tokens": clean.sum(), "consistency_tokens": scored.sum(),
                "pairs": pairs.sum(), "clean_accuracy": accuracy(before, tokens, clean),
                "noisy_accuracy": accuracy(logits, _shifted(tokens, n + 1, -1), scored & (offset < n - 1))}

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        del key  # the rows already hold their noisy states
        logits = views.student(batch["tokens"], batch["positions"], packed_mask(batch, self.block_length))
        t = self.terms(logits, batch)
        loss = self.ar_weight * t["ar"] + t["consistency"]
        return loss, {"loss": loss, "ar_loss": t["ar"], "consistency_loss": t["consistency"],
                      "masked_accuracy": t["clean_accuracy"], "noisy_accuracy": t["noisy_accuracy"],
                      "masked_tokens": t["clean_tokens"], "consistency_tokens": t["consistency_tokens"]}


def _within_pair(cum: jax.Array, noisy: jax.Array, offset: jax.Array) -> jax.Array:
    """A running count `cum [B, L]` (a cumsum along the row) restarted at every noisy block's start:
    at each position, the count since its block began."""
    start = noisy & (offset == 0)
    before = jax.lax.cummax(jnp.where(start, _shifted(cum, -1, 0), -1), axis=1).clip(0)
    return cum - before


@dataclasses.dataclass(frozen=True)
class Cllm(JacobiForcing):
    """CLLM (Kou et al. 2024): the same loss on one random intermediate state per prompt."""

    name: ClassVar[str] = "cllm"
    trajectory_selection: ClassVar[str] = "one_state"
