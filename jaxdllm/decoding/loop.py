"""The decoding loop: one `jax.jit` holding one `jax.lax.while_loop`, and a stepwise driver.

The loop knows a canvas (`canvas.py`; `masked_canvas.py`, `draft_canvas.py`, ...) only through three calls,
`init`, `step` and `max_steps`, over a `DecodeState`; it names no canvas, policy or cache. The model
enters as `(graphdef, params)` and is merged inside the compiled function, so parameters are
traced arrays (sharded as they are placed), not constants baked into the program.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxdllm import sharding as shd
from jaxdllm.decoding.layout import CanvasView
from jaxdllm.decoding.state import record_trajectory

_STATIC = ("graphdef", "canvas", "lay", "config", "params_def", "rules")


def _step(canvas, model, state, view, lay, config, policy_params):
    """One iteration: the canvas's step, then the bookkeeping every canvas shares (the canvas recorded
    in the trajectory, the step counted)."""
    state = canvas.step(model, state, view, lay, config, policy_params)
    return record_trajectory(state, config.max_trajectory).replace(step=state.step + 1)


def _merge(params_def, params_state):
    return None if params_def is None else nnx.merge(params_def, params_state)


def _decode(graphdef, params, prompt, seg_prompt, valid, key, params_state=None, answer_start=None, *, canvas, lay,
            config, params_def=None, rules=()):
    """The whole generation: `init`, then `step` while any row is decoding. Returns the final
    `DecodeState`. `prompt`, `seg_prompt`: `[B, Lp]`; `valid`: `[B]` rows to decode (others start done);
    `answer_start`: `[B]` each row's first answer column (None: Lp; see `CanvasView.of`).
    `rules`: the sharding rules in force while tracing (`sharding.frozen_rules`; () the defaults)."""
    model = nnx.merge(graphdef, params)
    policy_params = _merge(params_def, params_state)
    view = CanvasView.of(seg_prompt, config.gen_length, answer_start, lay.lead)
    with shd.use_rules(rules):
        state = canvas.init(model, prompt, view, key, lay, config, valid, policy_params)
        limit = canvas.max_steps(config, lay)
        return jax.lax.while_loop(lambda s: ~jnp.all(s.done) & (s.step < limit),
                                  lambda s: _step(canvas, model, s, view, lay, config, policy_params), state)


decode = jax.jit(_decode, static_argnames=_STATIC)


def decode_to_export():
    """A new jit of `decode` with a trace cache of its own: a program lowered for another platform
    (`Sampler.export`) is never reused by a run on this machine."""
    return jax.jit(functools.partial(_decode), static_argnames=_STATIC)


@functools.partial(jax.jit, static_argnames=_STATIC)
def init_step(graphdef, params, prompt, seg_prompt, valid, key, params_state=None, answer_start=None, *, canvas, lay,
              config, params_def=None, rules=()):
    """The initial `DecodeState` alone (the stepwise driver's first call)."""
    view = CanvasView.of(seg_prompt, config.gen_length, answer_start, lay.lead)
    with shd.use_rules(rules):
        return canvas.init(nnx.merge(graphdef, params), prompt, view, key, lay, config, valid,
                           _merge(params_def, params_state))


@functools.partial(jax.jit, static_argnames=_STATIC)
def one_step(graphdef, params, state, seg_prompt, params_state=None, answer_start=None, *, canvas, lay, config,
             params_def=None, rules=()):
    """One iteration of the loop body."""
    view = CanvasView.of(seg_prompt, config.gen_length, answer_start, lay.lead)
    with shd.use_rules(rules):
        return _step(canvas, nnx.merge(graphdef, params), state, view, lay, config, _merge(params_def, params_state))


def decode_stepwise(graphdef, params, prompt, seg_prompt, valid, key, params_state=None, answer_start=None, *,
                    canvas, lay, config, params_def=None, rules=()):
    """The same decoding as `decode`, driven by a Python loop that calls a jitted step and reads
    `done` back each iteration (one dispatch and one host sync per step). For benchmarks."""
    state = init_step(graphdef, params, prompt, seg_prompt, valid, key, params_state, answer_start, canvas=canvas,
                      lay=lay, config=config, params_def=params_def, rules=rules)
    limit = canvas.max_steps(config, lay)
    while not bool(jnp.all(state.done)) and int(state.step) < limit:
        state = one_step(graphdef, params, state, seg_prompt, params_state, answer_start, canvas=canvas, lay=lay,
                         config=config, params_def=params_def, rules=rules)
    return state
