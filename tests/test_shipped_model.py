"""The model shipped in checkpoints/ (trained by training/tasks_small_gpu.toml): the README's
first command works offline, and held-out task prompts are answered as its card reports."""

import os
import subprocess
import sys

import pytest

from jaxdllm import SamplerConfig, Tokenizer, from_pretrained
from jaxdllm.cli import DEFAULT_MODEL
from jaxdllm.train.evaluate import evaluate_task

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").is_file(), reason="no shipped checkpoint")


def test_readme_first_command_reverses_a_list():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-m", "jaxdllm.cli", "generate", "--prompt", "reverse 4821="],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1284"
    assert "[nfe 16 " in out.stderr


@pytest.mark.parametrize("task,preset", [("reverse", "llada"), ("perm", "fast-dllm-parallel")])
def test_held_out_accuracy(task, preset):
    model, tok = from_pretrained(DEFAULT_MODEL), Tokenizer.from_pretrained(DEFAULT_MODEL)
    steps = {"steps": 16} if preset == "llada" else {}
    config = SamplerConfig.preset(preset, gen_length=16, block_length=16, **steps)
    result = evaluate_task(model, tok, task, config, n=40, seed=7)
    assert result["accuracy"] >= 0.9, result["samples"]
