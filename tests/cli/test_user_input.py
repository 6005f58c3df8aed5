"""Every input a user can give: wrong types, out-of-range values, unknown keys and empty inputs
are one line on stderr with exit code 2; training output folders cannot be shared by two runs;
the commands the README shows work as written."""

import dataclasses
import json
import textwrap
import time

import numpy as np
import pytest

from jaxdllm import SamplerConfig, from_pretrained, generate
from jaxdllm.cli import main, parse_sets
from jaxdllm.data import BatchConfig, DataError, JsonlConfig, read_jsonl
from jaxdllm.decoding.caches import CACHES
from jaxdllm.decoding.policies import POLICIES
from jaxdllm.errors import ConfigError
from jaxdllm.models.config import ModelConfig, RopeScaling
from jaxdllm.train import TrainConfig
from jaxdllm.train import config as recipe_lib
from jaxdllm.train.lora import LoraConfig
from jaxdllm.train.objectives import OBJECTIVES, make_objective

from support.cli import run_cli, start_cli
from support.llada_reference import make_llada_checkpoint

TINY_RECIPE = textwrap.dedent("""
    [model]
    preset = "tiny-llada"
    embed_dim = 32
    num_layers = 2
    num_heads = 2
    num_kv_heads = 2
    head_dim = 16
    mlp_dim = 64
    max_position = 64
    attention_impl = "xla"

    [data]
    examples_per_task = 200
    seq_len = 32
    batch_size = 16

    [train]
    steps = 4

    [checkpoint]
    every = 2

    [log]
    every = 1
    progress = false

    [mesh]
    data = 1
""")


def _write_recipe(tmp_path, extra: str = "", name: str = "recipe.toml"):
    path = tmp_path / name
    path.write_text(TINY_RECIPE + textwrap.dedent(extra))
    return path


