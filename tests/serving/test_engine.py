"""The serving engine against `generate`: each request's answer equals decoding that request alone
with the same settings and seed, whatever shares the slots and whenever it joined; rows are
released at once; nothing recompiles in steady state; cancellation, bounds and errors.

Every preset runs on the shipped checkpoint it was trained for (the default run takes one preset
per canvas; the slow run every other preset)."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

import jaxdllm
from jaxdllm import SamplerConfig
from jaxdllm.errors import ConfigError, InputError
from jaxdllm.serving.engine import Engine
from jaxdllm.serving.requests import EngineStopped, QueueFull, Request

TASKS = ["reverse 4821=", "sort 93715=", "copy 2718=", "123+456=", "perm 4312="]
LONG = ["copy 5820143967=", "reverse 7314=", "sort 42=", "copy 1122334455667=", "reverse 90817="]

# preset -> (checkpoint, prompts, SamplerConfig settings); every preset of SAMPLER_PRESETS has a row
CASES = {
    "llada": ("tasks-llada-small", TASKS, {}),
    "llada-random": ("tasks-llada-small", TASKS, {}),
    "fast-dllm-parallel": ("tasks-llada-small", TASKS, {}),
    "fast-dllm-prefix": ("tasks-llada-small", TASKS, {"block_length": 4}),
    "fast-dllm-dual": ("tasks-llada-small", TASKS, {"block_length": 4}),
    "fast-dllm-factor": ("tasks-llada-small", TASKS, {}),
    "dparallel": ("tasks-llada-small-dparallel", TASKS, {}),
    "dparallel-mbpp": ("tasks-llada-small-dparallel", TASKS, {}),
    "eb": ("tasks-llada-small", TASKS, {}),
    "prophet": ("tasks-llada-small", TASKS, {}),
    "credit": ("tasks-llada-small", TASKS, {}),
    "learn2pd": ("tasks-llada-small", TASKS, {}),
    "local-leap": ("tasks-llada-small", TASKS, {}),
    "freedave": ("tasks-llada-small", TASKS, {}),
    "dream": ("tasks-dream-small", TASKS, {"gen_length": 32}),  # the preset alone: its whole-canvas block
    "llada2": ("tasks-llada2-tiny", ["reverse 4821=", "copy 2718=", "reverse 93=", "copy 55123="], {}),
    "llada2.1": ("tasks-llada2-tiny", ["reverse 4821=", "copy 2718=", "reverse 93=", "copy 55123="], {}),
    "diffusiongemma": ("tasks-diffusiongemma-tiny", TASKS, {}),
    "jacobi": ("tasks-qwen2-small", LONG, {}),
    "jacobi-forcing": ("tasks-qwen2-small-jf", LONG, {}),
    "lookahead": ("tasks-qwen2-small", LONG, {}),
    "medusa": ("tasks-qwen2-small", LONG, {}),
    "bpd": ("tasks-qwen2-small", LONG, {}),
    "token-recycling": ("tasks-qwen2-small", LONG, {}),
    "specdiff": ("tasks-qwen2-small", LONG, {}),
    "diffuspec": ("tasks-qwen2-small", LONG, {}),
    "apd": ("tasks-llada-small", TASKS, {}),
}
# one preset per canvas (and a cache that refreshes per row) in the default run
DEFAULT_RUN = {"fast-dllm-dual", "llada2.1", "diffusiongemma", "jacobi", "freedave", "apd"}


@functools.cache
def shipped(name):
    return jaxdllm.load(name)


def config_for(preset):
    name, _, settings = CASES[preset]
    if preset == "dream":  # the checkpoint's jaxdllm_sampler.json sets a block of 16, which Dream's policy refuses
        return SamplerConfig.preset(preset, **settings)
    return jaxdllm.sampler_defaults(name, preset, **settings)


def collect(events, rid):
    return lambda e: events.setdefault(rid, []).append(e)


def alone(model, tok, ids, config, params, seed=0):
    """The answer tokens of `generate` for one prompt: up to its first stop token."""
    out = jaxdllm.generate(model, np.asarray([ids], np.int32), config, key=jax.random.PRNGKey(seed),
                           policy_params=params)
    row = np.asarray(out.generated[0]).tolist()
    ends = [row.index(s) for s in tok.stop_ids if s in row]
    return row[:min(ends)] if ends else row, tok.answers(out)[0]


def test_every_preset_has_a_case():
    from jaxdllm.decoding.config import SAMPLER_PRESETS
    assert set(CASES) == set(SAMPLER_PRESETS)


@pytest.mark.parametrize("preset", [p if p in DEFAULT_RUN else pytest.param(p, marks=pytest.mark.slow)
                                    for p in CASES])
def test_each_request_decodes_as_alone_whatever_shares_the_slots(preset):
    name, prompts, _ = CASES[preset]
    model, tok, _ = shipped(name)
    config = config_for(preset)
    params = jaxdllm.policy_params(name, config)
    engine = Engine(model, tok, slots=2, steps_per_dispatch=1, policy_params=params)
    events = {}
    # two requests start; the others join while they decode (slot by slot as rows are released)
    for i, text in enumerate(prompts[:2]):
        engine.submit(Request(f"r{i}", tuple(tok.encode(text)), config, seed=i), collect(events, i))
    engine._tick()
    for i, text in enumerate(prompts[2:], start=2):
        engine.submit(Request(f"r{i}", tuple(tok.encode(text)), config, seed=i), collect(events, i))
    engine.run_until_idle()
    for i, text in enumerate(prompts):
        tokens, answer = alone(model, tok, tok.encode(text), config, params, seed=i)
        got = events[i]
        assert [e.finished for e in got] == [False] * (len(got) - 1) + [True], text
        assert got[-1].finish_reason in ("stop", "length"), got[-1]
        assert [t for e in got for t in e.token_ids] == tokens, (preset, text)
        assert "".join(e.text for e in got) == answer, (preset, text)
        assert got[-1].completion_tokens == len(tokens) and got[-1].prompt_tokens == len(tok.encode(text))
    assert engine.stats()["running"] == engine.stats()["waiting"] == 0
