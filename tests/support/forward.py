"""Jitted model calls for tests: eager NNX calls dispatch op by op, and on CPU each op is a compile of its own."""

import functools

from flax import nnx


@nnx.jit
def forward(model, input_ids, positions=None, attention=None, cache=None):
    return model(input_ids, positions=positions, attention=attention, cache=cache)


@functools.partial(nnx.jit, static_argnames="method")
def call(model, *args, method: str = "__call__", **kwargs):
    """`getattr(model, method)(*args, **kwargs)` compiled: for calls outside `forward`'s signature."""
    return getattr(model, method)(*args, **kwargs)
