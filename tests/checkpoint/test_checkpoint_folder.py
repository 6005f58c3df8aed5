"""A checkpoint is read once: `Checkpoint` (jaxdllm/checkpoint/folder.py) finds the folder once,
parses config.json once and each side file once, and every loader takes it in place of a path. The
command line opens the checkpoint once and hands it down: one `jaxdllm generate` (run in this
process) finds each folder once and parses each config.json once, the second model's included."""

import collections
import json
import pathlib
import re
import shutil
import sys

import pytest

import jaxdllm
import jaxdllm.checkpoint.hf_config as hf_config
import jaxdllm.cli
import jaxdllm.shipped as shipped
from jaxdllm.checkpoint.folder import (COMPANIONS_FILE, FILTER_FILE, HEADS_FILE, SAMPLER_DEFAULTS_FILE, Checkpoint,
                                       read_cache_notes, read_sampler_defaults)
from jaxdllm.errors import CheckpointError, ConfigError

LLADA = shipped.checkpoint_dir("tasks-llada-small")
QWEN = shipped.checkpoint_dir("tasks-qwen2-small")

pytestmark = pytest.mark.skipif(not (LLADA / "config.json").is_file() or not (QWEN / "config.json").is_file(),
                                reason="the shipped checkpoints come with a source checkout")


class Reads:
    """Counts, per folder, `checkpoint_dir` (finding a folder), `read_config_json` (parsing its
    config.json) and the reads of each file by name, wherever jaxdllm holds those functions."""

    def __init__(self, monkeypatch):
        self.found, self.parsed, self.files = (collections.Counter() for _ in range(3))
        self._spy(monkeypatch, shipped, "checkpoint_dir", lambda args, out: out)
        self._spy(monkeypatch, hf_config, "read_config_json", lambda args, out: args[0])
        read_text = pathlib.Path.read_text

        def counted(path, *args, **kwargs):
            self.files[(str(path.resolve().parent), path.name)] += 1
            return read_text(path, *args, **kwargs)

        monkeypatch.setattr(pathlib.Path, "read_text", counted)

    def _spy(self, monkeypatch, owner, name, folder_of):
        original = getattr(owner, name)
        counter = self.found if name == "checkpoint_dir" else self.parsed

        def spy(*args, **kwargs):
            out = original(*args, **kwargs)
            counter[str(pathlib.Path(folder_of(args, out)).resolve())] += 1
            return out

        # every module that imported the function by name, and the module that defines it (local imports)
        for module in [m for n, m in list(sys.modules.items()) if n.startswith("jaxdllm") and m is not None]:
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, spy)

    def file(self, folder, name) -> int:
        return self.files[(str(pathlib.Path(folder).resolve()), name)]


@pytest.fixture
def reads(monkeypatch):
    return Reads(monkeypatch)


def _folders(*paths) -> dict:
    return {str(pathlib.Path(p).resolve()): 1 for p in paths}


def test_generate_finds_the_folder_once_and_parses_config_json_once(reads, capsys):
    assert jaxdllm.cli.main(["generate", "--model", "tasks-llada-small", "--prompt", "reverse 4821="]) == 0
    assert capsys.readouterr().out.strip() == "1284"
    assert dict(reads.found) == _folders(LLADA)
    assert dict(reads.parsed) == _folders(LLADA)
    assert reads.file(LLADA, "config.json") == 1 and reads.file(LLADA, SAMPLER_DEFAULTS_FILE) == 1


@pytest.mark.slow  # the default run keeps the one-model case (the default run's 6-minute budget)
def test_generate_with_a_second_model_reads_each_checkpoint_once(reads, capsys):
    """SpecDiff's drafter comes from the model's companions.json (the shipped tasks-dream-small)."""
    drafter = pathlib.Path(json.loads((QWEN / COMPANIONS_FILE).read_text())["spec_diffusion"])
    drafter = next(f for f in (QWEN / drafter, drafter, LLADA.parent / drafter) if f.is_dir())
    reads.files.clear()
    assert jaxdllm.cli.main(["generate", "--model", "tasks-qwen2-small", "--preset", "specdiff",
                             "--prompt", "reverse 4821="]) == 0
    assert capsys.readouterr().out.strip() == "1284"
    assert dict(reads.found) == _folders(QWEN, drafter)
    assert dict(reads.parsed) == _folders(QWEN, drafter)
    assert reads.file(QWEN, "config.json") == reads.file(drafter, "config.json") == 1
    assert reads.file(QWEN, COMPANIONS_FILE) == 1 and reads.file(QWEN, SAMPLER_DEFAULTS_FILE) == 1


def test_load_and_inspect_read_the_checkpoint_once(reads, capsys):
    jaxdllm.load("tasks-llada-small")
    assert dict(reads.found) == dict(reads.parsed) == _folders(LLADA)
    reads.found.clear(), reads.parsed.clear()
    assert jaxdllm.cli.main(["inspect", "tasks-llada-small"]) == 0  # a shipped name works here too
    assert json.loads(capsys.readouterr().out)["model_type"] == "llada"
    assert dict(reads.found) == dict(reads.parsed) == _folders(LLADA)


