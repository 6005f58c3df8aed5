"""Aux-loss-free expert balancing for MoE models (LLaDA2 / Ling): after every optimizer step, each
MoE layer's `expert_bias` moves by `rate` towards balance. Experts that ran more (token, expert)
rows than the layer's mean lose `rate`, those that ran fewer gain it (DeepSeek-V3's bias update;
LLaDA2's routers carry the bias and no auxiliary loss). The bias only steers which experts are
chosen, never the routing weights, so the loss is untouched; the optimizer neither updates nor
decays it (`trains_by_gradient`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _is_bias(path) -> bool:
    return bool(path) and getattr(path[-1], "key", None) == "expert_bias"


def trains_by_gradient(params: dict) -> dict:
    """A pytree like `params` of bools: False for the routers' `expert_bias` (set by balancing,
    not by the optimizer; an optax mask)."""
    return jax.tree_util.tree_map_with_path(lambda path, _: not _is_bias(path), params)


def update_expert_bias(params: dict, loads: jax.Array, rate: float) -> dict:
    """`params` with every `expert_bias` moved by `rate * sign(mean load - load)`.

    Args:
      params: a pure parameter dict; its `expert_bias` leaves are `[E]` per layer (in layer order)
        or one `[num_layers, E]` stack (`scan_layers`).
      loads: `[num_moe_layers, E]` rows each expert ran (`model(..., return_router_loads=True).router_loads`).
    """
    leaves = [(path, x) for path, x in jax.tree_util.tree_leaves_with_path(params) if _is_bias(path)]
    if not leaves or rate == 0:
        return params
    loads = loads.astype(jnp.float32)
    step = rate * jnp.sign(loads.mean(-1, keepdims=True) - loads)  # [layers, E]
    if len(leaves) == 1 and leaves[0][1].ndim == 2:  # stacked layers
        steps = {leaves[0][0]: step}
    else:
        order = sorted(leaves, key=lambda item: _layer_index(item[0]))
        steps = {path: step[i] for i, (path, _) in enumerate(order)}
    return jax.tree_util.tree_map_with_path(lambda path, x: x + steps[path].astype(x.dtype) if path in steps else x,
                                            params)


def _layer_index(path) -> int:
    for entry in path:
        key = getattr(entry, "key", None)
        if isinstance(key, int):
            return key
    return 0


def load_metrics(loads: jax.Array) -> dict:
    """`expert_load_max`: the busiest expert's rows over the mean, worst layer (1.0 = balanced);
    `expert_load_cv`: the loads' coefficient of variation, averaged over layers."""
    loads = loads.astype(jnp.float32)
    mean = loads.mean(-1)
    return {"expert_load_max": jnp.max(loads.max(-1) / mean), "expert_load_cv": jnp.mean(loads.std(-1) / mean)}
