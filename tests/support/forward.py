"""A jitted model call for tests: eager NNX calls dispatch op by op and are slow on CPU."""

from flax import nnx


@nnx.jit
def forward(model, input_ids, positions=None, attention=None, cache=None):
    return model(input_ids, positions=positions, attention=attention, cache=cache)
