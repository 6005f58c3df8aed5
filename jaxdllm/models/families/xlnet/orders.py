"""Permutation masks of the orders ASSD uses (MAC's 2^N orders): sigma = [visible ascending | masked
ascending], the visible block attending both ways. Shared by the `assd` training objective and decoding;
`perm_mask` follows transformers' convention (True: i may NOT attend to j)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def order_perm_mask(masked: jax.Array, real: jax.Array | None = None) -> jax.Array:
    """`[B, L, L]` bool perm_mask of the order sigma = [visible ascending | masked ascending] with the
    visible x visible block cleared, for `XLNetLM.two_stream`.

    With that order, `sigma_i <= sigma_j` holds exactly when j is masked and either i is visible or j >= i
    (the visible positions come first, in any order, since their block is cleared): a masked position
    sees every visible one and the masked ones before it; a visible one sees the visible ones only.

    Args:
      masked: `[B, L]` bool, the positions to predict (an answer, the middle of an answer for infilling).
      real: `[B, L]` bool, False on padding, whose columns are blocked for every query; None: no padding.
    """
    length = masked.shape[1]
    later = jnp.arange(length)[None, :] >= jnp.arange(length)[:, None]   # [L, L]: j >= i
    blocked = masked[:, None, :] & (~masked[:, :, None] | later[None])
    return blocked if real is None else blocked | ~real[:, None, :]
