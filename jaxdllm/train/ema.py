"""An exponential moving average of the parameters, kept in the optimizer state (`[optim] ema_decay`),
as GenMol and MDLM keep one and sample with it.

The average follows MDLM's `ExponentialMovingAverage`: at the n-th update (n = 1, 2, ...) the decay is
`min(ema_decay, (1 + n) / (10 + n))`, so early averages forget their random start quickly. Living in
the optimizer state, it is sharded like the parameters, checkpointed and restored with them, and
left alone by a skipped (non-finite) step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdllm.errors import ConfigError


class EmaState(NamedTuple):
    """`ema_updates`: int32 scalar, updates averaged so far; `ema`: the average, shaped like the parameters."""

    ema_updates: jax.Array
    ema: optax.Params


def parameter_ema(decay: float) -> optax.GradientTransformation:
    """An optax transformation that leaves the updates unchanged and averages `params + updates`.
    It must come last in a chain (its `updates` are the final ones)."""

    def init(params):
        return EmaState(jnp.zeros((), jnp.int32), jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params))

    def update(updates, state, params=None):
        if params is None:
            raise ConfigError("parameter_ema needs the parameters: call tx.update(grads, state, params)")
        n = state.ema_updates + 1
        d = jnp.minimum(decay, (1.0 + n) / (10.0 + n))
        new_params = optax.apply_updates(params, updates)
        ema = jax.tree.map(lambda e, p: d * e + (1.0 - d) * p.astype(jnp.float32), state.ema, new_params)
        return updates, EmaState(n, ema)

    return optax.GradientTransformation(init, update)


def ema_from(opt_state) -> dict | None:
    """The averaged parameters inside an optimizer state, or None when it keeps no average."""
    found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, EmaState))
             if isinstance(s, EmaState)]
    return found[0].ema if found else None


__all__ = ["EmaState", "ema_from", "parameter_ema"]
