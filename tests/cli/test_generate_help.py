"""`jaxdllm generate`: its `--help` (every preset with its line, every flag with what it does), its
status line (a drafting model's forwards), and any `--gen-length` on a block-causal model."""

import argparse
import re

import numpy as np
import pytest

from support.cli import run_cli


def generate_parser() -> argparse.ArgumentParser:
    import jaxdllm.cli as cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["generate"]


def test_help_lists_every_preset_and_says_what_every_flag_does():
    from jaxdllm.decoding.config import SAMPLER_PRESET_SUMMARIES, SAMPLER_PRESETS

    assert list(SAMPLER_PRESET_SUMMARIES) == list(SAMPLER_PRESETS)  # one line per preset, in the table's order
    assert all(line and "\n" not in line for line in SAMPLER_PRESET_SUMMARIES.values())
    parser = generate_parser()
    undocumented = [a.option_strings for a in parser._actions if not (a.help or "").strip()]
    assert not undocumented, undocumented
    text = parser.format_help()
    listed = text[text.index("presets (--preset NAME"):].splitlines()
    for name, summary in SAMPLER_PRESET_SUMMARIES.items():
        assert any(line.split()[:1] == [name] and line.endswith(summary) for line in listed), name


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_help_runs_from_the_command_line():
    out = run_cli("generate", "--help")
    assert out.returncode == 0, out.stderr
    assert "presets (--preset NAME" in out.stdout and "llada2.1" in out.stdout and "specdiff" in out.stdout
    assert re.search(r"--gen-length N +tokens to generate", out.stdout)


def test_status_line_shows_the_drafters_forwards():
    from jaxdllm.cli.generate_command import status_line
    from jaxdllm.decoding.sampler import GenerateResult

    def result(drafter):
        return GenerateResult(tokens=np.zeros((1, 8), np.int32), nfe=np.array([3]), commit_step=np.zeros((1, 8)),
                              trajectory=None, steps=3, drafter_forwards=drafter)

    assert status_line(result(None), 6, 8, 1.0) == \
        "[nfe 3 | 6 answer tokens of 8 | 2.00 answer tokens/forward | 1.00s incl. compile]"
    assert status_line(result(np.array([5])), 6, 8, 1.0).startswith("[nfe 3 | drafter forwards 5 | 6 answer tokens of 8")


@pytest.mark.slow  # a causal model and its diffusion drafter compile: the default run's 6-minute budget
def test_speculative_decoding_prints_the_drafters_forwards():
    out = run_cli("generate", "--model", "tasks-qwen2-small", "--preset", "specdiff", "--prompt", "reverse 4821=",
                  "--gen-length", "16")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1284"
    assert "| drafter forwards " in out.stderr and "answer tokens of 16" in out.stderr


@pytest.mark.slow  # the same decoding is checked against the published loop in test_published_block_layout.py
def test_a_block_causal_model_decodes_any_gen_length():
    """LLaDA2 with 44 tokens (not whole blocks of 16): the block stays, the answer is right."""
    out = run_cli("generate", "--model", "tasks-llada2-tiny", "--preset", "llada2", "--prompt", "reverse 4821=",
                  "--gen-length", "44")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1284" and "answer tokens of 44" in out.stderr
