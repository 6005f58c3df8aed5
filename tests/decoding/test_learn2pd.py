"""Learn2PD end to end: oracle traces replayed from the engine's own decoding, the filter's BCE
fit, its file beside the model, and `--preset learn2pd` finding the shipped filter."""

import json
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

import jaxdllm
from jaxdllm.decoding import SamplerConfig
from jaxdllm.decoding.policies.learn2pd import FILTER_FILE, Learn2PDFilter, filter_facts, load_filter, save_filter
from jaxdllm.errors import CheckpointError, ConfigError
from jaxdllm.eval.evaluate import weights_version
from jaxdllm.train.distill.learn2pd import OracleExamples, acceptance, bce, oracle_examples, train_filter
from jaxdllm.train.distill.teacher import _states
from support.cli import run_cli
from support.forward import forward
from support.sampler_fixtures import MASK_ID, prompts, shared_tiny_llada

SHIPPED = Path(__file__).resolve().parents[2] / "checkpoints" / "tasks-llada-small"


@pytest.fixture(scope="module")
def tiny():
    model, _, _, path = shared_tiny_llada()
    return path, model


def _probs(model, prompt, state):
    """The model's softmax over the answer region of one unpadded row, MASK excluded (as a
    sampler step sees it): `[G, V]`."""
    canvas = np.asarray([list(prompt) + list(state)], np.int32)
    logits = np.asarray(forward(model, canvas, np.arange(canvas.shape[1])[None]).logits, np.float64)[0, len(prompt):]
    logits[:, MASK_ID] = -np.inf
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_oracle_labels_on_a_hand_built_trajectory(tiny):
    _, model = tiny
    _, _, rows = prompts([5, 9], seed=3)  # two prompt lengths: the replay left-pads the shorter one
    G, L = 8, 4
    records = []
    for row in rows:
        first = [MASK_ID] * G
        second = [7, 8, 9, 10] + [MASK_ID] * 4  # block 0 decided: the replay must read block 1
        argmax = _probs(model, row, second).argmax(-1)
        # the final answer agrees with the current argmax at positions 4 and 6 of block 1 only
        final = [7, 8, 9, 10, int(argmax[4]), int(argmax[5]) + 1, int(argmax[6]), int(argmax[7]) + 1]
        records.append({"prompt_ids": [int(t) for t in row], "states": [first, second], "fixed_point": final})
    ex = oracle_examples(model, records, L, batch_size=3)  # 4 states in batches of 3: a padded last batch
    assert ex.features.shape == (4, L) and list(ex.prompt) == [0, 0, 1, 1]
    for i, (row, record) in enumerate(zip(rows, records)):
        first, second = (_probs(model, row, s) for s in record["states"])
        final = np.asarray(record["fixed_point"])
        np.testing.assert_allclose(ex.features[2 * i], first[:L].max(-1), rtol=2e-5)
        np.testing.assert_array_equal(ex.labels[2 * i], first[:L].argmax(-1) == final[:L])
        np.testing.assert_array_equal(ex.weights[2 * i], np.ones(L))
        np.testing.assert_allclose(ex.features[2 * i + 1], second[L:].max(-1), rtol=2e-5)
        np.testing.assert_array_equal(ex.labels[2 * i + 1], [1, 0, 1, 0])
        np.testing.assert_array_equal(ex.weights[2 * i + 1], np.ones(L))
    train, held = ex.split(0.5, seed=0)
    assert set(train.prompt) | set(held.prompt) == {0, 1} and not set(train.prompt) & set(held.prompt)


def test_oracle_replay_sees_what_the_llada_sampler_saw(tiny):
    """LLaDA low-confidence at one token per step commits the masked position of highest top-1
    probability, and that token is final: in the replayed features it is the block's maximum
    among masked positions and its label is 1, at every recorded step."""
    _, model = tiny
    ids, mask, rows = prompts([4, 7, 6], seed=21)
    config = SamplerConfig(gen_length=16, block_length=8, steps=16, max_trajectory=16)
    out = jaxdllm.generate(model, ids, config, attention_mask=mask)
    records = [_states(out, i, ids.shape[1], rows[i].tolist()) for i in range(len(rows))]
    ex = oracle_examples(model, records, 8)
    assert len(ex.features) == 3 * 16  # every recorded state has a masked position in its block
    k = 0
    for record in records:
        states = np.asarray(record["states"] + [record["fixed_point"]])
        for before, after in zip(states[:-1], states[1:]):
            (pos,) = np.nonzero(before != after)[0]  # one token per step
            j = pos % 8
            assert ex.weights[k, j] == 1 and ex.labels[k, j] == 1
            masked = ex.weights[k] > 0
            assert ex.features[k, j] == pytest.approx(ex.features[k][masked].max(), rel=1e-5)
            k += 1


