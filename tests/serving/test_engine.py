"""The serving engine against `generate`: each request's answer equals decoding that request alone
with the same settings and seed, whatever shares the slots and whenever it joined; rows are
released at once; nothing recompiles in steady state; cancellation, bounds and errors.

Every preset has a case on the shipped checkpoint it was trained for. The engine's part of a request (its
slot of the compiled step: prefill into a free row, per-row state, release, streaming) depends on the
canvas, the cache, a policy's own per-row state and a second model, not on the policy's decision rule:
the default run takes two programs, the slow run one preset per engine mechanism (`engine_cases`);
every preset's own decoding is checked by tests/test_python_path.py."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest

import jaxdllm
from jaxdllm import SamplerConfig
from jaxdllm.data.char_tokenizer import build_char_tokenizer
from jaxdllm.decoding import hogwild_text
from jaxdllm.errors import ConfigError, InputError
from jaxdllm.serving.engine import Engine
from jaxdllm.serving.requests import EngineStopped, QueueFull, Request

TASKS = ["reverse 4821=", "sort 93715=", "copy 2718=", "123+456=", "perm 4312="]
LONG = ["copy 5820143967=", "reverse 7314=", "sort 42=", "copy 1122334455667=", "reverse 90817="]
PARTS = ["par rev rot swp: 1=314 2=520 3=761=", "par rot swp rev: 1=908 2=123 3=456 4=777=",
         "par swp rev rot: 1=640 2=215 3=102=", "par rev rev rot: 1=333 2=102 3=919=",
         "par rot rot swp: 1=135 2=246 3=357 4=468="]
COMPACT_HOGWILD = hogwild_text.settings_for(build_char_tokenizer(), hogwild_text.HogwildFormat(
    template="{problem}", past_steps="", others_header="|", own_header="|", step_header="{name}{k}:",
    names=("A", "B"), greetings=("", ""), check_text="?", finisher_text="=", finisher_tokens=4, check_every=8))

# preset -> (checkpoint, prompts, SamplerConfig settings); every preset of SAMPLER_PRESETS has a row
CASES = {
    "llada": ("tasks-llada-small", TASKS, {}),
    "llada-random": ("tasks-llada-small", TASKS, {}),
    "fast-dllm-parallel": ("tasks-llada-small", TASKS, {}),
    "fast-dllm-prefix": ("tasks-llada-small", TASKS, {"block_length": 8}),
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
    "sdar": ("tasks-sdar-small", TASKS, {}),
    "sdar-static": ("tasks-sdar-small", TASKS, {}),
    "sdar-eb": ("tasks-sdar-small", TASKS, {}),
    "sbd": ("tasks-qwen2-small-sbd", LONG, {}),
    "sbd-high": ("tasks-qwen2-small-sbd", LONG, {}),
    "wedlm": ("tasks-qwen2-small-wedlm", LONG, {}),
    "wedlm-quality": ("tasks-qwen2-small-wedlm", LONG, {"temperature": 0.0}),
    "assd": ("tasks-xlnet-small", TASKS, {}),
    "assd-greedy": ("tasks-xlnet-small", TASKS, {}),
    "multiverse": ("tasks-qwen2-small-multiverse", PARTS, {"newlines": False, "temperature": 0.0}),
    # the default texts do not fit the character model's 96 positions: a compact format (the prompt alone)
    "hogwild": ("tasks-qwen2-small", LONG, {"gen_length": 48, **COMPACT_HOGWILD}),
    # GenMol's sampler on plain prompts (gen_length MASK after each), its sampling and guidance as published
    **{p: ("tasks-llada-small", TASKS, {}) for p in ("genmol", "genmol-denovo", "genmol-linker", "genmol-motif",
                                                     "genmol-scaffold", "genmol-superstructure", "genmol-remask")},
}
# the default run: a masked canvas in the block layout with a policy that re-decides its block, and a
# draft canvas; the slow run every other decoding program (the other canvases: uniform, FreeDave, APD; every cache)
DEFAULT_RUN = {"llada2.1", "jacobi"}


def program_key(preset):
    """What selects a preset's compiled program: its checkpoint and its settings with every float reduced to
    its sign (a threshold, temperature or noise scale is a number in the same program; zero turns a branch
    off). Presets with one key differ only in those numbers (genmol-linker is genmol at T 1.2, r 3)."""
    def reduce(value):
        if isinstance(value, bool) or not isinstance(value, float):
            if dataclasses.is_dataclass(value):
                return (type(value).__name__,) + tuple((f.name, reduce(getattr(value, f.name)))
                                                       for f in dataclasses.fields(value))
            return value
        return value > 0

    return CASES[preset][0], reduce(config_for(preset))


def one_preset_per_program():
    """The first preset of each program key (`program_key`), in CASES's order."""
    seen = {}
    for preset in CASES:
        seen.setdefault(program_key(preset), preset)
    return list(seen.values())