def test_open_finds_parses_and_passes_a_checkpoint_through():
    checkpoint = Checkpoint.open("tasks-llada-small")
    assert checkpoint.folder == LLADA and checkpoint.name == "tasks-llada-small"
    assert Checkpoint.open(checkpoint) is checkpoint and jaxdllm.Checkpoint is Checkpoint
    assert checkpoint.config.model_type == "llada" and checkpoint.raw_config["model_type"] == "llada"
    # path-like: code written for folders takes it
    assert pathlib.Path(checkpoint) == LLADA and checkpoint / "tokenizer.json" == LLADA / "tokenizer.json"
    assert str(checkpoint) == str(LLADA)
    on_disk = json.loads((LLADA / SAMPLER_DEFAULTS_FILE).read_text())
    assert checkpoint.sampler_defaults == {k: v for k, v in on_disk.items() if k != "cache_notes"}
    assert checkpoint.cache_notes == on_disk.get("cache_notes", {})
    assert read_sampler_defaults("tasks-llada-small") == checkpoint.sampler_defaults
    assert read_cache_notes(checkpoint) == checkpoint.cache_notes
    assert Checkpoint.open("tasks-qwen2-small").companions == json.loads((QWEN / COMPANIONS_FILE).read_text())


def test_side_file_names_are_the_policies():
    from jaxdllm.decoding.policies.learn2pd import FILTER_FILE as learn2pd_file
    from jaxdllm.decoding.policies.medusa import HEADS_FILE as medusa_file

    assert (HEADS_FILE, FILTER_FILE) == (medusa_file, learn2pd_file)
    assert Checkpoint.open("tasks-qwen2-small").heads_file.is_file()  # the shipped Medusa heads


def test_side_files_are_read_lazily_and_once(tmp_path, reads):
    folder = shutil.copytree(QWEN, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors", "*.png"))
    checkpoint = Checkpoint(folder)
    assert not reads.files  # nothing read yet
    for _ in range(3):
        checkpoint.config, checkpoint.sampler_defaults, checkpoint.cache_notes, checkpoint.companions
    assert {name: reads.file(folder, name) for name in ("config.json", SAMPLER_DEFAULTS_FILE, COMPANIONS_FILE)} == {
        "config.json": 1, SAMPLER_DEFAULTS_FILE: 1, COMPANIONS_FILE: 1}
    checkpoint.companions["medusa"] = "elsewhere"  # a copy: the checkpoint's table stays
    assert "medusa" not in checkpoint.companions


@pytest.mark.parametrize("name, text, error, expected", [
    ("config.json", "{", CheckpointError, "config.json"),
    (SAMPLER_DEFAULTS_FILE, "[1]", CheckpointError, SAMPLER_DEFAULTS_FILE),
    (SAMPLER_DEFAULTS_FILE, "{", CheckpointError, SAMPLER_DEFAULTS_FILE),
    (COMPANIONS_FILE, "{", ConfigError, COMPANIONS_FILE),
    (COMPANIONS_FILE, '{"apd": 3}', ConfigError, COMPANIONS_FILE),
])
def test_a_bad_file_is_an_error_naming_it(tmp_path, name, text, error, expected):
    folder = shutil.copytree(QWEN, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors", "*.png"))
    (folder / name).write_text(text)
    checkpoint = Checkpoint(folder)
    with pytest.raises(error, match=re.escape(str(folder / expected))):
        checkpoint.config, checkpoint.sampler_defaults, checkpoint.companions


def test_open_of_a_missing_folder_names_it_and_the_shipped_ones(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist.*tasks-llada-small"):
        Checkpoint.open(tmp_path / "nowhere")


def test_every_loader_takes_a_checkpoint_or_a_path():
    from jaxdllm.decoding import SamplerConfig
    from jaxdllm.eval import checkpoint_samplers
    from jaxdllm.pretrained import cache_note, checkpoint_settings

    checkpoint = Checkpoint.open("tasks-qwen2-small")
    for loader in (jaxdllm.sampler_defaults, checkpoint_settings, checkpoint_samplers):
        assert loader(checkpoint) == loader("tasks-qwen2-small") == loader(QWEN)
    config = SamplerConfig.preset("medusa")
    assert cache_note(checkpoint, config) == cache_note(QWEN, config)
    heads = jaxdllm.policy_params(checkpoint, config)
    assert heads.num_heads == jaxdllm.policy_params("tasks-qwen2-small", config).num_heads
    assert jaxdllm.Tokenizer.from_pretrained(checkpoint).encode("copy 12=") == \
        jaxdllm.Tokenizer.from_pretrained(QWEN).encode("copy 12=")
    assert jaxdllm.checkpoint.verify_checkpoint(checkpoint) == jaxdllm.checkpoint.verify_checkpoint(QWEN)