def test_filter_loss_is_binary_cross_entropy():
    rng = np.random.default_rng(0)
    z, y = (rng.normal(size=(6, 4)) * 3).astype(np.float32), (rng.random((6, 4)) > 0.5).astype(np.float32)
    w = (rng.random((6, 4)) > 0.3).astype(np.float32)
    p = 1 / (1 + np.exp(-z))
    direct = -(w * (y * np.log(p) + (1 - y) * np.log(1 - p))).sum() / w.sum()  # float64
    assert float(bce(z, y, w)) == pytest.approx(direct, rel=1e-5)


@pytest.mark.parametrize("hidden", [0, 16])
def test_train_filter_learns_a_separable_rule(hidden):
    """Labels = 'probability above 0.6': both variants learn it; a high threshold accepts only
    right positions."""
    rng = np.random.default_rng(1)
    x = rng.random((4000, 8)).astype(np.float32)
    ex = OracleExamples(x, (x > 0.6).astype(np.float32), np.ones_like(x), np.arange(4000) // 10)
    train, held = ex.split(0.2)
    module, log = train_filter(train, hidden=hidden, steps=600, batch_size=256, learning_rate=5e-2, held_out=held,
                               log_every=300)
    assert log[-1]["held_out_loss"] < 0.8 * log[0]["held_out_loss"]
    (row,) = acceptance(module, held, [0.9])
    assert row["precision"] > 0.97 and row["accepted"] > 0.2


@pytest.mark.parametrize("hidden", [0, 32])
def test_filter_file_round_trip_beside_a_model(tiny, hidden, tmp_path):
    path, model = tiny
    folder = tmp_path / "model"
    jaxdllm.save_pretrained(model, folder, copy_files_from=path)
    module = Learn2PDFilter(8, hidden, rngs=nnx.Rngs(3))
    version = weights_version(folder)
    save_filter(module, folder, model="tiny", note="test")
    (folder / "learn2pd_filter.json").write_text("{}")  # the training report beside it
    assert weights_version(folder) == version  # a filter beside the model does not change the model
    assert filter_facts(folder) == {"block_length": 8, "hidden": hidden, "model": "tiny", "note": "test"}
    x = np.random.default_rng(0).random((5, 8)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(load_filter(folder)(x)), np.asarray(module(x)))
    np.testing.assert_array_equal(np.asarray(load_filter(folder / FILTER_FILE)(x)), np.asarray(module(x)))
    # the model folder still loads (the filter is not a weight file) and an export keeps the filter
    again = jaxdllm.from_pretrained(folder)
    jaxdllm.save_pretrained(again, folder)
    assert (folder / FILTER_FILE).is_file()
    config = SamplerConfig(gen_length=16, block_length=8, steps=16, policy="learn2pd")
    loaded = jaxdllm.policy_params(folder, config)
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(module(x)))
    with pytest.raises(ConfigError, match="blocks of 8 positions.*block_length is 16"):
        jaxdllm.policy_params(folder, config.replace(block_length=16))
    assert jaxdllm.policy_params(folder, SamplerConfig(gen_length=16, block_length=8, steps=16)) is None
    with pytest.raises(CheckpointError, match="no Learn2PD filter"):
        jaxdllm.policy_params(path.parent, config)


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_shipped_filter_found_by_the_preset():
    """`--preset learn2pd` on the shipped model reads its filter without flags; the Python path
    gets the same filter, and with end-of-text prediction a second block is never decoded."""
    assert (SHIPPED / FILTER_FILE).is_file() and filter_facts(SHIPPED)["model"] == "tasks-llada-small"
    run = run_cli("generate", "--preset", "learn2pd", "--prompt", "reverse 4821=")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "1284"
    nfe = int(run.stderr.split("[nfe ")[1].split()[0])
    assert nfe < 16
    model, tok, defaults = jaxdllm.load("tasks-llada-small")
    batch = tok(["reverse 4821=", "copy 31415=", "sort 93715="])
    results = {}
    for eotp in (True, False):
        config = defaults.replace(policy="learn2pd", eot_prediction=eotp).resized(gen_length=32, block_length=16)
        results[eotp] = jaxdllm.generate(model, batch.ids, config, attention_mask=batch.mask,
                                         policy_params=jaxdllm.policy_params("tasks-llada-small", config))
    assert tok.answers(results[True]) == tok.answers(results[False]) == ["1284", "31415", "13579"]
    assert (results[True].nfe < results[False].nfe).all()  # EoTP: the all-EOS block is never decoded


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_eval_decodes_with_the_filter_and_keys_items_by_it(tmp_path):
    from jaxdllm.eval import evaluate, resolve_tasks

    model, tok, defaults = jaxdllm.load("tasks-llada-small")
    config = defaults.replace(policy="learn2pd")
    run = lambda params: evaluate(model, tok, resolve_tasks("reverse"), {"l2pd": config}, n=8, batch_size=8,
                                  out=tmp_path, policy_params={"l2pd": params}, progress=False, log=lambda _: None)
    row = run(jaxdllm.policy_params("tasks-llada-small", config))["results"]["l2pd"]["reverse"]
    assert row["accuracy"] == 1.0 and row["mean_nfe"] < 4
    rejecting = Learn2PDFilter(16, 0, rngs=nnx.Rngs(0))
    rejecting.out.bias.set_value(rejecting.out.bias.get_value() - 100.0)  # accepts nothing: one token per step
    row = run(rejecting)["results"]["l2pd"]["reverse"]
    assert row["mean_nfe"] == 16  # decoded again with this filter, not read from the first run's items
    assert len((tmp_path / "items.jsonl").read_text().splitlines()) == 16


