"""The Python path as a user meets it: shipped checkpoints and recipes by name from any folder, the
checkpoint's sampler defaults, presets at any length, text in and text out, and missing extras.

Expected answers come from the task checkers and the shipped model cards, not from the code under
test; the left-padding layout is spelled out by hand.
"""

import dataclasses
import json
import sys

import numpy as np
import pytest

import jaxdllm
from jaxdllm import SamplerConfig
from jaxdllm.data import get_task
from jaxdllm.decoding import SAMPLER_PRESETS
from jaxdllm.errors import CheckpointError, ConfigError
from jaxdllm.extras import MissingExtraError, require
from support.cli import run_cli

SHIPPED = ["tasks-llada-small", "tasks-llada-small-dparallel", "tasks-qwen2-small", "tasks-qwen2-small-jf"]
pytestmark = pytest.mark.skipif(not (jaxdllm.checkpoint_dir(SHIPPED[0]) / "config.json").is_file(),
                                reason="no shipped checkpoints (a source checkout has them)")
PROMPTS = {"reverse": "reverse 4821=", "sort": "sort 93715=", "copy": "copy 2718="}  # the README's, with its answers
ANSWERS = ["1284", "13579", "2718"]


@pytest.fixture(scope="module")
def llada():
    return jaxdllm.load("tasks-llada-small", dtype="float32")


@pytest.fixture(scope="module")
def qwen():
    return jaxdllm.load("tasks-qwen2-small-jf")


# -------------------------------------------------------------------------------- names, from anywhere

def test_shipped_names_resolve_from_an_unrelated_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in SHIPPED:
        for spelling in (name, f"checkpoints/{name}"):
            assert (jaxdllm.checkpoint_dir(spelling) / "config.json").is_file(), spelling
    model, tok, defaults = jaxdllm.load("tasks-llada-small")
    assert model.config.max_position == 64 and tok.vocab_size == model.config.vocab_size
    assert isinstance(defaults, SamplerConfig)
    assert jaxdllm.recipe_path("tasks_tiny_cpu").name == "tasks_tiny_cpu.toml"
    assert jaxdllm.recipe_path("training/tasks_tiny_cpu.toml") == jaxdllm.recipe_path("tasks_tiny_cpu.toml")
    from jaxdllm.train import TrainConfig

    assert TrainConfig.from_toml("dparallel_tasks_tiny_cpu").model.init_from == "checkpoints/tasks-llada-small"


def test_an_existing_folder_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tasks-llada-small").mkdir()
    assert jaxdllm.checkpoint_dir("tasks-llada-small") == tmp_path.joinpath("tasks-llada-small").relative_to(tmp_path)
    with pytest.raises(CheckpointError, match="config.json is missing"):
        jaxdllm.load("tasks-llada-small")


def test_unknown_names_list_what_is_shipped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist.*tasks-llada-small, tasks-llada-small-dparallel"):
        jaxdllm.load("tasks-llada-large")
    with pytest.raises(ConfigError, match="not a shipped recipe.*tasks_tiny_cpu"):
        jaxdllm.recipe_path("tasks_huge_cpu")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CheckpointError, match="is a file"):
        jaxdllm.from_pretrained(tmp_path / "file.txt")


# -------------------------------------------------------------------------------- checkpoint defaults

def test_defaults_come_from_the_checkpoint(llada, qwen):
    _, _, defaults = llada
    on_disk = json.loads((jaxdllm.checkpoint_dir("tasks-llada-small") / "jaxdllm_sampler.json").read_text())
    assert (defaults.gen_length, defaults.block_length, defaults.steps) == \
        (on_disk["gen_length"], on_disk["block_length"], on_disk["steps"])
    assert defaults.policy.name == "llada" and defaults.cache.name == "none"
    _, _, causal = qwen
    assert causal.policy.name == "jacobi" and causal.stop_at_eos  # a causal model: Jacobi, no flag needed
    assert (causal.gen_length, causal.window) == (32, 16)  # the card's Jacobi window
    # another preset leaves out the checkpoint's settings of Jacobi (its window) and of a diffusion block
    assert jaxdllm.sampler_defaults("tasks-qwen2-small", "lookahead").block_length == 128
    assert jaxdllm.sampler_defaults("tasks-llada-small", "fast-dllm-dual").cache.name == "dual"