def _cli(capsys, *argv):
    """Run the command line in this process: (exit code, stdout, stderr)."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def _run(*argv, timeout=300):
    """Run the command line as a user does, in a fresh process on one CPU device."""
    return run_cli(*argv, timeout=timeout)


def _one_line_error(rc, err, *needles):
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxdllm"), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


# -- every config dataclass: wrong types are ConfigError naming the setting ---------------------------

def _wrong_values(value):
    """Values of the wrong type for a field whose valid value is `value` (from its default)."""
    if isinstance(value, bool):
        return ["maybe", 2]
    if isinstance(value, (int, float)):
        return ["abc", [1]] + ([2.5, True] if isinstance(value, int) else [])
    if isinstance(value, str):
        return [3, ["x"]]
    if isinstance(value, tuple):
        return [5, [5]]
    return [[{"x": 1}]]  # an optional field (None default): a list of tables fits none of them


def _fields(instance):
    return [(f.name, getattr(instance, f.name)) for f in dataclasses.fields(instance)
            if f.init and not isinstance(getattr(instance, f.name), dict)]


VALID = {
    "ModelConfig": ModelConfig.preset("tiny-llada"),
    "RopeScaling": RopeScaling(type="llama3", factor=8.0),
    "DataSection": recipe_lib.DataSection(),
    "DistillSection": recipe_lib.DistillSection(),
    "OptimSection": recipe_lib.OptimSection(),
    "TrainSection": recipe_lib.TrainSection(),
    "CheckpointSection": recipe_lib.CheckpointSection(),
    "LogSection": recipe_lib.LogSection(),
    "MeshSection": recipe_lib.MeshSection(),
    "LoraConfig": LoraConfig(),
    "BatchConfig": BatchConfig(seq_len=32, batch_size=4),
    "JsonlConfig": JsonlConfig(),
}
CASES = [(cls, name, wrong) for cls, instance in VALID.items() for name, value in _fields(instance)
         for wrong in _wrong_values(value)]


@pytest.mark.parametrize("cls,name,wrong", CASES, ids=[f"{c}.{n}={w!r}" for c, n, w in CASES])
def test_config_dataclasses_check_types(cls, name, wrong):
    with pytest.raises(ConfigError, match=name):
        dataclasses.replace(VALID[cls], **{name: wrong})


def test_sampler_policy_cache_and_objective_settings_check_types():
    loop = SamplerConfig()
    for name in ("gen_length", "block_length", "steps", "temperature", "cfg_scale", "stop_at_eos",
                 "prompt_bucket", "max_trajectory"):
        for wrong in _wrong_values(getattr(loop, name)):
            with pytest.raises(ConfigError, match=name):
                SamplerConfig(**{name: wrong})
    checked = 0
    for registry, kind in ((POLICIES, "policy"), (CACHES, "cache")):
        for piece_name, cls in registry.items():
            default = cls()
            ids = {f.name for f in dataclasses.fields(default) if str(f.type) == "tuple[int, ...]"}
            for name, value in _fields(default):
                # a list of ints is a tuple of ids' spelling in a recipe; a list of strings fits none
                for wrong in ([5, ["x"]] if name in ids else _wrong_values(value)):
                    with pytest.raises(ConfigError, match=f"{kind} '{piece_name}': {name}"):
                        dataclasses.replace(default, **{name: wrong})
                    checked += 1
    for kind, cls in OBJECTIVES.items():
        for name, value in _fields(cls()):
            for wrong in _wrong_values(value):
                with pytest.raises(ConfigError, match=rf"\[objective\] {name}"):
                    make_objective(kind, {name: wrong})
                checked += 1
    assert checked > 20


def test_normalised_values():
    assert SamplerConfig(policy="threshold", threshold=1).threshold == 1.0
    assert recipe_lib.DataSection(tasks="copy").tasks == ("copy",)  # one task as a string
    assert recipe_lib.DataSection(tasks=["copy", "add"]).tasks == ("copy", "add")
    assert parse_sets(["data.tasks=copy,reverse", "train.steps=10"], sections=True) == {
        "data": {"tasks": ["copy", "reverse"]}, "train": {"steps": 10}}


def test_a_set_changes_one_key_of_a_recipes_sub_table():
    import argparse

    from jaxdllm.cli.common import recipe

    assert parse_sets(["model.experts.top_groups=1"], sections=True) == {"model": {"experts": {"top_groups": 1}}}
    args = argparse.Namespace(recipe="tasks_moe_cpu", set=["model.experts.top_groups=1"])
    experts = recipe(args).model.overrides["experts"]
    assert experts["top_groups"] == 1 and experts["num_experts"] == 8  # the rest of [model.experts] stays


def test_a_setting_of_another_policy_names_the_policy_to_choose():
    with pytest.raises(ConfigError, match=r"'threshold' is a setting of policy 'threshold'.*not of 'llada'"):
        SamplerConfig(threshold=0.9)


def test_model_section_keys_are_named():
    with pytest.raises(ConfigError, match=r"\[model\] has unknown key\(s\) \['num_layer'\]"):
        TrainConfig.from_dict({"model": {"preset": "tiny-llada", "num_layer": 2}})
    with pytest.raises(ConfigError, match=r"\[model\] embed_dim must be an integer, got '64'"):
        TrainConfig.from_dict({"model": {"preset": "tiny-llada", "embed_dim": "64"}})
    with pytest.raises(ConfigError, match=r"\[model\] has unknown key\(s\) \['num_layers'\]"):
        TrainConfig.from_dict({"model": {"init_from": "ckpt", "num_layers": 2}})  # the checkpoint fixes it


# -- the command line: one line on stderr, exit 2 ---------------------------------------------------

GENERATE_ERRORS = [
    (["--set", "threshold=abc", "--preset", "fast-dllm-parallel"], "threshold must be a number, got 'abc'"),
    (["--set", "cfg_scale=yes"], "cfg_scale must be a number, got 'yes'"),
    (["--set", "stop_at_eos=maybe"], "stop_at_eos must be true or false or one of 'block', got 'maybe'"),
    (["--set", "gen_length=16.5"], "gen_length must be an integer"),
    (["--threshold", "0.9"], "not of 'llada'"),
    (["--preset", "fast-dllm-parallel", "--threshold", "1.5"], "threshold must be in (0, 1]"),
    (["--gen-length", "-16"], "gen_length must be a positive integer"),
    (["--set", "bogus=1"], "unknown sampler option(s) ['bogus']"),
    (["--set", ""], "--set expects KEY=VALUE"),
    (["--steps", "abc"], "invalid int value: 'abc'"),
]


@pytest.mark.parametrize("args,needle", GENERATE_ERRORS, ids=[" ".join(a) for a, _ in GENERATE_ERRORS])
def test_generate_bad_input(capsys, args, needle):
    _one_line_error(*_cli(capsys, "generate", "--prompt", "copy 12=", *args)[::2], needle)


def test_empty_prompt(capsys):
    _one_line_error(*_cli(capsys, "generate", "--prompt", "")[::2], "--prompt is empty")
    _one_line_error(*_cli(capsys, "generate", "--prompt", "  ")[::2], "--prompt is empty")


@pytest.mark.parametrize("extra,args,needle", [
    ("", ["--set", "train.steps=abc"], "[train] steps must be an integer, got 'abc'"),
    ("", ["--set", "train.steps=10.5"], "[train] steps must be an integer, got 10.5"),
    ("", ["--set", "optim.lr=abc"], "[optim] lr must be a number, got 'abc'"),
    ("", ["--set", "optim.lr=-1"], "[optim] lr must be positive"),
    ("", ["--set", "model.num_layer=2"], "[model] has unknown key(s) ['num_layer']"),
    ("", ["--set", "model.embed_dimm=64"], "[model] has unknown key(s) ['embed_dimm']"),
    ("", ["--set", "data.tasks=copy,nope"], "unknown task 'nope'"),
    ("", ["--set", "mesh.data=0"], "[mesh] data must be a positive integer or -1"),
    ("", ["--set", "mesh.data=3"], "needs 3 devices, but this job has 8"),
    ("", ["--set", "lora.rank=-1"], "lora.rank must be a non-negative integer"),
    ("", ["--set", "bogus.x=1"], "unknown recipe section(s) ['bogus']"),
    ("", ["--set", "train.bogus=1"], "[train] has unknown key(s) ['bogus']"),
    ("", ["--steps", "0"], "--steps must be a positive integer, got 0"),
    ("", ["--steps", "-5"], "--steps must be a positive integer, got -5"),
    ("", ["--steps", "ten"], "invalid int value: 'ten'"),
    ("[train]\nsteps = \"1000\"\n", [], "[train] steps must be an integer, got '1000'"),
    ("[objective]\nkind = \"mdm_sft\"\neps = \"small\"\n", [], "[objective] eps must be a number"),
])
def test_train_bad_input(capsys, tmp_path, extra, args, needle):
    raw = TINY_RECIPE.replace("[train]\nsteps = 4\n", "") if "[train]" in extra else TINY_RECIPE
    recipe = tmp_path / "r.toml"
    recipe.write_text(raw + extra)
    _one_line_error(*_cli(capsys, "train", recipe, "--workdir", tmp_path / "run", *args)[::2], needle)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_train_empty_or_missing_recipe(capsys, tmp_path):
    (tmp_path / "empty.toml").write_text("")
    _one_line_error(*_cli(capsys, "train", tmp_path / "empty.toml")[::2], "needs a [model] section")
    _one_line_error(*_cli(capsys, "train", tmp_path / "nope.toml")[::2], "does not exist")


@pytest.mark.parametrize("extra,args,needle", [
    ("", [], "has no [distill] section"),
    ("[distill]\ntasks = [\"copy\"]\n", [], "[distill] teacher is not set"),
    ("[distill]\nteacher = \"nowhere\"\n", [], "checkpoint directory nowhere does not exist"),
    ("[distill]\npreset = \"nope\"\n", [], "unknown sampler preset 'nope'"),
    ("[distill]\nsampler = { bogus = 1 }\n", [], "[distill] sampler has unknown key(s) ['bogus']"),
    ("[distill]\nsampler = { threshold = 0.9 }\n", [], "not of 'llada'"),
    ("[distill]\nbatch_size = 0\n", [], "[distill] batch_size must be a positive integer"),
    ("[distill]\nsource = \"jsonl\"\n", [], "[distill] source = 'jsonl' needs files"),
    ("[distill]\nout = \" \"\n", [], "[distill] out is empty"),
    ("[distill]\ntasks = []\n", [], "[distill] tasks is empty"),
    ("[distill]\n", ["--set", "distill.tasks=copy,nope"], "unknown task 'nope'"),
    ("[distill]\n", ["--set", "distill.examples_per_task=abc"], "[distill] examples_per_task must be an integer"),
    ("[data]\nsource = \"teacher\"\n", [], "[data] source = 'teacher' needs path"),
])
def test_distill_bad_input(capsys, tmp_path, extra, args, needle):
    raw = TINY_RECIPE
    if "[data]" in extra:
        raw = raw.replace("[data]\n", "[data]\nsource = \"teacher\"\n")
        extra = ""
    recipe = tmp_path / "r.toml"
    recipe.write_text(raw + extra)
    _one_line_error(*_cli(capsys, "distill", "generate", recipe, *args)[::2], needle)


def test_eval_bad_input(capsys, tmp_path):
    _one_line_error(*_cli(capsys, "eval", "--tasks", "copy,nope")[::2], "unknown task 'nope'")
    _one_line_error(*_cli(capsys, "eval", "--tasks", "")[::2], "--tasks is empty")
    _one_line_error(*_cli(capsys, "eval", "--n", "0")[::2], "--n must be a positive integer")
    _one_line_error(*_cli(capsys, "eval", "--model", tmp_path)[::2], "config.json is missing")
    _one_line_error(*_cli(capsys, "eval", "--set", "threshold=0.5")[::2], "--set and --sweep need --preset")
    _one_line_error(*_cli(capsys, "eval", "--sweep", "threshold=0.5,0.9")[::2], "need --preset")
    _one_line_error(*_cli(capsys, "eval", "--preset", "fast-dllm-parallel", "--sweep", "threshold=0.5,0.9",
                          "--set", "threshold=0.7")[::2], "threshold is both set (--set) and swept")
    _one_line_error(*_cli(capsys, "eval", "--preset", "fast-dllm-parallel", "--sweep", "treshold=0.5,0.9")[::2],
                    "unknown sampler option(s) ['treshold']")
    _one_line_error(*_cli(capsys, "eval", "--preset", "fast-dllm-parallel", "--sweep", "threshold=2,0.9")[::2],
                    "threshold")
    _one_line_error(*_cli(capsys, "eval", "--out", tmp_path / "r.json")[::2], "--out is a directory")
    _one_line_error(*_cli(capsys, "eval", "--n", "all")[::2], "--n all only applies to GSM8K")
    _one_line_error(*_cli(capsys, "eval", "--n", "ten")[::2], "--n must be a positive integer")
    _one_line_error(*_cli(capsys, "eval", "--tasks", "gsm8k", "--shots", "9", "--gsm8k-dir", tmp_path)[::2], "only 8 are shipped")
    _one_line_error(*_cli(capsys, "eval", "--batch-size", "0")[::2], "--batch-size must be a positive integer")


def test_eval_runs_on_the_shipped_model(capsys, tmp_path):
    rc, out, err = _cli(capsys, "eval", "--tasks", "reverse", "--n", "8", "--preset", "fast-dllm-parallel",
                        "--out", tmp_path, "--no-progress")
    assert rc == 0, err
    result = json.loads((tmp_path / "eval.json").read_text())["results"]["fast-dllm-parallel"]["reverse"]
    assert result["n"] == 8 and result["accuracy"] >= 0.75
    assert result["timing"]["tokens_per_s"] > 0 and (tmp_path / "pareto.png").stat().st_size > 1000


def test_inspect_checks_tensors_without_loading(capsys, tmp_path):
    make_llada_checkpoint(tmp_path)
    rc, out, err = _cli(capsys, "inspect", tmp_path)
    assert rc == 0, err
    assert json.loads(out)["checked"]["tensors"] > 0
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated, as by an interrupted copy
    _one_line_error(*_cli(capsys, "inspect", tmp_path)[::2], "model.safetensors")


def test_convert_bad_input(capsys, tmp_path):
    _one_line_error(*_cli(capsys, "convert", tmp_path / "nope", tmp_path / "out")[::2], "nope")
    make_llada_checkpoint(tmp_path / "src")
    for size in ("abc", "0", "-1GB"):
        _one_line_error(*_cli(capsys, "convert", tmp_path / "src", tmp_path / "out", f"--max-shard-size={size}")[::2],
                        f"max_shard_size must be a positive size such as 5GB or 500MiB, got '{size}'")
    _one_line_error(*_cli(capsys, "convert", tmp_path / "src", tmp_path / "out", "--dtype", "float8")[::2],
                    "invalid choice: 'float8'")
    assert not (tmp_path / "out").exists()


def test_empty_jsonl_is_named(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match=r"empty\.jsonl holds no records: it is empty"):
        read_jsonl(tmp_path / "empty.jsonl")


# -- prompts that fit are never refused -------------------------------------------------------------

def test_prompt_padding_never_refuses_a_prompt_that_fits(tmp_path):
    make_llada_checkpoint(tmp_path, head_scale=15.0, max_sequence_length=64)
    model = from_pretrained(tmp_path)
    prompt = np.random.default_rng(0).integers(0, 100, (1, 37)).astype(np.int32)
    config = SamplerConfig(gen_length=16, block_length=16, steps=16)  # prompt_bucket 32: 64 + 16 > 64
    out = generate(model, prompt, config)
    unpadded = generate(model, prompt, config.replace(prompt_bucket=1))
    np.testing.assert_array_equal(out.tokens, unpadded.tokens)
    assert out.tokens.shape == (1, 37 + 16)
    with pytest.raises(ConfigError, match=r"lower gen_length to at most 27.*prompt_bucket"):
        generate(model, prompt, SamplerConfig(gen_length=32, block_length=32, steps=32))


# -- training runs: the README's pair, --steps, a complete run, JSONL warnings, the folder lock ----

@pytest.mark.slow  # ~13 s: a training run, then generate
def test_trained_model_generates_with_its_own_sampler_defaults(tmp_path):
    """The README's training pair: train + export, then generate from the export with no flags."""
    recipe = _write_recipe(tmp_path)
    out = _run("train", recipe, "--workdir", tmp_path / "run", "--export", tmp_path / "run" / "model")
    assert out.returncode == 0, out.stderr
    model_dir = tmp_path / "run" / "model"
    assert json.loads((model_dir / "jaxdllm_sampler.json").read_text())["gen_length"] == 16
    out = _run("generate", "--model", model_dir, "--prompt", "copy 2718=")
    assert out.returncode == 0, out.stderr
    assert "answer tokens of 16" in out.stderr
    out = _run("convert", model_dir, tmp_path / "converted")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "converted" / "jaxdllm_sampler.json").read_text() == \
        (model_dir / "jaxdllm_sampler.json").read_text()


