"""The models shipped in checkpoints/ (tasks_small_gpu.toml, its dParallel distillation, the causal model, its
Jacobi Forcing distillation and its SDAR and Set Block Decoding conversions): the README's first command works offline, and held-out task prompts are
answered as their cards report."""


import pytest

import jaxdllm
from jaxdllm import SamplerConfig, Tokenizer, from_pretrained
from jaxdllm.cli import DEFAULT_MODEL
from jaxdllm.train.task_accuracy import evaluate_task
from support.cli import run_cli
from support.fresh_eval import evaluate_in_a_fresh_process

# The slow run (`.ci/run` runs it after the default run): model-card checks of the shipped checkpoints and
# the README's first command in a fresh process; the default run's 6-minute budget.
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").is_file(), reason="no shipped checkpoint")]


def test_readme_first_command_reverses_a_list():
    out = run_cli("generate", "--prompt", "reverse 4821=")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1284"
    assert "[nfe 16 " in out.stderr


@pytest.mark.parametrize("task,preset", [pytest.param("reverse", "llada", marks=pytest.mark.slow),  # 6-minute budget
                                         ("perm", "fast-dllm-parallel")])
def test_held_out_accuracy(task, preset):
    model, tok = from_pretrained(DEFAULT_MODEL), Tokenizer.from_pretrained(DEFAULT_MODEL)
    steps = {"steps": 16} if preset == "llada" else {}
    config = SamplerConfig.preset(preset, gen_length=16, block_length=16, **steps)
    result = evaluate_task(model, tok, task, config, n=40, seed=7)
    assert result["accuracy"] >= 0.9, result["samples"]


DISTILLED = DEFAULT_MODEL.parent / "tasks-llada-small-dparallel"


@pytest.mark.skipif(not (DISTILLED / "config.json").is_file(), reason="no shipped distilled checkpoint")
@pytest.mark.parametrize("task,card_accuracy,card_nfe,base_accuracy", [("sort", 0.94, 1.07, 0.905),
                                                                       ("add", 0.585, 1.39, 0.375)])
def test_distilled_model_card(task, card_accuracy, card_nfe, base_accuracy):
    """The distilled card's entropy-0.2 row on its 200 held-out prompts: within a point of the card,
    above the base model with the same sampler, in about one forward."""
    model, tok = from_pretrained(DISTILLED, dtype="float32"), Tokenizer.from_pretrained(DISTILLED)
    config = SamplerConfig.preset("dparallel", gen_length=16, block_length=16, entropy_threshold=0.2)
    result = evaluate_task(model, tok, task, config, n=200)
    assert result["accuracy"] >= card_accuracy - 0.01 and result["accuracy"] > base_accuracy, result
    assert result["mean_nfe"] <= card_nfe + 0.05, result


CAUSAL = DEFAULT_MODEL.parent / "tasks-qwen2-small"


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_causal_model_decodes_with_jacobi_forcing_preset_from_the_command_line():
    out = run_cli("generate", "--model", CAUSAL, "--preset", "jacobi-forcing", "--prompt", "reverse 4821=")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1284"


@pytest.mark.parametrize("task", ["copy", pytest.param("perm", marks=pytest.mark.slow)])
def test_causal_model_card(task):
    """AR (a window of one) and Jacobi decoding give the same answers: the card's 100 %."""
    model, tok = from_pretrained(CAUSAL), Tokenizer.from_pretrained(CAUSAL)
    results = [evaluate_task(model, tok, task, SamplerConfig.preset("jacobi", gen_length=16, window=n), n=60)
               for n in (1, 16)]
    assert [r["accuracy"] for r in results] == [1.0, 1.0], results
    assert results[0]["mean_nfe"] > results[1]["mean_nfe"]


JF = DEFAULT_MODEL.parent / "tasks-qwen2-small-jf"


@pytest.mark.parametrize("task,card_accuracy,card_nfe,base_nfe", [("sort", 1.0, 2.15, 5.62), ("copy", 1.0, 2.22, 5.14),
                                                                  ("reverse_long", 1.0, 2.31, 12.06)])
