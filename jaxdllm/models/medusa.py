"""Medusa heads (Cai et al., 2024): extra next-next-token predictors on a causal model's last
hidden state, for draft-and-verify decoding (`jaxdllm.decoding.policies.medusa`).

Head k (k = 0..K-1) reads the final-normed hidden state at position t (what the LM head reads,
`ForwardOutput.hidden`) and predicts token t + 2 + k: `layers` residual blocks `x + SiLU(W x + b)`
(W and b start at zero, so an untrained head is the model's own next-token head), then the
model's shared LM head (`Transformer.unembed`). `jaxdllm train` trains them with objective
`medusa` (`jaxdllm.train.objectives.medusa`) and writes them beside the model
(`medusa_heads.safetensors`, `jaxdllm.decoding.policies.medusa.save_heads`), where the `medusa` and
`bpd` presets find them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class MedusaHeads(nnx.Module):
    """`num_heads` residual heads over hidden states of width `embed_dim`; `layers` blocks each.

    Parameters: `kernel [K, layers, D, D]`, `bias [K, layers, D]` (float32, zero at init)."""

    def __init__(self, num_heads: int, embed_dim: int, layers: int = 1, *, rngs: nnx.Rngs | None = None):
        del rngs  # zero init: nothing random
        self.num_heads, self.embed_dim, self.num_layers = num_heads, embed_dim, layers
        self.kernel = nnx.Param(jnp.zeros((num_heads, layers, embed_dim, embed_dim), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((num_heads, layers, embed_dim), jnp.float32))

    def __call__(self, hidden: jax.Array) -> jax.Array:
        """`[K, ..., D]` each head's hidden state before the LM head, for `hidden [..., D]`."""
        x = jnp.broadcast_to(hidden.astype(jnp.float32), (self.num_heads, *hidden.shape))
        shape = (self.num_heads,) + (1,) * (hidden.ndim - 1)
        for layer in range(self.num_layers):
            w, b = self.kernel[:, layer], self.bias[:, layer]
            x = x + jax.nn.silu(jnp.einsum("k...d,kde->k...e", x, w) + b.reshape(*shape, -1))
        return x

    def logits(self, hidden: jax.Array, unembed) -> jax.Array:
        """`[K, ..., V]` float32: head k's logits for token t + 2 + k from `hidden [..., D]` at t,
        through `unembed` (the model's `Transformer.unembed`)."""
        out = self(hidden)
        flat = out.reshape(-1, 1, out.shape[-1])             # unembed takes [..., L, D]
        return unembed(flat.astype(hidden.dtype))[:, 0].reshape(*out.shape[:-1], -1)