@pytest.mark.slow  # fresh training processes: ~15 s
def test_steps_behind_or_at_the_run(tmp_path):
    bad = tmp_path / "data.jsonl"
    bad.write_text('{"prompt": "copy 12=", "response": "12"}\nnot json\n' * 20)
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(TINY_RECIPE.replace("examples_per_task = 200",
                                          f'source = "jsonl"\npath = "{bad}"\non_error = "skip"'))
    run = tmp_path / "run"
    out = _run("train", recipe, "--workdir", run)
    assert out.returncode == 0, out.stderr
    warning = [line for line in out.stderr.splitlines() if "malformed" in line]
    assert warning == [f"jaxdllm train: warning: {bad}: skipped 20 malformed line(s) (lines 2, 4, 6, 8, 10, ...); "
                       "first: invalid JSON (Expecting value at column 1)"], out.stderr
    assert "UserWarning" not in out.stderr
    out = _run("train", recipe, "--workdir", run, "--steps", "2", "--export", tmp_path / "model")
    assert out.returncode == 2 and "already at step 4, past 2" in out.stderr, out.stderr
    assert not (tmp_path / "model").exists()
    out = _run("train", recipe, "--workdir", run, "--export", tmp_path / "model")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("already complete (step 4)") == 1 and "resumed" not in out.stdout, out.stdout
    assert "exported" in out.stdout and (tmp_path / "model" / "config.json").is_file()
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


@pytest.mark.slow  # fresh training processes: ~15 s
def test_two_runs_on_one_folder(tmp_path):
    """The second run refuses (exit 2, naming the first); the first finishes intact and resumable."""
    recipe = _write_recipe(tmp_path)
    recipe.write_text(TINY_RECIPE.replace("steps = 4", "steps = 400").replace("every = 2", "every = 100")
                      .replace("[log]\nevery = 1", "[log]\nevery = 20"))
    run = tmp_path / "run"
    first = start_cli("train", recipe, "--workdir", run)
    lock = run / ".jaxdllm-train.lock"
    deadline = time.time() + 120
    while not (lock.is_file() and str(first.pid) in lock.read_text()) and time.time() < deadline:
        time.sleep(0.2)
    second = _run("train", recipe, "--workdir", run)
    still_running = first.poll() is None
    _, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err
    assert still_running, "the first run ended before the second started: make it longer"
    _one_line_error(second.returncode, second.stderr, "in use by another training run", f"pid {first.pid}")
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(20, 401, 20))
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == [300, 400]
    again = _run("train", recipe, "--workdir", run)  # the lock went with the first process
    assert again.returncode == 0 and "already complete (step 400)" in again.stdout, again.stderr