def test_jacobi_forcing_model_card(task, card_accuracy, card_nfe, base_nfe):
    """The card's Jacobi row on its 200 held-out prompts: the card's accuracy, in the card's number of
    forwards, far fewer than the base model needs with the same sampler (the card's base column)."""
    model, tok = from_pretrained(JF), Tokenizer.from_pretrained(JF)
    result = evaluate_task(model, tok, task, SamplerConfig.preset("jacobi", gen_length=32, window=16), n=200)
    assert result["accuracy"] >= card_accuracy - 0.005, result
    assert result["mean_nfe"] <= card_nfe + 0.02 and result["mean_nfe"] < base_nfe - 2, result
    assert result["answer_tokens_per_forward"] >= 3.0, result  # the target: >= 3 tokens per forward


CHAIN = DEFAULT_MODEL.parent / "chain-llada-tiny"
CHAIN_DISTILLED = DEFAULT_MODEL.parent / "chain-llada-tiny-dparallel"


@pytest.mark.slow  # three evaluations of 200 prompts: ~30 s
@pytest.mark.skipif(not (CHAIN_DISTILLED / "config.json").is_file(), reason="no shipped chain checkpoints")
def test_chain_models_match_their_cards():
    """The chain cards on their 200 held-out prompts: the base one token per step in blocks of 32
    (99.0 %, 64 forwards) and at its best training-free setting within a point of that (entropy
    0.45: 98.0 %, 9.40 forwards); the distilled model with the dParallel preset from its checkpoint
    defaults (one block, entropy 0.5) as accurate in about one forward, checked line by line."""
    one_step, best, fast = evaluate_in_a_fresh_process([  # a user's process: tests/support/fresh_eval.py
        {"model": CHAIN, "dtype": "float32", "task": "chain", "n": 200},
        {"model": CHAIN, "dtype": "float32", "task": "chain", "n": 200, "preset": "dparallel",
         "overrides": {"entropy_threshold": 0.45}},
        {"model": CHAIN_DISTILLED, "dtype": "float32", "task": "chain", "n": 200, "preset": "dparallel"}])
    assert one_step["accuracy"] >= 0.985 and one_step["mean_nfe"] == 64, one_step
    assert best["accuracy"] >= 0.975 and best["mean_nfe"] >= 9.3, best
    assert fast["accuracy"] >= one_step["accuracy"] - 0.01, fast
    assert fast["mean_nfe"] <= 1.2 and best["mean_nfe"] / fast["mean_nfe"] >= 2.5, (fast, best)


MOE = DEFAULT_MODEL.parent / "tasks-llada2-tiny"


@pytest.mark.skipif(not (MOE / "config.json").is_file(), reason="no shipped MoE checkpoint")
def test_the_shipped_moe_model_reverses_long_prompts_with_the_llada2_preset():
    """The card: every held-out reverse prompt right with `llada2` (40 of its 200), in at most two
    forwards each (the answer spans the block of the prompt's tail and the next)."""
    from jaxdllm import sampler_defaults

    model, tok = from_pretrained(MOE), Tokenizer.from_pretrained(MOE)
    assert model.config.experts.num_experts == 8 and model.config.checkpoint_format == "llada2"
    result = evaluate_task(model, tok, "reverse", sampler_defaults(MOE, "llada2"), n=40)
    assert result["accuracy"] == 1.0 and result["mean_nfe"] <= 2.0, result


@pytest.mark.slow  # six evaluations of 200 prompts
@pytest.mark.skipif(not (MOE / "config.json").is_file(), reason="no shipped MoE checkpoint")
def test_the_shipped_moe_model_matches_its_card():
    """The card's table: copy and reverse 100 % with the checkpoint's defaults (one token per step,
    stop after the EOS's block) and with `llada2`; `llada2.1` 41.0 % / 90.5 % (token editing on a
    model not trained to edit)."""
    card = {None: (1.0, 1.0, 15.71, 15.88), "llada2": (1.0, 1.0, 1.79, 1.35), "llada2.1": (0.41, 0.905, 14.88, 6.01)}
    results = iter(evaluate_in_a_fresh_process([  # a user's process: tests/support/fresh_eval.py
        {"model": MOE, "task": task, "n": 200, "preset": preset} for preset in card for task in ("copy", "reverse")]))
    for preset, (copy_acc, reverse_acc, copy_nfe, reverse_nfe) in card.items():
        copy, reverse = next(results), next(results)
        assert abs(copy["accuracy"] - copy_acc) <= 0.005 and abs(reverse["accuracy"] - reverse_acc) <= 0.005, (
            preset, copy, reverse)
        assert abs(copy["mean_nfe"] - copy_nfe) <= 0.01 and abs(reverse["mean_nfe"] - reverse_nfe) <= 0.01, (
            preset, copy, reverse)