# Programs whose slot mechanics are another's: the same canvas, cache and per-row state, a stateless
# policy that only decides differently (or another checkpoint of the same family, or another temperature
# sign of the same canvas). preset -> the preset whose engine case covers it.
SAME_ENGINE_MECHANISM = {
    "llada-random": "llada", "fast-dllm-parallel": "llada", "fast-dllm-factor": "llada", "dparallel": "llada",
    "eb": "llada", "local-leap": "llada",
    "jacobi-forcing": "jacobi", "bpd": "medusa", "diffuspec": "specdiff",
    "sdar-static": "sdar", "sdar-eb": "sdar", "wedlm-quality": "wedlm", "assd-greedy": "assd",
    "genmol-motif": "genmol",
}


def engine_cases():
    """One preset per engine mechanism: `one_preset_per_program` less `SAME_ENGINE_MECHANISM`'s keys."""
    return [p for p in one_preset_per_program() if p not in SAME_ENGINE_MECHANISM]


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


def test_presets_sharing_a_program_differ_only_in_numbers():
    covered = one_preset_per_program()
    assert set(DEFAULT_RUN) <= set(covered)
    assert {"genmol", "genmol-motif", "dparallel", "sbd", "assd", "assd-greedy", "wedlm", "wedlm-quality"} <= set(covered)
    assert not {"genmol-linker", "genmol-scaffold", "dparallel-mbpp", "sbd-high"} & set(covered)


def test_presets_sharing_an_engine_mechanism_share_canvas_cache_and_row_state():
    """A preset left to another's engine case has the same canvas, cache, second model or parameters, and
    policy state (stateless policies keep the base's `init_state`)."""
    from jaxdllm.decoding.config import SAMPLER_PRESETS
    from jaxdllm.decoding.policies.base import Policy

    def mechanism(preset):
        config = SAMPLER_PRESETS[preset]
        policy = type(config.policy)
        return (config.policy.canvas, type(config.cache).__name__, config.policy.companion,
                policy.load_params is not Policy.load_params, policy.init_state is not Policy.init_state)

    assert set(SAME_ENGINE_MECHANISM) <= set(one_preset_per_program())
    for preset, covered_by in SAME_ENGINE_MECHANISM.items():
        assert covered_by in engine_cases() and mechanism(preset) == mechanism(covered_by), preset
    # the stateful policies and every canvas, cache and second model keep their own case
    kept = {mechanism(p) for p in engine_cases()}
    assert {mechanism(p) for p in CASES} == kept


@pytest.mark.parametrize("preset", [p if p in DEFAULT_RUN else pytest.param(p, marks=pytest.mark.slow)
                                    for p in engine_cases()])
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
        assert [e.finished for e in got] == [False] * (len(got) - 1) + [True], text  # the last carries the end
        assert got[-1].finish_reason in ("stop", "length"), got[-1]
        assert [t for e in got for t in e.token_ids] == tokens, (preset, text)
        assert "".join(e.text for e in got) == answer, (preset, text)
        assert got[-1].completion_tokens == len(tokens) and got[-1].prompt_tokens == len(tok.encode(text))
    assert engine.stats()["running"] == engine.stats()["waiting"] == 0


