"""Training objectives on a batch from `jaxdllm.data.batching` (numbers from the published code).

Each loss takes `apply(tokens, positions, mask) -> logits [B, L, V]` (the model), the batch
dict (`tokens`, `prompt_mask`, `target_mask`, `segment_ids`, `positions`, each `[B, L]`) and a
PRNG key, and returns `(loss, metrics)`.

* `mdm_pretrain` (LLaDA pre-training): per row `t ~ U(0, 1)`, `p = (1 - eps) t + eps`; every
  real token is masked with probability `p`; `loss = sum_masked CE / p / num_real_tokens`
  (LLaDA divides by `B * L`, which is the same when rows have no padding).
* `mdm_sft` (LLaDA SFT): the prompt stays clean; answer tokens (`target_mask`, including
  the EOS fill) are masked with probability `p`; each masked token's `CE / p` is divided by
  its example's answer length and the sum by the number of examples.
* `block_diffusion` (BD3-LM): the model reads `[x_t ; x_0]` under the block-diffusion mask,
  both halves at positions `0..n-1`; a `t` per block; loss `CE / p` on the masked tokens of
  `x_t`, over the number of real tokens.
* `causal_lm`: next-token CE on target tokens (or every real token when no target is marked).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxdllm.attention import MaskSpec

Apply = Callable[[jax.Array, jax.Array, MaskSpec], jax.Array]
OBJECTIVES = ("mdm_pretrain", "mdm_sft", "block_diffusion", "causal_lm")


def _token_ce(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """`[B, L]` float32 cross-entropy of `logits [B, L, V]` at `targets [B, L]`."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def _padding_mask(batch, kind: str = "bidirectional", block_size: int | None = None) -> MaskSpec:
    seg = batch["segment_ids"]
    return MaskSpec(kind=kind, block_size=block_size, q_segment_ids=seg, kv_segment_ids=seg)


def _accuracy(logits, targets, where):
    hits = (jnp.argmax(logits, -1) == targets) & where
    return hits.sum() / jnp.maximum(where.sum(), 1)


def mdm_loss(apply: Apply, batch: dict, key: jax.Array, *, mask_id: int, eps: float = 1e-3,
             sft: bool = False, attention: str = "bidirectional") -> tuple[jax.Array, dict]:
    """LLaDA masked-diffusion loss: pre-training (`sft=False`) or SFT (`sft=True`)."""
    tokens = batch["tokens"]
    real = batch["segment_ids"] > 0
    candidates = batch["target_mask"] if sft else real
    k_t, k_m = jax.random.split(key)
    t = jax.random.uniform(k_t, (tokens.shape[0], 1))
    p = (1.0 - eps) * t + eps
    masked = (jax.random.uniform(k_m, tokens.shape) < p) & candidates
    noisy = jnp.where(masked, mask_id, tokens)
    logits = apply(noisy, batch["positions"], _padding_mask(batch, attention))
    weighted = jnp.where(masked, _token_ce(logits, tokens) / p, 0.0)
    if sft:
        # Per-example answer length: count target tokens of the same segment in the row.
        seg = batch["segment_ids"]
        same = (seg[:, :, None] == seg[:, None, :]) & candidates[:, None, :]
        answer_len = jnp.maximum(same.sum(-1), 1)
        n_examples = _count_segments(seg, candidates)
        loss = (weighted / answer_len).sum() / jnp.maximum(n_examples, 1)
    else:
        loss = weighted.sum() / jnp.maximum(real.sum(), 1)
    return loss, {"loss": loss, "masked_accuracy": _accuracy(logits, tokens, masked),
                  "masked_tokens": masked.sum()}


def _count_segments(seg: jax.Array, candidates: jax.Array) -> jax.Array:
    """Number of (row, segment) pairs with at least one candidate token."""
    max_seg = seg.shape[1]
    one_hot = (seg[:, :, None] == jnp.arange(1, max_seg + 1)[None, None, :]) & candidates[:, :, None]
    return one_hot.any(axis=1).sum()


def block_diffusion_loss(apply: Apply, batch: dict, key: jax.Array, *, mask_id: int,
                         block_size: int, eps: float = 1e-3) -> tuple[jax.Array, dict]:
    """BD3-LM loss on `[x_t ; x_0]` (rows must not be packed: one segment per row)."""
    tokens = batch["tokens"]
    b, n = tokens.shape
    real = batch["segment_ids"] > 0
    k_t, k_m = jax.random.split(key)
    n_blocks = -(-n // block_size)
    t = jax.random.uniform(k_t, (b, n_blocks))
    p = jnp.repeat((1.0 - eps) * t + eps, block_size, axis=1)[:, :n]
    masked = (jax.random.uniform(k_m, tokens.shape) < p) & real
    x_t = jnp.where(masked, mask_id, tokens)
    both = jnp.concatenate([x_t, tokens], axis=1)
    positions = jnp.concatenate([batch["positions"]] * 2, axis=1)
    seg = jnp.concatenate([batch["segment_ids"]] * 2, axis=1)
    mask = MaskSpec(kind="block_diffusion", block_size=block_size, q_segment_ids=seg, kv_segment_ids=seg)
    logits = apply(both, positions, mask)[:, :n]
    weighted = jnp.where(masked, _token_ce(logits, tokens) / p, 0.0)
    loss = weighted.sum() / jnp.maximum(real.sum(), 1)
    return loss, {"loss": loss, "masked_accuracy": _accuracy(logits, tokens, masked),
                  "masked_tokens": masked.sum()}


def causal_lm_loss(apply: Apply, batch: dict, key: jax.Array) -> tuple[jax.Array, dict]:
    """Next-token cross-entropy; the key is unused (kept for one signature)."""
    del key
    tokens, seg = batch["tokens"], batch["segment_ids"]
    logits = apply(tokens, batch["positions"], _padding_mask(batch, "causal"))[:, :-1]
    targets = tokens[:, 1:]
    scored = batch["target_mask"][:, 1:]
    scored = jnp.where(scored.any(), scored, seg[:, 1:] > 0) & (seg[:, 1:] == seg[:, :-1])
    ce = jnp.where(scored, _token_ce(logits, targets), 0.0)
    loss = ce.sum() / jnp.maximum(scored.sum(), 1)
    return loss, {"loss": loss, "masked_accuracy": _accuracy(logits, targets, scored),
                  "masked_tokens": scored.sum()}


def make_loss(objective: str, *, mask_id: int | None, eps: float = 1e-3, block_size: int | None = None,
              attention: str = "bidirectional"):
    """`loss(apply, batch, key) -> (loss, metrics)` for a named objective."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if objective != "causal_lm" and mask_id is None:
        raise ValueError(f"objective {objective!r} needs the model's mask_token_id")
    if objective == "mdm_pretrain":
        return lambda apply, batch, key: mdm_loss(apply, batch, key, mask_id=mask_id, eps=eps, attention=attention)
    if objective == "mdm_sft":
        return lambda apply, batch, key: mdm_loss(apply, batch, key, mask_id=mask_id, eps=eps, sft=True,
                                                  attention=attention)
    if objective == "block_diffusion":
        if not block_size:
            raise ValueError("objective 'block_diffusion' needs a block_size")
        return lambda apply, batch, key: block_diffusion_loss(apply, batch, key, mask_id=mask_id,
                                                              block_size=block_size, eps=eps)
    return causal_lm_loss
