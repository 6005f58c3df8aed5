"""WeDLM's fill rule (Tencent/WeDLM `wedlm/engine/sampler.py`; `conversions-sdar-sbd-wedlm.md` §3a):
which masks of the streaming window get a token this step.

For the window's remaining masks (slot indices `d` counted from the first remaining mask):

    H_i  = entropy of the mask's raw logits (nats)
    H~_i = H_i + pos_penalty * d_i
    fill = { i : H~_i < entropy_threshold }, or { argmin H~ } when that set is empty.

`entropy_threshold = 0` fills exactly one mask per step (H~ >= 0 never passes): the published
"threshold None" setting of the paper's quality tables. Tokens are the argmax (temperature 0) or a
sample of softmax(logits / T); the MASK token is never chosen (the published sampler can emit it;
a trained model never does, a random one may).

The policy decodes on the WeDLM canvas (`jaxdllm/decoding/wedlm_canvas.py`), which owns the
window, the topological reorder and the prefix cache.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.base import Policy, choose_tokens, token_entropy
from jaxdllm.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Wedlm(Policy):
    """`window`: the streaming window W (the engine's 16; the forward sees W to 2W tokens).
    `entropy_threshold`: tau (0.4 in the engine's defaults and evaluation; 0: one mask per step).
    `pos_penalty`: lambda, the entropy added per slot of distance from the first mask (0.02)."""

    window: int = 16
    entropy_threshold: float = 0.4
    pos_penalty: float = 0.02
    name = "wedlm"
    canvas = "wedlm_canvas"

    def check(self, config) -> None:
        super().check(config)
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 1:
            raise ConfigError(f"window must be an integer >= 1 (WeDLM's streaming window), got {self.window!r}")
        if self.entropy_threshold < 0 or self.pos_penalty < 0:
            raise ConfigError(f"entropy_threshold and pos_penalty must be >= 0 (0: one mask per step / no "
                              f"distance penalty), got {self.entropy_threshold} and {self.pos_penalty}")

    def resized_settings(self, gen_length: int, new_gen_length: int) -> dict:
        """The window stays the published one, at most the new canvas."""
        return {"window": min(self.window, new_gen_length)}

    def fill(self, logits: jax.Array, masks: jax.Array, key: jax.Array, temperature: float, mask_id: int
             ) -> tuple[jax.Array, jax.Array]:
        """`(fill [B, S] bool, tokens [B, S] int32)` for the window's slots in slot order.

        `logits [B, S, V]`: each slot's logits (float32); `masks [B, S]`: the slots that are still
        masks (the first True is the first remaining mask, distance 0). Rows without a mask fill nothing.
        """
        s = masks.shape[1]
        entropy = token_entropy(logits)
        slot = jnp.arange(s, dtype=jnp.float32)[None]
        first = jnp.argmax(masks, axis=1).astype(jnp.float32)[:, None]
        adjusted = jnp.where(masks, entropy + self.pos_penalty * (slot - first), jnp.inf)
        passes = masks & (adjusted < self.entropy_threshold)
        best = jax.nn.one_hot(jnp.argmin(adjusted, axis=1), s, dtype=bool) & masks
        fill = jnp.where(passes.any(1, keepdims=True), passes, best)
        tokens = choose_tokens(logits.at[..., mask_id].set(-jnp.inf), temperature, key)
        return fill, tokens