@pytest.fixture(scope="module")
def llada():
    model, tok, defaults = shipped("tasks-llada-small")
    return model, tok, SamplerConfig.preset("fast-dllm-parallel", gen_length=16, block_length=8)


def ids_of(tok, text):
    return tuple(tok.encode(text))


def test_a_request_joins_while_others_are_mid_generation_and_rows_are_released_at_once(llada):
    model, tok, _ = llada
    config = SamplerConfig.preset("llada", gen_length=16, block_length=4)  # one token per step: 16 steps
    engine = Engine(model, tok, slots=2, steps_per_dispatch=1)
    events = {}
    engine.submit(Request("a", ids_of(tok, "sort 93715="), config), collect(events, "a"))
    for _ in range(5):
        engine._tick()
    assert engine.stats()["running"] == 1
    engine.submit(Request("b", ids_of(tok, "copy 2718="), config), collect(events, "b"))
    engine._tick()  # b is prefilled into the free slot while a is five steps in
    assert engine.stats()["running"] == 2
    group = next(iter(engine._groups.values()))
    steps = np.asarray(group.states.step)
    assert steps.tolist() == [7, 2]  # each slot counts its own steps (its first taken as it joined)
    engine.run_until_idle()
    assert "".join(e.text for e in events["a"]) == "13579" and "".join(e.text for e in events["b"]) == "2718"
    # the answer streamed in pieces as it was decided, not all at the end
    assert sum(bool(e.text) for e in events["a"]) >= 2


def test_max_tokens_and_stop_strings_end_the_answer_and_free_the_row(llada):
    model, tok, config = llada
    engine = Engine(model, tok, slots=2)
    events = {}
    engine.submit(Request("m", ids_of(tok, "sort 93715="), config, max_tokens=3), collect(events, "m"))
    engine.submit(Request("s", ids_of(tok, "sort 93715="), config, stop=("57",)), collect(events, "s"))
    engine.run_until_idle()
    assert "".join(e.text for e in events["m"]) == "135" and events["m"][-1].finish_reason == "length"
    assert events["m"][-1].completion_tokens == 3
    assert "".join(e.text for e in events["s"]) == "13" and events["s"][-1].finish_reason == "stop"
    assert engine.stats()["running"] == 0


def test_cancel_frees_a_running_row_and_drops_a_waiting_request(llada):
    model, tok, _ = llada
    config = SamplerConfig.preset("llada", gen_length=16, block_length=4)
    engine = Engine(model, tok, slots=1, steps_per_dispatch=1)
    events = {}
    engine.submit(Request("run", ids_of(tok, "sort 93715="), config), collect(events, "run"))
    engine.submit(Request("wait", ids_of(tok, "copy 2718="), config), collect(events, "wait"))
    engine._tick()
    engine.cancel("wait")
    engine.cancel("run")
    engine._tick()
    assert events["run"][-1].finish_reason == "cancelled" and events["wait"][-1].finish_reason == "cancelled"
    assert engine.stats()["running"] == engine.stats()["waiting"] == 0
    engine.submit(Request("run", ids_of(tok, "copy 2718="), config), collect(events, "again"))  # the id is free again
    engine.run_until_idle()
    assert "".join(e.text for e in events["again"]) == "2718"


def test_the_queue_is_bounded_and_bad_requests_fail_before_queueing(llada):
    model, tok, config = llada
    engine = Engine(model, tok, slots=1, max_queue=2)
    for i in range(2):
        engine.submit(Request(f"q{i}", ids_of(tok, "copy 2718="), config), lambda e: None)
    with pytest.raises(QueueFull, match="the bound is 2") as err:
        engine.submit(Request("q2", ids_of(tok, "copy 2718="), config), lambda e: None)
    assert err.value.retry_after_s > 0
    limit = model.config.max_position
    with pytest.raises(ConfigError, match=f"max_position \\({limit}\\)"):
        engine.check(Request("long", (5,) * limit, config))
    with pytest.raises(InputError, match="outside the vocabulary"):
        engine.check(Request("bad", (10**6,), config))
    with pytest.raises(InputError, match="already in the engine"):
        engine.submit(Request("q0", ids_of(tok, "copy 2718="), config), lambda e: None)
    with pytest.raises(ConfigError, match="max_trajectory=0"):
        engine.check(Request("t", ids_of(tok, "copy 2718="), config.replace(max_trajectory=4)))
    engine.shutdown(drain=False)
    with pytest.raises(EngineStopped):
        engine.submit(Request("late", ids_of(tok, "copy 2718="), config), lambda e: None)


