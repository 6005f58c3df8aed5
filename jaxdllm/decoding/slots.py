"""Independent rows of the decoding loop: a fixed set of slots, each holding one request's
`DecodeState` with its own step, block and block-step counters, stepped together by one compiled
program per stack size (the serving engine's driver, `jaxdllm.serving.engine`).

A slot is the state `loop.init_step` makes for one prompt (a batch of one), stacked on a leading
slot axis; `prefill` makes those of several prompts at once and `admit` writes them into free
slots; a step maps the canvas's own `step` over the slot axis (`jax.vmap`). So every canvas,
policy and cache runs unchanged, and a slot's tokens are those of decoding its request alone:
nothing in a slot's step reads another slot. A request joins at any step of the others
(its freshly prefilled state written into a free slot) and leaves as soon as it is done;
slots that are free or finished are carried unchanged.

Where a canvas branches on its own counters (a Fast-dLLM cache's refresh, a finished block's K/V
rewrite, DiffusionGemma's canvas end), the slots sit at different points of their schedules: those
branches (`jaxdllm.decoding.branching`) run once for all slots when the running slots agree, and
each branch a running slot takes, then a select per slot, when they differ.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxdllm import sharding as shd
from jaxdllm.decoding import branching
from jaxdllm.decoding.layout import CanvasView
from jaxdllm.decoding.loop import _merge, _step

_STATIC = ("graphdef", "canvas", "lay", "config", "params_def", "rules")

# Traces of each program (a trace is one compile): the engine reports them, tests count them.
TRACES: collections.Counter = collections.Counter()


@functools.partial(jax.jit, static_argnames=_STATIC)
def prefill(graphdef, params, ids, segs, valid, keys, params_state=None, answer_starts=None, *, canvas, lay, config,
            params_def=None, rules=()):
    """The one-row states of N prompts at once after their first step, stacked (leaves `[N, ...]`):
    `loop.init_step` of each prompt alone (its prefill) and the loop's first step, mapped over the
    prompts.

    Args:
      ids, segs: `[N, 1, Lp]`; valid: `[N, 1]`; keys: `[N, 2]` each request's PRNG key;
      answer_starts: `[N, 1]` (block-causal layout) or None.
    """
    TRACES["prefill"] += 1
    model = nnx.merge(graphdef, params)
    policy_params = _merge(params_def, params_state)

    def one(prompt, seg, ok, key, answer_start):
        view = CanvasView.of(seg, config.gen_length, answer_start, lay.lead)
        state = canvas.init(model, prompt, view, key, lay, config, ok, policy_params)
        # The first step too (every loop takes one): the joining slots all start a block together, so
        # a cache's refresh runs here for them alone, not for every slot at a later mixed step.
        with branching.slot_context("slots", ok[0]):
            return _step(canvas, model, state, view, lay, config, policy_params)

    with shd.use_rules(rules):
        return jax.vmap(one, in_axes=(0, 0, 0, 0, None if answer_starts is None else 0), axis_name="slots")(
            ids, segs, valid, keys, answer_starts)


@functools.partial(jax.jit, donate_argnames=("states",))
def admit(states, new, slots):
    """`states` with slots `slots` (int32 `[N]`; an index past the stack drops that entry) replaced by
    the stacked states `new` (leaves `[N, ...]`)."""
    TRACES["admit"] += 1
    return jax.tree.map(lambda s, x: s.at[slots].set(x.astype(s.dtype), mode="drop"), states, new)


@jax.jit
def gather(states, order):
    """The stacked states of slots `order` (int32 `[S']`, repeats allowed): a stack grown with filler
    slots or shrunk to the slots still in use."""
    TRACES["gather"] += 1
    return jax.tree.map(lambda x: jnp.take(x, order, axis=0), states)


def running(states, active, limit: int) -> jax.Array:
    """`[S]` slots that take the next step: active, not done, under the canvas's step bound."""
    return active & ~jnp.all(states.done, axis=1) & (states.step < limit)


@functools.partial(jax.jit, static_argnames=_STATIC + ("steps",), donate_argnames=("states",))
def advance(graphdef, params, states, segs, answer_starts, active, params_state=None, *, canvas, lay, config,
            params_def=None, rules=(), steps: int = 1):
    """Up to `steps` steps of every running slot, stopping early once a running slot finishes (so
    the caller can release it and admit another request).

    Args:
      states: the stacked `DecodeState`s (leaves `[S, ...]`; each slot a batch of one).
      segs: `[S, 1, Lp]` each slot's prompt segment ids; answer_starts: `[S, 1]` each slot's first
        answer column (block-causal layout) or None.
      active: `[S]` bool, slots holding a request.
      steps: the most steps taken in this call.

    Returns:
      The stacked states after the steps (slots that did not run are unchanged).
    """
    TRACES["advance"] += 1
    model = nnx.merge(graphdef, params)
    policy_params = _merge(params_def, params_state)
    limit = canvas.max_steps(config, lay)

    def one(state, seg, answer_start, go):
        view = CanvasView.of(seg, config.gen_length, answer_start, lay.lead)
        with branching.slot_context("slots", go):  # branches on a slot's counters run only where taken
            return _step(canvas, model, state, view, lay, config, policy_params)

    mapped = jax.vmap(one, in_axes=(0, 0, None if answer_starts is None else 0, 0), axis_name="slots")
    at_start = running(states, active, limit)

    def body(carry):
        i, states = carry
        go = running(states, active, limit)
        new = mapped(states, segs, answer_starts, go)
        keep = jax.tree.map(lambda n, o: jnp.where(go.reshape(go.shape + (1,) * (n.ndim - 1)), n, o), new, states)
        return i + 1, keep

    def more(carry):
        i, states = carry
        return (i < steps) & jnp.all(running(states, active, limit) == at_start) & at_start.any()

    with shd.use_rules(rules):
        return jax.lax.while_loop(more, body, (jnp.int32(0), states))[1]
