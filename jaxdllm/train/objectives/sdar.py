"""SDAR's conversion of a causal LM into a block-diffusion model (`sdar`; JetAstra/SDAR
`modeling_sdar.py`: `forward_add_noise_packed`, `prepare_for_bd_training`, `block_diff_mask`).

The model reads `[x_t ; x_0]` under the block-diffusion mask (a noisy block sees itself both ways
and the clean blocks before it; the clean copy is block-causal), both copies at the same
positions. One masking probability per sequence, `p = (1 - eps) t + eps` with `t ~ U(0, 1)`; each
answer token of `x_t` is masked with probability `p` (prompt tokens never are), and a row whose
draw masked nothing gets one masked answer token. Loss: `sum over masked tokens of CE / p`, over
the number of answer tokens. No logit shift: a masked slot reads its own logit. There is no
next-token term; the clean copy only gives context.

It differs from `block_diffusion` (BD3-LM) in the noise (one `t` per sequence, answer tokens only)
and the normaliser (answer tokens); the layout, the mask and the 1/p weight are the same.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.errors import ConfigError
from jaxdllm.train.objectives.block_diffusion import BlockDiffusion


def scored_tokens(batch: dict) -> jax.Array:
    """`[B, L]` bool: the answer tokens (`target_mask`), or every real token when the batch marks none."""
    target = batch["target_mask"] > 0
    return jnp.where(target.any(), target, batch["segment_ids"] > 0)


def force_one(masked: jax.Array, scored: jax.Array, key: jax.Array) -> jax.Array:
    """`masked` with one random scored token masked in each row that has scored tokens but no masked one."""
    pick = jnp.argmax(jnp.where(scored, jax.random.uniform(key, scored.shape), -1.0), axis=1)
    one = jax.nn.one_hot(pick, scored.shape[1], dtype=bool) & scored
    return masked | (one & ~masked.any(1, keepdims=True))


@dataclasses.dataclass(frozen=True)
class SdarConversion(BlockDiffusion):
    """`block_size`: default the model's `block_size` (SDAR: 4); `eps`: the smallest masking probability (1e-3)."""

    name = "sdar"

    def check(self, config):
        if config.attention != "block_causal" or config.shift_logits:
            raise ConfigError("objective 'sdar' trains a block-causal model whose masked slots read their own logits: "
                              "set [model] attention = \"block_causal\" and block_size (shift_logits stays false)")
        super().check(config)

    def noise(self, batch: dict, key: jax.Array, config) -> tuple[jax.Array, jax.Array]:
        """`(masked [B, n] bool, p [B, n])`: one probability per row, answer tokens only."""
        tokens = batch["tokens"]
        k_t, k_m, k_f = jax.random.split(key, 3)
        p = (1.0 - self.eps) * jax.random.uniform(k_t, (tokens.shape[0], 1)) + self.eps
        scored = scored_tokens(batch)
        masked = (jax.random.uniform(k_m, tokens.shape) < p) & scored
        return force_one(masked, scored, k_f), jnp.broadcast_to(p, tokens.shape)

    def normaliser(self, batch: dict) -> jax.Array:
        return jnp.maximum(scored_tokens(batch).sum(), 1)
