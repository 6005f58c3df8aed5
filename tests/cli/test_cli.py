"""The jaxdllm command line on a tiny checkpoint, run as a user would run it."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from support.cli import run_cli as _run
from support.hf_models import make_hf_model


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_one_module_per_command_and_help_lists_them():
    import jaxdllm.cli as cli

    assert list(cli.COMMANDS) == ["generate", "eval", "inspect", "convert", "distill", "train", "launch", "serve", "molecules"]
    assert all(m.__name__ == f"jaxdllm.cli.{name}_command" for name, m in cli.COMMANDS.items())
    out = _run("--help")
    assert out.returncode == 0 and "{generate,eval,inspect,convert,distill,train,launch,serve,molecules}" in out.stdout
    out = _run("nope")
    assert out.returncode == 2 and "invalid choice" in out.stderr and "(see jaxdllm --help)" in out.stderr


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_inspect_and_convert(tmp_path):
    make_hf_model("qwen2", "gqa").save_pretrained(tmp_path / "src")
    out = _run("inspect", str(tmp_path / "src"), "--load")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert (info["model_type"], info["num_heads"], info["num_kv_heads"], info["logits_finite"]) == ("qwen2", 6, 2, True)

    out = _run("convert", str(tmp_path / "src"), str(tmp_path / "bf16"), "--dtype", "bfloat16")
    assert out.returncode == 0, out.stderr
    src, dst = load_file(str(tmp_path / "src" / "model.safetensors")), load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert sorted(src) == sorted(dst) and all(t.dtype.name == "bfloat16" for t in dst.values())
    np.testing.assert_allclose(dst["lm_head.weight"].astype(np.float32), src["lm_head.weight"], rtol=1e-2)


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_readable_error_for_a_bad_directory(tmp_path):
    out = _run("inspect", str(tmp_path))
    assert out.returncode == 2
    assert "jaxdllm inspect: error:" in out.stderr and "config.json is missing" in out.stderr
    assert "Traceback" not in out.stderr


def _tiny_llada_with_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from support.llada_reference import TINY, make_llada_checkpoint

    make_llada_checkpoint(path, head_scale=15.0)
    vocab = {f"w{i}": i for i in range(TINY["vocab_size"])}
    vocab["<|mdm_mask|>"] = TINY["mask_token_id"]
    del vocab[f"w{TINY['mask_token_id']}"]
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_generate_prints_text_and_nfe(tmp_path):
    _tiny_llada_with_tokenizer(tmp_path)
    out = _run("generate", "--model", str(tmp_path), "--prompt", "w1 w2 w3", "--preset", "fast-dllm-parallel",
               "--gen-length", "16", "--block-length", "8", "--set", "prompt_bucket=8")
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    assert len(words) == 16 and all(w.startswith("w") for w in words)
    assert "[nfe " in out.stderr and "16 answer tokens of 16" in out.stderr


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_generate_bad_options_are_readable(tmp_path):
    out = _run("generate", "--prompt", "x", "--gen-length", "20", "--block-length", "8")
    assert out.returncode == 2 and "gen_length (20) must be a multiple of block_length (8)" in out.stderr
    assert "pass block_length= one of" in out.stderr
    out = _run("generate", "--model", str(tmp_path), "--prompt", "x")
    assert out.returncode == 2 and "config.json is missing" in out.stderr
    out = _run("generate", "--prompt", "x", "--set", "tempreature=1")
    assert out.returncode == 2 and "unknown sampler option(s) ['tempreature']" in out.stderr
    out = _run("generate", "--prompt", "x", "--preset", "nope")
    assert out.returncode == 2 and "unknown sampler preset 'nope'" in out.stderr
    assert "Traceback" not in out.stderr
