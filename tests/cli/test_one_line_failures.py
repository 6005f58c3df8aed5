"""Mistakes a new user made with the shipped models, each ending in one line that names the file or
setting and what to do (the command line run in this process: nothing is decoded, every error comes
before a model loads)."""

import json
import shutil

import pytest

from jaxdllm.cli import main
from jaxdllm.shipped import checkpoint_dir

CAUSAL = checkpoint_dir("tasks-qwen2-small")


def _one_line(capsys, *argv) -> str:
    assert main(["generate", *argv, "--prompt", "copy 12="]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxdllm generate: error: "), err
    return err[0]


def _causal_copy(tmp_path, companions: str | None):
    """The shipped causal model's files (no weights are read) with `companions.json` replaced."""
    folder = tmp_path / "causal"
    shutil.copytree(CAUSAL, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.png", "*.jsonl"))
    (folder / "companions.json").unlink()
    if companions is not None:
        (folder / "companions.json").write_text(companions)
    return folder


def test_specdiff_on_a_diffusion_model_names_the_real_reason_first(capsys):
    line = _one_line(capsys, "--model", "tasks-llada-small", "--preset", "specdiff")
    assert "policy='spec_diffusion' decodes causal models; the model's attention is 'bidirectional'" in line
    assert "drafter" not in line


def test_preset_diffusiongemma_on_a_llada_model_is_one_line(capsys):
    line = _one_line(capsys, "--model", "tasks-llada-small", "--preset", "diffusiongemma")
    assert "diffusiongemma" in line


def test_a_companions_file_that_is_not_json_is_named(capsys, tmp_path):
    folder = _causal_copy(tmp_path, '{"spec_diffusion": ')
    line = _one_line(capsys, "--model", str(folder), "--preset", "specdiff")
    assert f"{folder / 'companions.json'} is not valid JSON" in line
    folder = _causal_copy(tmp_path / "list", '["../drafter"]')
    line = _one_line(capsys, "--model", str(folder), "--preset", "specdiff")
    assert "must be a JSON object from policy names to folders" in line


def test_a_companion_folder_that_does_not_exist_names_the_file_that_named_it(capsys, tmp_path):
    folder = _causal_copy(tmp_path, json.dumps({"spec_diffusion": "../no-such-drafter"}))
    line = _one_line(capsys, "--model", str(folder), "--preset", "specdiff")
    assert f"the drafter named by {folder / 'companions.json'} ('spec_diffusion': '../no-such-drafter') is not a " \
           "folder" in line
    line = _one_line(capsys, "--model", str(folder), "--preset", "specdiff", "--set", "drafter=/no/such/drafter")
    assert "the drafter named by drafter='/no/such/drafter' is not a folder" in line


def test_a_missing_companion_says_how_to_give_one_on_the_command_line(capsys, tmp_path):
    folder = _causal_copy(tmp_path, None)
    line = _one_line(capsys, "--model", str(folder), "--preset", "specdiff")
    assert "policy 'spec_diffusion' needs a drafter: pass one (--set drafter=DIR on the command line" in line
    assert f'name it in {folder / "companions.json"} as {{"spec_diffusion": "DIR"}}' in line


@pytest.mark.parametrize("text", ['{"spec_diffusion": "../drafter"', "[1, 2]"])
def test_read_companions_refuses_what_is_not_a_table(tmp_path, text):
    from jaxdllm.decoding.second_model import read_companions
    from jaxdllm.errors import ConfigError

    (tmp_path / "companions.json").write_text(text)
    with pytest.raises(ConfigError, match="companions.json"):
        read_companions(tmp_path)
    assert read_companions(tmp_path / "elsewhere") == {}