@pytest.mark.slow
def test_distill_learn2pd_command_end_to_end(tmp_path):
    """The README's three commands at toy size: record trajectories, train the filter into a
    folder, and the report says what was measured."""
    recipe = tmp_path / "r.toml"
    recipe.write_text(f"""
[model]
init_from = "{SHIPPED}"
[distill]
tasks = ["reverse", "sort"]
examples_per_task = 6
sampler = {{ gen_length = 16, block_length = 16, steps = 16 }}
batch_size = 6
out = "{tmp_path / 'traj.jsonl'}"
[learn2pd]
steps = 50
batch_size = 64
held_out = 0.25
out = "{tmp_path / 'filter'}"
""")
    run = run_cli("distill", "trajectories", recipe, "--no-progress")
    assert run.returncode == 0, run.stderr
    run = run_cli("distill", "learn2pd", recipe)
    assert run.returncode == 0, run.stderr
    assert "threshold 0.96: accepts" in run.stdout
    report = json.loads((tmp_path / "filter" / "learn2pd_filter.json").read_text())
    assert report["prompts"] == 12 and report["held_out_prompts"] == 3 and report["states"]["train"] > 0
    assert filter_facts(tmp_path / "filter")["block_length"] == 16
    run = run_cli("distill", "learn2pd", recipe, "--set", "learn2pd.trajectories=missing.jsonl")
    assert run.returncode == 2 and "record them first with `jaxdllm distill trajectories" in run.stderr


def test_learn2pd_refuses_draft_and_verify_trajectories(tmp_path):
    """The trajectories' policy must decode the masked canvas; the check asks the policy, before
    any model is loaded."""
    from jaxdllm.train import TrainConfig
    from jaxdllm.train.distill.learn2pd import distill_learn2pd

    traj = tmp_path / "traj.jsonl"
    traj.write_text("")
    meta = {"sampler": {"policy": {"name": "lookahead"}, "gen_length": 16, "block_length": 4}}
    (tmp_path / "traj.jsonl.meta.json").write_text(json.dumps(meta))
    config = TrainConfig.from_dict({"model": {"init_from": str(SHIPPED)}, "distill": {"out": str(traj)}})
    with pytest.raises(ConfigError, match="draft-and-verify trajectories"):
        distill_learn2pd(config, "r.toml", tmp_path / "filter")
    assert not (tmp_path / "filter").exists()


def test_trajectory_file_errors_name_the_line(tmp_path):
    from jaxdllm.errors import DataError
    from jaxdllm.train.distill.learn2pd import read_trajectories

    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt_ids": [1], "states": [[3]], "fixed_point": [2]}\n{"prompt": "x"}\n')
    with pytest.raises(DataError, match=r"t.jsonl:2: not a trajectory record"):
        read_trajectories(path)
    path.write_text("")
    with pytest.raises(DataError, match="no trajectory records"):
        read_trajectories(path)
