"""The compiled train step: one `jax.jit` with explicit in/out shardings on the mesh, gradient
accumulation as a `lax.scan` over micro-batches, the objective called on the model's views."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxdllm.data import BATCH_KEYS
from jaxdllm.sharding import batch_sharding
from jaxdllm.train.expert_balance import load_metrics, update_expert_bias
from jaxdllm.train.objectives import Objective, Views
from jaxdllm.train.setup import OBJECTIVE_MODULE, SplitModel


def optimizer_step(opt_state) -> jax.Array:
    """int32 scalar: the updates `opt_state` has taken, the step the next update is (0 first): the first
    `count` of its states (AdamW's, kept across a resume with the rest of the state)."""
    counts = optax.tree_utils.tree_get_all_with_path(opt_state, "count")
    return counts[0][1].astype(jnp.int32) if counts else jnp.zeros((), jnp.int32)


def make_train_step(split: SplitModel, objective: Objective, tx: optax.GradientTransformation, opt_shardings, mesh,
                    *, grad_accum: int = 1, skip_nan: bool = False, expert_bias_rate: float = 0.0):
    """`step(trainable, frozen, opt_state, batch, key) -> (trainable, opt_state, metrics)`, jitted.

    `batch` is a dict of `[B, L]` arrays (`BATCH_KEYS`), split into `grad_accum` micro-batches;
    gradients and metrics are averaged over them. With `skip_nan`, a step whose loss is not finite
    leaves the state unchanged. `trainable` and `opt_state` are donated. MoE models log their router
    loads (`expert_load_max`, `expert_load_cv`) and, with `expert_bias_rate > 0`, balance their experts
    (`jaxdllm.train.expert_balance`).
    """
    def loss_of(trainable, frozen, micro, key, step_number):
        model = split.model(trainable, frozen)
        loads = []  # MoE: rows per expert of every student call

        def forward(tokens, positions, mask, cache=None, **kwargs):
            out = model(tokens, positions=positions, attention=mask, cache=cache, return_router_loads=True, **kwargs)
            if out.router_loads is not None:  # dense models have none
                loads.append(out.router_loads)
            return out

        def student(tokens, positions, mask):
            return forward(tokens, positions, mask).logits

        views = Views(student=student, config=model.config, forward=forward, init_cache=model.init_cache,
                      unembed=model.unembed, extra=getattr(model, OBJECTIVE_MODULE, None), step=step_number)
        loss, metrics = objective(views, micro, key)
        return loss, (metrics, sum(loads) if loads else jnp.zeros((), jnp.int32))  # dense: a scalar placeholder

    grad_fn = jax.value_and_grad(loss_of, has_aux=True)

    def step(trainable, frozen, opt_state, batch, key):
        micro = jax.tree.map(lambda x: x.reshape(grad_accum, x.shape[0] // grad_accum, *x.shape[1:]), batch)
        keys = jax.random.split(key, grad_accum)
        step_number = optimizer_step(opt_state)

        def body(acc, xs):
            mb, k = xs
            (_, aux), grads = grad_fn(trainable, frozen, mb, k, step_number)
            return jax.tree.map(jnp.add, acc, (grads, aux)), None

        zeros = jax.tree.map(jnp.zeros_like, trainable)
        aux_shapes = jax.eval_shape(lambda: grad_fn(trainable, frozen, jax.tree.map(lambda x: x[0], micro),
                                                    keys[0], step_number)[0][1])
        zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), aux_shapes[0])
        zero_aux = (zero_metrics, jnp.zeros(aux_shapes[1].shape, aux_shapes[1].dtype))  # metrics summed in float32
        (grads, (metrics, loads)), _ = jax.lax.scan(body, (zeros, zero_aux), (micro, keys))
        grads = jax.tree.map(lambda g: g / grad_accum, grads)
        metrics = jax.tree.map(lambda m: m / grad_accum, metrics)
        updates, new_opt = tx.update(grads, opt_state, trainable)
        new_trainable = optax.apply_updates(trainable, updates)
        metrics["grad_norm"] = optax.tree_utils.tree_norm(grads)
        if loads.ndim == 2:  # an MoE model: [num_moe_layers, E]
            metrics.update(load_metrics(loads))
            new_trainable = update_expert_bias(new_trainable, loads, expert_bias_rate)
        if skip_nan:  # keep the old state where the loss is not finite
            ok = jnp.isfinite(metrics["loss"])
            new_trainable = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new_trainable, trainable)
            new_opt = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new_opt, opt_state)
        return new_trainable, new_opt, metrics

    rows = batch_sharding(mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(step,
                   in_shardings=(split.trainable_shardings, split.frozen_shardings, opt_shardings,
                                 {k: rows for k in BATCH_KEYS}, replicated),
                   out_shardings=(split.trainable_shardings, opt_shardings, replicated),
                   donate_argnums=(0, 2))
