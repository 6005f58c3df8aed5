"""`cond` and `switch` for the decoding loop's branches that depend on a row's own counters (a
Fast-dLLM cache's refresh at a block's first step, a finished block's K/V rewrite, DiffusionGemma's
canvas end, FreeDave's drafting mode, ...).

In the loop they are `lax.cond` / `lax.switch`. Mapped over the serving engine's slots
(`jaxdllm.decoding.slots`: `jax.vmap` of a step with one predicate per slot), `lax.cond` would run
both branches for every slot at every step and select. Inside `slot_context` these count, over
the running slots (a collective over the mapped axis), which branches are taken, and run only
those: one branch when the running slots agree, each taken branch (then a select per slot) only
at the steps where they differ. Over slots, each branch is traced once (a nested `jax.jit`, which XLA
inlines) however many sites run it.
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp

# (axis name, this slot's "running" flag) while a step is traced mapped over slots
_SLOTS: contextvars.ContextVar = contextvars.ContextVar("jaxdllm_slots", default=None)


@contextlib.contextmanager
def slot_context(axis_name: str, running: jax.Array):
    """Trace the enclosed step as one slot of a `jax.vmap(..., axis_name=axis_name)`; `running`: this
    slot's bool flag (a slot that does not run never decides which branches run)."""
    token = _SLOTS.set((axis_name, running))
    try:
        yield
    finally:
        _SLOTS.reset(token)


def _pick(take, a, b):
    """`a` where `take` (this slot's bool), else `b` (pytrees)."""
    return jax.tree.map(lambda x, y: jnp.where(take, x, y), a, b)


def switch(index, branches, *operands):
    """`lax.switch(index, branches, *operands)`; over slots, only the branches a running slot takes run."""
    branches = tuple(branches)
    slots = _SLOTS.get()
    if slots is None:
        return jax.lax.switch(index, branches, *operands)
    axis, running = slots
    # Each branch is traced at two sites below (the agreed switch and the mixed path), and in a nested
    # branch once per enclosing site; batching it over the slots re-evaluates its whole jaxpr each time.
    # A jitted branch is traced and batched once and reused at every site: a Fast-dLLM step's program
    # traces in a quarter of the time (the serving engine's first request at each stack size waits on it).
    branches = tuple(jax.jit(b) for b in branches)
    index = jnp.clip(jnp.asarray(index, jnp.int32), 0, len(branches) - 1)
    counts = [jax.lax.psum((running & (index == k)).astype(jnp.int32), axis) for k in range(len(branches))]
    any_running = jax.lax.psum(running.astype(jnp.int32), axis) > 0

    def mixed(*ops):
        out = None
        for k, branch in enumerate(branches):
            if out is None:
                out = branch(*ops)  # every slot's value is replaced below where it takes another branch
                continue
            out = jax.lax.cond(counts[k] > 0, lambda o, k=k, b=branch: _pick(index == k, b(*ops), o),
                               lambda o: o, out)
        return out

    # the one branch every running slot takes (its index, agreed by a collective), else each taken one
    taken = sum(jnp.where(c > 0, 1, 0) for c in counts)
    only = sum(jnp.where(c > 0, k, 0) for k, c in enumerate(counts))
    return jax.lax.cond((taken == 1) | ~any_running,
                        lambda *ops: jax.lax.switch(only, branches, *ops), mixed, *operands)


def cond(pred, true_fn, false_fn, *operands):
    """`lax.cond(pred, true_fn, false_fn, *operands)`; over slots, a branch no running slot takes does
    not run."""
    return switch(jnp.asarray(pred).astype(jnp.int32), (false_fn, true_fn), *operands)
