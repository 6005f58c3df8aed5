"""Every error the library raises on purpose is a `jaxdllm.errors` type, and the command line turns
each into one line: exit 2, no traceback (`--debug` shows it); Ctrl-C is one line and exit 130."""

import ast
import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import jaxdllm
from jaxdllm import errors

PACKAGE = Path(jaxdllm.__file__).resolve().parent
# AssertionError stays allowed: it marks a broken internal invariant, which no input can cause.
BUILTINS = {"ValueError", "TypeError", "RuntimeError", "KeyError", "IndexError", "FileNotFoundError", "OSError",
            "Exception"}


def _raised_builtins(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            if isinstance(func, ast.Name) and func.id in BUILTINS:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} raise {func.id}(...)")
    return found


def test_the_library_raises_only_its_own_error_types():
    offenders = [hit for path in sorted(PACKAGE.rglob("*.py")) if path.name != "errors.py"
                 for hit in _raised_builtins(path)]
    assert not offenders, "raise a jaxdllm.errors type instead:\n" + "\n".join(offenders)


def test_every_error_type_is_a_jaxdllm_error_and_its_builtin():
    assert issubclass(errors.ConfigError, ValueError) and issubclass(errors.ConfigTypeError, TypeError)
    assert issubclass(errors.TrainingError, RuntimeError) and issubclass(errors.DatasetNotFoundError, FileNotFoundError)
    for name in ("ConfigError", "ConfigTypeError", "InputError", "CheckpointError", "DataError", "TrainingError"):
        assert issubclass(getattr(errors, name), errors.JaxdllmError), name


def _cli(*args, cwd=None):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXDLLM_COMPILATION_CACHE="off")
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "jaxdllm.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd)


def test_a_library_error_is_one_line_and_debug_shows_the_traceback(tmp_path):
    (tmp_path / "recipe.toml").write_text("[model]\npreset = \"tiny-llada\"\n[mesh]\ndata = 3\n")
    out = _cli("train", str(tmp_path / "recipe.toml"), "--workdir", str(tmp_path / "run"))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("jaxdllm train: error:"), out.stderr
    out = _cli("--debug", "train", str(tmp_path / "recipe.toml"), "--workdir", str(tmp_path / "run"))
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXDLLM_COMPILATION_CACHE="off")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.Popen([sys.executable, "-m", "jaxdllm.cli", "eval", "--tasks", "copy,reverse,sort", "--n", "400",
                             "--batch-size", "20", "--no-progress", "--out", str(tmp_path / "ev")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    items = tmp_path / "ev" / "items.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (items.is_file() and items.stat().st_size):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "jaxdllm eval: interrupted; the same command resumes after the last finished batch"
    assert "Traceback" not in err


def test_two_models_with_one_name_get_separate_default_eval_folders(tmp_path):
    from jaxdllm.cli import default_eval_dir

    (tmp_path / "a" / "model").mkdir(parents=True)
    (tmp_path / "b" / "model").mkdir(parents=True)
    first, second = default_eval_dir(tmp_path / "a" / "model"), default_eval_dir(tmp_path / "b" / "model")
    assert first != second and first.name.startswith("model-") and first.parent == Path("runs/eval")
    assert default_eval_dir(tmp_path / "a" / "model") == first  # stable: a rerun resumes in the same folder


def test_exported_weights_are_readable_like_any_new_file(tmp_path):
    from flax import nnx

    config = jaxdllm.ModelConfig.preset("tiny-llada")
    old = os.umask(0o022)
    try:
        out = jaxdllm.save_pretrained(jaxdllm.Transformer(config, rngs=nnx.Rngs(0)), tmp_path / "m", max_shard_size="100KB")
    finally:
        os.umask(old)
    files = sorted(out.glob("*.safetensors"))
    assert len(files) > 1 and all(f.stat().st_mode & 0o777 == 0o644 for f in files)  # transformers writes 0644


# -- Python inputs: each mistake names its row ---------------------------------------------------

@pytest.fixture(scope="module")
def shipped():
    return jaxdllm.load("tasks-llada-small")


def test_bad_arrays_are_named_before_decoding(shipped):
    import numpy as np

    model, tok, defaults = shipped
    batch = tok(["reverse 4821=", "sort 93715="])
    out_of_vocab = batch.ids.copy()
    out_of_vocab[1, 5] = 500
    cases = [
        (batch.ids.astype(np.float32), batch.mask, "integer token ids, got dtype float32"),
        (out_of_vocab, batch.mask, "row 1, position 5: id 500 is outside"),
        (batch.ids, np.where(np.arange(2)[:, None] == 1, 0, batch.mask), "attention_mask row 1 has no prompt token"),
        (batch.ids, batch.mask * 2, "0 (padding) and 1 (prompt token) only"),
        (batch.ids, None, "row 1 starts with the pad id"),  # left-padded ids without their mask
    ]
    for ids, mask, message in cases:
        with pytest.raises(errors.InputError, match=re.escape(message)):
            jaxdllm.generate(model, ids, defaults, attention_mask=mask)


def test_a_prompt_that_fills_the_model_says_so(shipped):
    import numpy as np

    model, _, defaults = shipped
    with pytest.raises(errors.ConfigError, match="the prompt alone .* fills the model's max_position"):
        jaxdllm.generate(model, np.ones((1, 70), np.int32), defaults)


def test_text_the_tokenizer_does_not_know_is_named(shipped, tmp_path):
    _, tok, _ = shipped
    with pytest.raises(errors.DataError, match=r"does not know '١' at 8, '٢' at 9, '٣' at 10 in 'reverse ١٢٣='"):
        tok(["copy 12=", "reverse ١٢٣="])
    tok.unknown = "keep"
    try:
        assert tok(["reverse ١٢٣="]).ids.shape == (1, len("reverse ١٢٣=") + 1)  # BOS + one id per character
    finally:
        tok.unknown = "error"
    out = _cli("generate", "--prompt", "price 3€=", cwd=tmp_path)
    assert out.returncode == 2 and "does not know '€' at 7" in out.stderr and len(out.stderr.splitlines()) == 1
    out = _cli("generate", "--prompt", "copy 3€=", "--allow-unk", cwd=tmp_path)
    assert out.returncode == 0, out.stderr


@pytest.mark.slow  # a training process, interrupted, then resumed
def test_ctrl_c_in_train_saves_the_step_and_the_same_command_resumes(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXDLLM_COMPILATION_CACHE="off")
    env.pop("XLA_FLAGS", None)
    command = [sys.executable, "-m", "jaxdllm.cli", "train", "tasks_tiny_cpu", "--workdir", str(tmp_path / "run"),
               "--set", "log.progress=false", "--set", "log.every=1", "--set", "checkpoint.every=1000"]
    proc = subprocess.Popen([*command, "--steps", "400"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 130 and "Traceback" not in err, err
    match = re.fullmatch(r"jaxdllm train: interrupted at step (\d+); checkpoint saved; the same command resumes "
                         r"from the last checkpoint", last)
    assert match, last
    step = int(match[1])
    out = subprocess.run([*command, "--steps", str(step + 2)], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and f"resumed from step {step}" in out.stdout, out.stderr
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == list(range(1, step + 3))