def test_a_new_length_rescales_the_checkpoint_settings():
    config = jaxdllm.sampler_defaults("tasks-llada-small", gen_length=8)
    assert (config.gen_length, config.block_length, config.steps) == (8, 8, 8)  # one block, one token per step
    config = jaxdllm.sampler_defaults("tasks-llada-small", "llada", gen_length=32, block_length=8)
    assert (config.block_length, config.steps) == (8, 32)


def test_a_checkpoint_without_defaults_gets_a_length_that_fits(tmp_path):
    import shutil

    copy = shutil.copytree(jaxdllm.checkpoint_dir("tasks-llada-small"), tmp_path / "model")
    (copy / "jaxdllm_sampler.json").unlink()
    config = jaxdllm.sampler_defaults(copy)  # max_position 64: the presets' 256 tokens cannot fit
    assert config.gen_length == 32 and config.gen_length % config.block_length == 0 and config.steps <= 32


def test_eval_settings_rescale_a_new_length_however_it_is_given():
    from jaxdllm.cli import build_parser
    from jaxdllm.cli.eval_command import samplers

    model_dir = jaxdllm.checkpoint_dir("tasks-llada-small")
    shapes = []
    for flags in (["--gen-length", "32"], ["--set", "gen_length=32"], ["--sweep", "gen_length=8,32"]):
        args = build_parser().parse_args(["eval", "--preset", "llada", *flags])
        shapes.append({k: (c.gen_length, c.block_length, c.steps) for k, c in samplers(args, model_dir).items()})
    assert list(shapes[0].values()) == list(shapes[1].values()) == [(32, 32, 32)]  # one block, one token per step
    assert list(shapes[2].values()) == [(8, 8, 8), (32, 32, 32)]


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_the_default_model_is_the_shipped_one_whatever_the_working_folder_holds(tmp_path):
    (tmp_path / "tasks-llada-small").mkdir()  # a folder of the same name where the command runs
    out = run_cli("generate", "--prompt", "reverse 4821=", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "1284", out.stderr


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_the_command_line_decodes_a_causal_checkpoint_with_jacobi_without_flags(tmp_path):
    out = run_cli("generate", "--model", "tasks-qwen2-small-jf", "--prompt", "reverse 3141592653589=", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "9853562951413"  # the card's task: the reversed digits
    assert "[nfe 2 " in out.stderr  # the card's Jacobi Forcing speed: the whole answer in two forwards


# -------------------------------------------------------------------------------- presets at any length

@pytest.mark.parametrize("gen", [16, 24, 48, 100, 256])
def test_every_preset_rescales_to_a_coherent_config(gen):
    for name, published in SAMPLER_PRESETS.items():
        config = SamplerConfig.preset(name, gen_length=gen)
        resized = dataclasses.replace(published.policy, **published.policy.resized_settings(published.gen_length, gen))
        assert config.gen_length == gen and config.policy == resized and config.cache == published.cache
        if not config.canvas.diffusion_blocks:  # no block: the loop's default stays; a Jacobi window at most G
            assert config.block_length == published.block_length
            assert getattr(config.policy, "window", gen) == min(getattr(published.policy, "window", gen), gen)
            continue
        assert gen % config.block_length == 0 and config.block_length <= max(published.block_length, gen)
        if published.block_length == published.gen_length:
            assert config.block_length == gen  # a one-block preset stays one block
        if published.policy.scheduled:
            assert config.steps == gen  # the published one token per step
        assert config.steps % config.num_blocks == 0


def test_resizing_keeps_a_jacobi_window_and_a_checkpoints_one_block():
    jacobi = SamplerConfig.preset("jacobi", gen_length=8)  # window 8 == G
    assert jacobi.resized(64).window == 8  # the draft window stays; it is not a canvas block
    one_block = SamplerConfig.preset("llada", gen_length=16)
    assert (one_block.resized(64).block_length, one_block.resized(64).steps) == (64, 64)
    assert SamplerConfig.preset("llada").resized(64).block_length == 32  # the published block


def test_an_incoherent_combination_names_the_setting_to_pass():
    # a bidirectional model decodes whole blocks (a block-causal one decodes any gen_length)
    partial_blocks = SamplerConfig.preset("llada", gen_length=20, block_length=8)
    with pytest.raises(ConfigError, match=r"pass block_length= one of \[1, 2, 4, 5, 10, 20\]"):
        partial_blocks.canvas.check_model(jaxdllm.ModelConfig.preset("tiny-llada"), partial_blocks)
    partial_blocks.canvas.check_model(jaxdllm.ModelConfig.preset("tiny-block-diffusion"), partial_blocks)
    with pytest.raises(ConfigError, match="pass steps=4"):
        SamplerConfig.preset("llada", gen_length=16, block_length=4, steps=7)
    with pytest.raises(ConfigError, match="pass steps=16 or fewer"):
        SamplerConfig.preset("llada", gen_length=16, steps=32)
    with pytest.raises(ConfigError, match="pass steps=16$"):  # a suggestion that is itself valid
        SamplerConfig.preset("llada", gen_length=16, block_length=4, steps=30)


def _valid(tok, out, prompts):
    return [get_task(task).check(prompt, answer) for (task, prompt), answer in zip(prompts.items(), tok.answers(out))]


# canvases that decode only models trained for them -> the shipped model of each
OWN_MODEL = {"wedlm_canvas": "tasks-qwen2-small-wedlm", "assd_canvas": "tasks-xlnet-small"}


def _multiverse(preset):
    """The Multiverse model on its task, greedy: it forks into one path per list, path k labelled k, and
    the README's prompt is answered right."""
    from jaxdllm.data.parts_task import PartsTask

    prompts = ["par rev rot swp: 1=314 2=520 3=761=", "par rot swp rev: 1=908 2=123 3=456 4=777=",
               "par swp rev rot: 1=640 2=215 3=102="]
    model, tok, _ = jaxdllm.load("tasks-qwen2-small-multiverse")
    config = jaxdllm.sampler_defaults("tasks-qwen2-small-multiverse", preset, temperature=0.0)
    batch = tok(prompts)
    out = jaxdllm.generate(model, batch.ids, config, attention_mask=batch.mask)
    answers = tok.answers(out)
    for prompt, answer in zip(prompts, answers):
        lists = prompt.count("=") - 1
        assert answer.count("<Outline>") == lists and answer.count("<Path>") == lists, answer
        assert all(f"<Path>{k}:" in answer for k in range(1, lists + 1)), answer
    assert PartsTask().check(prompts[0], answers[0]), (preset, answers[0])


def _hogwild(preset):
    """Two workers of the causal model in a compact format (its 96 positions): each writes its first step."""
    from jaxdllm.decoding.hogwild_run import hogwild_generate
    from jaxdllm.decoding.hogwild_text import HogwildFormat, settings_for

    model, tok, _ = jaxdllm.load("tasks-qwen2-small")
    fmt = HogwildFormat(template="{problem}", past_steps="", others_header="|", own_header="|",
                        step_header="{name}{k}:", names=("A", "B"), greetings=("", ""), check_text="?",
                        finisher_text="=", finisher_tokens=8)
    config = SamplerConfig.preset(preset, gen_length=48, **settings_for(tok, fmt))
    for text in hogwild_generate(model, tok, list(PROMPTS.values()), config, fmt):
        assert text.startswith("A1:") and "B1:" in text, text


def _genmol(preset):
    """GenMol's presets on the diffusion model, their noise and guidance off (T 0, r 0: LLaDA's one-token
    low-confidence order over one block): the README's answers. Their sampling on molecules:
    tests/decoding/test_genmol_sampler.py."""
    model, tok, defaults = jaxdllm.load("tasks-llada-small")
    config = SamplerConfig.preset(preset, gen_length=defaults.gen_length, temperature=0.0, randomness=0.0,
                                  guidance_gamma=0.0)
    batch = tok(list(PROMPTS.values()))
    assert tok.answers(jaxdllm.generate(model, batch.ids, config, attention_mask=batch.mask)) == ANSWERS, preset


# canvases whose models are prompted in their own format -> a check of that
OWN_FORMAT = {"multiverse_canvas": _multiverse, "hogwild_canvas": _hogwild, "genmol_canvas": _genmol}


@pytest.mark.slow  # every preset compiles its loop: ~20 s
def test_every_preset_decodes_a_shipped_model_at_its_length(llada, qwen):
    """Each preset, rescaled to the checkpoint's length (16 tokens for the diffusion model, 32 for
    the causal one), decodes the README's single-answer prompts to their right answers (one-answer
    tasks: every sampler of the cards gets them)."""
    for name, published in SAMPLER_PRESETS.items():
        if published.policy.canvas == "uniform_canvas":  # DiffusionGemma's: its own shipped model
            model, tok, defaults = jaxdllm.load("tasks-diffusiongemma-tiny")
            out = jaxdllm.generate(model, tok(list(PROMPTS.values())), SamplerConfig.preset(
                name, gen_length=defaults.gen_length, block_length=defaults.block_length))
            assert tok.answers(out)[::2] == ANSWERS[::2], name  # it knows copy and reverse, not sort
            continue
        if published.policy.canvas in OWN_FORMAT:  # prompted in the format its model writes
            OWN_FORMAT[published.policy.canvas](name)
            continue
        diffusion = published.policy.canvas in ("masked_canvas", "freedave_canvas", "apd_canvas")
        model, tok, defaults = llada if diffusion else qwen
        if published.policy.canvas in OWN_MODEL:  # a canvas for models trained for it: its shipped one
            model, tok, defaults = jaxdllm.load(OWN_MODEL[published.policy.canvas])
        served = published.cache.attentions
        if diffusion and "bidirectional" not in served:  # the cache serves another kind of model: its shipped one
            model, tok, defaults = jaxdllm.load("tasks-qwen2-small-sbd" if "causal" in served else "tasks-sdar-small")
        batch = tok(list(PROMPTS.values()))
        config = SamplerConfig.preset(name, gen_length=defaults.gen_length)
        if config.policy.name == "token_editing":
            # LLaDA2.1's edits need a model trained to edit; this one was trained on masked positions
            # only, and left to edit until its EOS's block is finished (the published finish, checked
            # in tests/decoding/test_published_block_layout.py) it changes right answers: stop at EOS.
            config = config.replace(stop_at_eos=True)
        # a policy with parameters of its own (learn2pd) reads them from beside the checkpoint
        params = jaxdllm.policy_params("tasks-llada-small" if diffusion else "tasks-qwen2-small", config)
        out = jaxdllm.generate(model, batch.ids, config, attention_mask=batch.mask, policy_params=params)
        assert tok.answers(out) == ANSWERS, name


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_cached_presets_are_flagged_where_the_card_measured_them_failing(llada):
    """The card's finding: on the one-block canvas the approximate caches repeat digits on the
    many-answer tasks. Both cached presets must be flagged, and the flag must be true here."""
    model, tok, defaults = llada
    path = jaxdllm.checkpoint_dir("tasks-llada-small")
    prompts = {"perm": "perm 4971305=", "pick3": "pick 3 from 31425="}
    batch = tok(list(prompts.values()))
    uncached = jaxdllm.generate(model, batch.ids, SamplerConfig.preset("fast-dllm-parallel", gen_length=16),
                                attention_mask=batch.mask)
    assert all(_valid(tok, uncached, prompts))
    for name in ("fast-dllm-prefix", "fast-dllm-dual"):
        config = SamplerConfig.preset(name, gen_length=16)
        note = jaxdllm.pretrained.cache_note(path, config)
        assert note and "perm 7 %" in note
        out = jaxdllm.generate(model, batch.ids, config, attention_mask=batch.mask)
        assert not any(_valid(tok, out, prompts)), tok.answers(out)  # '3333333' and '222', as in the card
    assert jaxdllm.pretrained.cache_note(path, SamplerConfig.preset("fast-dllm-parallel", gen_length=16)) is None
    refreshed = SamplerConfig.preset("fast-dllm-dual", gen_length=16, cache_refresh_every_step=True)
    assert jaxdllm.pretrained.cache_note(path, refreshed) is None  # exact again: nothing to warn about


@pytest.mark.slow  # two fresh processes
def test_generate_and_eval_warn_on_a_flagged_cache(tmp_path):
    out = run_cli("generate", "--preset", "fast-dllm-dual", "--prompt", "copy 2718=", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "2718", out.stderr
    assert "warning: cache 'dual' on tasks-llada-small: an approximation that fails here" in out.stderr
    out = run_cli("eval", "--preset", "fast-dllm-prefix", "--tasks", "copy", "--n", "4", "--no-progress",
                  "--out", tmp_path / "ev", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "warning: cache 'prefix' on tasks-llada-small" in out.stderr and "Traceback" not in out.stderr


# -------------------------------------------------------------------------------- text in, text out

def test_batch_tokenising_left_pads_with_a_mask(llada):
    _, tok, _ = llada
    texts = ["sort 93715=", "copy 2718=", "123+456="]
    rows = [tok.encode(t) for t in texts]
    batch = tok(texts)
    width = max(map(len, rows))
    assert batch.ids.shape == batch.mask.shape == (3, width) and batch.ids.dtype == np.int32
    for row, ids, mask in zip(rows, batch.ids, batch.mask):
        pad = width - len(row)
        assert ids[pad:].tolist() == row and mask.tolist() == [0] * pad + [1] * len(row)
        assert set(ids[:pad].tolist()) <= {tok.token_to_id("<pad>")}
    right = tok(texts, padding_side="right")
    assert [r[:m.sum()].tolist() for r, m in zip(right.ids, right.mask)] == rows
    assert np.array_equal(batch.input_ids, batch.ids) and np.array_equal(batch.attention_mask, batch.mask)
    assert tok("copy 2718=").ids.shape == (1, len(tok.encode("copy 2718=")))


def test_answers_stop_at_the_first_eos_and_drop_filler_and_padding(llada):
    model, tok, _ = llada
    eos = model.config.eos_token_id
    digits = tok.encode("1284", add_special_tokens=False)
    generated = np.array([digits + [eos] * 4 + tok.encode("99", add_special_tokens=False),
                          [eos] * 10], np.int32)
    assert tok.answers(generated) == ["1284", ""]
    prompt = np.zeros((2, 3), np.int32)
    assert tok.answers(np.concatenate([prompt, generated], 1), prompt_len=3) == ["1284", ""]
    assert tok.batch_decode(generated[:1])[0].startswith("1284")


def test_text_round_trip_through_the_sampler(llada, qwen):
    model, tok, defaults = llada
    batch = tok(list(PROMPTS.values()))
    out = jaxdllm.generate(model, batch.ids, defaults.replace(policy="threshold", threshold=0.9),
                           attention_mask=batch.mask)
    assert out.prompt_len == batch.ids.shape[1] and out.generated.shape == (3, defaults.gen_length)
    assert tok.answers(out) == ANSWERS
    whole = jaxdllm.generate(model, batch, defaults.replace(policy="threshold", threshold=0.9))  # the batch as is
    assert np.array_equal(whole.tokens, out.tokens)
    model, tok, defaults = qwen
    batch = tok(list(PROMPTS.values()) + ["reverse 3141592653589="])
    out = jaxdllm.generate(model, batch.ids, defaults, attention_mask=batch.mask)
    assert tok.answers(out) == ANSWERS + ["9853562951413"]


# -------------------------------------------------------------------------------- extras

def test_a_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if lm-eval were not installed
    with pytest.raises(MissingExtraError, match=r'pip install -e "\.\[eval\]"'):
        require("lm_eval", "eval", "jaxdllm-lm-eval")
    from jaxdllm.eval import lm_eval_cli

    with pytest.raises(SystemExit) as exit_info:
        lm_eval_cli.main(["ls"])
    message = str(exit_info.value.code)
    assert message.startswith("jaxdllm-lm-eval: error:") and "[eval]" in message and "\n" not in message
