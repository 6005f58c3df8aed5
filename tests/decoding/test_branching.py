"""The loop's slot-aware `switch`/`cond` (jaxdllm.decoding.branching) against `lax.switch` row by row:
over the serving engine's slots each running slot gets its own branch's value, whether the running slots
agree on one branch, split over several, or none runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdllm.decoding import branching

BRANCHES = (lambda x: x * 2.0, lambda x: x + 10.0, lambda x: jnp.sin(x) - 3.0)


def over_slots(index, running, x):
    """`branching.switch` as the engine's step runs it: mapped over slots, one index per slot."""
    def step(i, r, xi):
        with branching.slot_context("slots", r):
            return branching.switch(i, BRANCHES, xi)
    return jax.jit(jax.vmap(step, axis_name="slots"))(index, running, x)


@pytest.mark.parametrize("index,running", [
    ([0, 0, 0, 0], [True, True, True, True]),     # all agree: one branch runs
    ([2, 2, 1, 2], [True, True, False, True]),    # a stopped slot's index does not count
    ([1, 0, 2, 1], [True, True, True, True]),     # every branch taken by some slot
    ([2, 0, 0, 1], [True, True, False, False]),
    ([1, 2, 0, 1], [False, False, False, False]),  # nothing runs
])
def test_each_running_slot_gets_its_own_branch(index, running):
    x = jnp.arange(4 * 3, dtype=jnp.float32).reshape(4, 3) / 7
    got = np.asarray(over_slots(jnp.asarray(index, jnp.int32), jnp.asarray(running), x))
    for row, (i, r) in enumerate(zip(index, running)):
        if r:
            np.testing.assert_allclose(got[row], np.asarray(jax.lax.switch(i, BRANCHES, x[row])), rtol=1e-6)


def test_each_branch_is_traced_once_over_slots_even_nested():
    """A branch's Python runs once per trace of the step, however many sites of the slot-aware switch run
    it (the agreed branch, the mixed path, an enclosing branch's two sites): a cache's model forward is
    not traced four times over."""
    calls = {"outer": 0, "inner0": 0, "inner1": 0}

    def counted(name, fn):
        def branch(x):
            calls[name] += 1
            return fn(x)
        return branch

    inner = (counted("inner0", lambda x: x * 2.0), counted("inner1", lambda x: x + 1.0))

    def step(i, r, xi):
        with branching.slot_context("slots", r):
            nested = counted("outer", lambda x: branching.switch(i % 2, inner, x) - 5.0)
            return branching.cond(i > 1, nested, lambda x: x, xi)

    index = jnp.asarray([0, 3, 2, 1], jnp.int32)
    x = jnp.arange(4 * 3, dtype=jnp.float32).reshape(4, 3)
    got = np.asarray(jax.jit(jax.vmap(step, axis_name="slots"))(index, jnp.ones(4, bool), x))
    assert calls == {"outer": 1, "inner0": 1, "inner1": 1}
    want = [x[r] if i <= 1 else (x[r] * 2.0 if i % 2 == 0 else x[r] + 1.0) - 5.0 for r, i in enumerate([0, 3, 2, 1])]
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6)