DIFFUSIONGEMMA = DEFAULT_MODEL.parent / "tasks-diffusiongemma-tiny"


@pytest.mark.slow  # four evaluations of 200 prompts; the README's block decodes this model in the default run
@pytest.mark.skipif(not (DIFFUSIONGEMMA / "config.json").is_file(), reason="no shipped DiffusionGemma checkpoint")
def test_the_shipped_diffusiongemma_model_matches_its_card():
    """The card: copy and reverse 100 % with the checkpoint's defaults (DiffusionGemma's published,
    sampling sampler) in 2 forwards each (the stop's earliest), and in 1 with a budget of one step."""
    from jaxdllm import sampler_defaults

    model, tok = from_pretrained(DIFFUSIONGEMMA), Tokenizer.from_pretrained(DIFFUSIONGEMMA)
    assert model.config.gemma4 is not None and model.config.checkpoint_format == "diffusion_gemma"
    for overrides, nfe in (({}, 2.0), ({"max_denoising_steps": 1}, 1.0)):
        config = sampler_defaults(DIFFUSIONGEMMA, **overrides)
        for task in ("copy", "reverse"):
            result = evaluate_task(model, tok, task, config, n=200)
            assert result["accuracy"] == 1.0 and result["mean_nfe"] == nfe, (overrides, task, result)


SBD = DEFAULT_MODEL.parent / "tasks-qwen2-small-sbd"
SDAR = DEFAULT_MODEL.parent / "tasks-sdar-small"


@pytest.mark.skipif(not (SBD / "config.json").is_file(), reason="no shipped SBD checkpoint")
@pytest.mark.parametrize("task,preset,card_accuracy,card_tokens_per_forward", [
    ("reverse_long", "sbd", 1.0, 10.03),
    pytest.param("copy_long", "sbd-high", 0.98, 11.65, marks=pytest.mark.slow)])
def test_set_block_decoding_model_card(task, preset, card_accuracy, card_tokens_per_forward):
    """The card's rows on its 50 held-out prompts per task: the card's accuracy at the card's answer
    tokens per forward (its goal: at least 3 on the long tasks)."""
    model, tok = from_pretrained(SBD), Tokenizer.from_pretrained(SBD)
    result = evaluate_task(model, tok, task, SamplerConfig.preset(preset, gen_length=32), n=50, batch_size=50)
    assert result["accuracy"] >= card_accuracy - 0.005, result
    assert abs(result["answer_tokens_per_forward"] - card_tokens_per_forward) < 0.05, result


@pytest.mark.slow
@pytest.mark.skipif(not (SDAR / "config.json").is_file(), reason="no shipped SDAR checkpoint")
def test_sdar_model_card():
    """The SDAR card's reverse_long row: the 0.9 threshold's 92 % at 2.67 tokens per forward, one token
    per step's 100 % (the card's reason for missing its goal on the long tasks)."""
    model, tok = from_pretrained(SDAR), Tokenizer.from_pretrained(SDAR)
    fast, static = (evaluate_task(model, tok, "reverse_long", jaxdllm.sampler_defaults(SDAR, preset), n=50,
                                  batch_size=50) for preset in ("sdar", "sdar-static"))
    assert abs(fast["accuracy"] - 0.92) < 0.005 and abs(fast["answer_tokens_per_forward"] - 2.67) < 0.05, fast
    assert static["accuracy"] == 1.0, static
