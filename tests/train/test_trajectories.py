"""Jacobi trajectories of the shipped causal model (`jaxdllm distill trajectories`): every recorded
state's accepted prefix agrees with the fixed point, and the fixed point is transformers' greedy
`generate` on the same weights; then a few Jacobi Forcing / CLLM steps train on them."""

import json
from pathlib import Path

import numpy as np
import pytest

import jaxdllm
from jaxdllm.data import make_mixture
from jaxdllm.decoding import SamplerConfig
from jaxdllm.tokenizer import Tokenizer
from jaxdllm.train.distill import generate_answers
from support.optional import torch, transformers

MODEL = Path(__file__).resolve().parents[2] / "checkpoints" / "tasks-qwen2-small"


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory):
    out = tmp_path_factory.mktemp("traj") / "trajectories.jsonl"
    model = jaxdllm.from_pretrained(MODEL)
    tokenizer = Tokenizer.from_pretrained(MODEL)
    examples = make_mixture(["copy", "sort", "add", "perm"], 6, seed=5, split="test")
    config = SamplerConfig.preset("jacobi", gen_length=16, window=8, draft_init="prompt")
    stats = generate_answers(model, tokenizer, examples, config, out, batch_size=8, progress=False, trajectories=True)
    return out, [json.loads(line) for line in out.read_text().splitlines()], stats, model.config.eos_token_id


def test_states_agree_with_the_fixed_point_which_is_transformers_greedy(trajectories):
    _, records, stats, eos = trajectories
    assert len(records) == 24 and stats["tasks"]["all"]["n"] == 24
    hf = transformers.AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.float32).eval()
    several = 0
    for r in records:
        fixed = np.asarray(r["fixed_point"])
        states, accepted = np.asarray(r["states"]).reshape(-1, 16), r["accepted"]
        assert len(states) == r["nfe"] == len(accepted) and accepted[0] == 0
        assert accepted == sorted(accepted) and all(a < 16 for a in accepted)
        assert set(states[0]) <= set(r["prompt_ids"])  # the first draft: tokens drawn from the prompt
        for state, a in zip(states, accepted):
            np.testing.assert_array_equal(state[:a], fixed[:a])
        several += len(states) > 1
        with torch.no_grad():
            ids = torch.as_tensor([r["prompt_ids"]])
            greedy = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                                 do_sample=False, eos_token_id=eos, pad_token_id=eos)[0, ids.shape[1]:].numpy()
        end = int(np.argmax(greedy == eos)) + 1 if (greedy == eos).any() else 16
        np.testing.assert_array_equal(fixed[:end], greedy[:end])
        assert (fixed[end:] == eos).all()
    assert several >= 12  # most answers took more than one forward: the states are real


@pytest.mark.parametrize("kind", ["jacobi_forcing", pytest.param("cllm", marks=pytest.mark.slow)])
def test_trainer_runs_the_objective_on_trajectory_rows(trajectories, kind, tmp_path):
    from jaxdllm.train import Trainer
    from jaxdllm.train.config import TrainConfig

    path, *_ = trajectories
    config = TrainConfig.from_dict({
        "model": {"init_from": str(MODEL), "attention_impl": "xla"},
        "data": {"source": "trajectories", "path": str(path), "seq_len": 64, "batch_size": 8, "window": 4},
        "objective": {"kind": kind, "block_length": 8},
        "optim": {"lr": 1e-4}, "train": {"steps": 2}, "log": {"every": 1, "progress": False}})
    trainer = Trainer(config, workdir=None)
    batch = next(trainer.batches)
    prompt_len = batch["prompt_mask"].sum(1)
    assert ((batch["segment_ids"] > 0).sum(1) - prompt_len > 0).all()
    assert ((batch["segment_ids"] > 0).sum(1) - prompt_len) .max() % 16 == 0  # whole noisy/clean pairs of 8
    history = trainer.train()
    assert all(np.isfinite(h["loss"]) for h in history) and "consistency_loss" in history[-1]