def test_nothing_recompiles_in_steady_state(llada, compiles):
    """One prefill, and one step per stack size, for a config and prompt bucket: once warmed up, prompts
    of any length in the bucket, any seed, joining and leaving in any order compile nothing."""
    model, tok, config = llada
    engine = Engine(model, tok, slots=4, steps_per_dispatch=2)
    engine.warm_up(ids_of(tok, "copy 1="), config)
    before = len(compiles)
    assert before > 0  # the first requests compiled the bucket's programs
    events = {}
    texts = ["copy 9=", "reverse 123456=", "sort 5551234=", "7+8=", "copy 2718=", "reverse 4821=", "sort 93715="]
    for i, text in enumerate(texts):
        engine.submit(Request(f"n{i}", ids_of(tok, text), config, seed=i), collect(events, i))
        if i % 2:
            engine._tick()
    engine.run_until_idle()
    assert "".join(e.text for e in events[4]) == "2718" and len(events) == len(texts)
    assert compiles[before:] == []
    assert engine.stats()["programs"] == 1


def test_the_thread_drains_on_shutdown(llada):
    import threading
    model, tok, config = llada
    engine = Engine(model, tok, slots=2)
    engine.start()
    done = threading.Event()
    events = []

    def on_event(e):
        events.append(e)
        if e.finished:
            done.set()
    engine.submit(Request("d", ids_of(tok, "reverse 4821="), config), on_event)
    engine.shutdown(drain=True, timeout=60)
    assert done.is_set() and "".join(e.text for e in events) == "1284"


@pytest.mark.parametrize("slots", [1, 3])
def test_the_static_batch_baselines_answer_as_generate(llada, slots):
    """The schedulers the load test compares with: a batch formed once (3 rows) and one request at a
    time; greedy answers are `generate`'s, sent whole."""
    from jaxdllm.serving.static_batch import StaticBatchEngine
    model, tok, config = llada
    engine = StaticBatchEngine(model, tok, slots=slots, batch_wait_s=0.0)
    events = {}
    for i, text in enumerate(TASKS):
        engine.submit(Request(f"s{i}", ids_of(tok, text), config), collect(events, i))
    engine.run_until_idle()
    for i, text in enumerate(TASKS):
        tokens, answer = alone(model, tok, tok.encode(text), config, None)
        assert [t for e in events[i] for t in e.token_ids] == tokens and events[i][-1].text == answer
    assert engine.dispatches == -(-len(TASKS) // slots)


def test_requests_of_other_settings_get_their_own_program_within_the_bound(llada):
    """Two configs share no slots; with room for one program at a time, the second config's requests
    wait until the first's are done (no request is lost, each answers as alone)."""
    model, tok, config = llada
    other = SamplerConfig.preset("llada", gen_length=16, block_length=4)
    engine = Engine(model, tok, slots=2, max_groups=1)
    events = {}
    order = [(config, "reverse 4821="), (other, "sort 93715="), (config, "copy 2718="), (other, "123+456=")]
    for i, (c, text) in enumerate(order):
        engine.submit(Request(f"g{i}", ids_of(tok, text), c), collect(events, i))
    engine.run_until_idle()
    for i, (c, text) in enumerate(order):
        assert "".join(e.text for e in events[i]) == alone(model, tok, tok.encode(text), c, None)[1]
    assert engine.stats()["programs"] == 2 and engine.stats()["groups"] == 1
