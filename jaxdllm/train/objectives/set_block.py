"""Set Block Decoding (`set_block`; Gat, Ben-Hamu et al., arXiv 2509.04185, Eq. 13-14 and Figs. 7-9):
one causal model trained for next-token prediction (NTP) and masked prediction of a block of
future tokens at once, so it can decode several, not necessarily consecutive, tokens per forward
while its prefix stays exactly autoregressive.

The model reads `[x_hat ; x]`: a masked copy (each answer token masked with probability eta ~ U(0, 1),
one eta per sequence) and the clean sequence, both at the same positions (the paper's positional
embeddings repeated). Under the `set_block` mask (`jaxdllm.attention.mask`) the clean half is
causal, and a masked block of k tokens sees the clean tokens of the blocks before it and its own
block both ways. Blocks sit at multiples of k from the start of the row; k is drawn per step,
uniform in `[min_block, max_block]` (2-16, as the paper's text; its snippet's `randint` could
draw 0 or 1). Blocks are counted from each row's first answer token (`block_anchor = "answer"`,
default; the prompt before it is the clean context every block sees), which is where decoding puts
them: the sampler's blocks start at the prompt's end. `block_anchor = "sequence"` counts them from
the row's first token, the paper's `T = {1 + lk}` (the same on pretraining text, which has no prompt). Loss: the clean half's next-token cross-entropy on the answer plus the masked
slots' cross-entropy on their own tokens (no shift), weight 1 each and no 1/eta factor, as one
mean over all scored labels (the paper leaves the normalisation open; its snippet takes one
cross-entropy over the concatenated labels). The paper's snippet masks the *unmasked* labels'
complement (`parallel_labels[input_ids_mask] = -100`), which contradicts Eq. 14 and Fig. 8; this
follows the equation: the masked slots are scored.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxdllm.attention import MaskSpec
from jaxdllm.errors import ConfigError
from jaxdllm.train.objectives.base import Objective, Views, accuracy, token_ce
from jaxdllm.train.objectives.sdar import scored_tokens


@dataclasses.dataclass(frozen=True)
class SetBlockDecoding(Objective):
    """`min_block`, `max_block`: the range k is drawn from each step (inclusive; one compiled branch each);
    `block_anchor`: where each row's blocks start, `"answer"` or `"sequence"`."""

    min_block: int = 2
    max_block: int = 16
    block_anchor: str = "answer"
    name = "set_block"
    needs_mask_token = True
    packing = False

    def __post_init__(self):
        super().__post_init__()
        if not (isinstance(self.min_block, int) and isinstance(self.max_block, int)
                and 1 <= self.min_block <= self.max_block):
            raise ConfigError(f"[objective] needs integers 1 <= min_block <= max_block, got {self.min_block!r}, "
                              f"{self.max_block!r} (the paper draws k from 2-16)")
        if self.block_anchor not in ("answer", "sequence"):
            raise ConfigError(f"[objective] block_anchor must be \"answer\" (blocks from each row's first answer "
                              f"token, where decoding puts them) or \"sequence\" (from the row's start), "
                              f"got {self.block_anchor!r}")

    @property
    def stacked_views(self) -> int:
        """The model reads two copies of each row, `[x_hat ; x]`, along its length."""
        return 2

    def check(self, config):
        if config.attention != "causal":
            raise ConfigError("objective 'set_block' fine-tunes a causal model and keeps it causal (next-token "
                              f"decoding stays exact); the model's attention is {config.attention!r}")

    def noise(self, batch: dict, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """`(masked [B, n] bool, k)`: the masked answer tokens (one eta ~ U(0, 1) per row) and this
        step's block size (int32 scalar in `[min_block, max_block]`)."""
        tokens = batch["tokens"]
        k_eta, k_mask, k_block = jax.random.split(key, 3)
        eta = jax.random.uniform(k_eta, (tokens.shape[0], 1))
        masked = (jax.random.uniform(k_mask, tokens.shape) < eta) & scored_tokens(batch)
        return masked, jax.random.randint(k_block, (), self.min_block, self.max_block + 1)

    def anchors(self, batch: dict) -> jax.Array:
        """`[B]` int32: the column where each row's first block starts (its first answer token, or 0)."""
        if self.block_anchor == "sequence":
            return jnp.zeros(batch["tokens"].shape[:1], jnp.int32)
        return jnp.argmax(scored_tokens(batch), axis=1).astype(jnp.int32)

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        config = views.config
        tokens, seg, positions = batch["tokens"], batch["segment_ids"], batch["positions"]
        n = tokens.shape[1]
        masked, block_size = self.noise(batch, key)
        scored = scored_tokens(batch)
        inputs = jnp.concatenate([jnp.where(masked, config.mask_token_id, tokens), tokens], axis=1)
        both_seg = jnp.concatenate([seg, seg], axis=1)

        anchor = self.anchors(batch)

        def forward(block_size):
            mask = MaskSpec(kind="set_block", block_size=block_size, prefix_len=anchor, q_segment_ids=both_seg,
                            kv_segment_ids=both_seg)
            return views.student(inputs, jnp.concatenate([positions, positions], axis=1), mask)

        sizes = range(self.min_block, self.max_block + 1)
        logits = jax.lax.switch(block_size - self.min_block, [functools.partial(forward, k) for k in sizes])
        noisy, clean = logits[:, :n], logits[:, n:]

        # next-token prediction on the clean half: the answer's tokens (as `causal_lm`)
        ntp = scored[:, 1:] & (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)
        ntp_ce = jnp.where(ntp, token_ce(clean[:, :-1], tokens[:, 1:]), 0.0)
        masked_ce = jnp.where(masked, token_ce(noisy, tokens), 0.0)
        count = ntp.sum() + masked.sum()
        loss = (ntp_ce.sum() + masked_ce.sum()) / jnp.maximum(count, 1)
        return loss, {"loss": loss,
                      "ntp_loss": ntp_ce.sum() / jnp.maximum(ntp.sum(), 1),
                      "masked_loss": masked_ce.sum() / jnp.maximum(masked.sum(), 1),
                      "ntp_accuracy": accuracy(clean[:, :-1], tokens[:, 1:], ntp),
                      "masked_accuracy": accuracy(noisy, tokens, masked),
                      "masked_tokens": masked.sum()}
