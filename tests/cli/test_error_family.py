"""Every error the library raises on purpose is a `jaxdllm.errors` type, and the command line turns
each into one line: exit 2, no traceback (`--debug` shows it); Ctrl-C is one line and exit 130."""

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import jaxdllm
from jaxdllm import errors
from support.cli import cli_command, cli_env, run_cli as _cli, start_cli

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
    assert issubclass(errors.OutputPathError, ValueError) and issubclass(errors.DeviceMemoryError, MemoryError)
    for name in ("ConfigError", "ConfigTypeError", "InputError", "CheckpointError", "DataError", "TrainingError",
                 "OutputPathError", "DeviceMemoryError"):
        assert issubclass(getattr(errors, name), errors.JaxdllmError), name


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_a_library_error_is_one_line_and_debug_shows_the_traceback(tmp_path):
    (tmp_path / "recipe.toml").write_text("[model]\npreset = \"tiny-llada\"\n[mesh]\ndata = 3\n")
    out = _cli("train", str(tmp_path / "recipe.toml"), "--workdir", str(tmp_path / "run"))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("jaxdllm train: error:"), out.stderr
    out = _cli("--debug", "train", str(tmp_path / "recipe.toml"), "--workdir", str(tmp_path / "run"))
    assert out.returncode != 0 and "Traceback" in out.stderr


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    proc = start_cli("eval", "--tasks", "copy,reverse,sort", "--n", "400", "--batch-size", "20", "--no-progress",
                     "--out", tmp_path / "ev")
    items = tmp_path / "ev" / "items.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (items.is_file() and items.stat().st_size):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    kept = len(items.read_text().splitlines())
    assert err.strip().splitlines()[-1] == (f"jaxdllm eval: interrupted; {kept} decoded items kept in {items}; "
                                            "the same command resumes after the last finished batch")
    assert "Traceback" not in err


# -- output paths: checked before any work, one line, nothing created --------------------------

def _path_cases(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    unwritable = Path("/proc/jaxdllm-test")  # a place even root cannot create files in
    llada = "tasks-llada-small"
    return [
        (["eval", "--n", "4", "--out", str(a_file)], "--out", "is a file, but a folder is expected"),
        (["eval", "--n", "4", "--out", str(a_file / "sub")], "--out", f"{a_file} is a file, not a folder"),
        (["eval", "--n", "4", "--out", str(unwritable)], "--out", "/proc is not writable"),
        (["convert", llada, str(a_file)], "DST", "is a file, but a folder is expected"),
        (["convert", llada, str(unwritable)], "DST", "/proc is not writable"),
        (["train", "tasks_tiny_cpu", "--workdir", str(a_file)], "--workdir", "is a file, but a folder"),
        (["train", "tasks_tiny_cpu", "--workdir", str(tmp_path / "run"), "--export", str(unwritable)], "--export",
         "/proc is not writable"),
        (["distill", "generate", "dparallel_tasks_tiny_cpu", "--out", str(tmp_path)], "--out",
         "is a folder, but a file is expected"),
        (["distill", "generate", "dparallel_tasks_tiny_cpu", "--out", str(unwritable / "a.jsonl")], "--out",
         "/proc is not writable"),
    ]


# Fresh processes: the slow run, for the default run's 6-minute budget.
@pytest.mark.slow
@pytest.mark.parametrize("case", range(9))
def test_an_output_path_that_cannot_be_written_fails_first(case, tmp_path):
    if not Path("/proc").is_dir():
        pytest.skip("uses /proc as a folder nobody can write to")
    args, flag, message = _path_cases(tmp_path)[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    out = _cli(*args, cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"jaxdllm {args[0]}: error: {flag} ") and message in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no workdir, runs/ or partial output


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_a_missing_init_from_is_named_and_no_workdir_is_made(tmp_path):
    out = _cli("train", "dparallel_tasks_tiny_cpu", "--set", f"model.init_from={tmp_path / 'nope'}",
               "--workdir", str(tmp_path / "run"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"[model] init_from {tmp_path / 'nope'} does not exist" in out.stderr
    assert "tokenizer.json" not in out.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_device_out_of_memory_is_one_line_with_sizes(tmp_path):
    """A real XLA RESOURCE_EXHAUSTED: the process's address space is capped at 6 GiB and a
    copy of the shipped model is asked for a 32k-token canvas (its attention scores alone are
    tens of GiB)."""
    big = tmp_path / "long-model"
    shutil.copytree(jaxdllm.shipped.shipped_checkpoint("tasks-llada-small"), big)
    config = json.loads((big / "config.json").read_text())
    config["max_sequence_length"] = 40000
    (big / "config.json").write_text(json.dumps(config))
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30)); "
              "from jaxdllm.cli import main; sys.exit(main(sys.argv[1:]))")
    env = cli_env()
    out = subprocess.run([sys.executable, "-c", script, "generate", "--model", str(big), "--prompt", "copy 12=",
                          "--gen-length", "32768", "--block-length", "32768", "--steps", "1"],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert re.search(r"ran out of memory \(an allocation of [0-9.]+ GiB failed; 1 rows x 32800 positions "
                     r"\(prompt 32 \+ gen_length 32768\), weights 0\.\d+ GiB on 1 device\(s\)\): lower", lines[0])
    assert lines[0].endswith("(in this command: --gen-length or the prompt)")


def test_a_first_signal_stops_between_batches_and_a_second_at_once():
    from jaxdllm.interrupts import stop_between_batches, terminate_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    batches = []
    with pytest.raises(errors.Interrupted) as stopped:
        with stop_between_batches("stopping") as stop:
            for batch in range(5):
                if batch == 1:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.05)
                batches.append(batch)                # the batch in progress finishes
                stop.check()
    assert batches == [0, 1] and stopped.value.signum == signal.SIGTERM
    with pytest.raises(errors.Interrupted):
        with stop_between_batches("stopping"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)  # the second one does not wait
            time.sleep(1)
            pytest.fail("a second signal must interrupt at once")
    with pytest.raises(errors.Interrupted) as stopped:
        with terminate_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    assert stopped.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back


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


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
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
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "term"])
def test_a_stopped_train_saves_the_step_and_the_same_command_resumes(signum, tmp_path):
    env = cli_env()
    command = cli_command("train", "tasks_tiny_cpu", "--workdir", tmp_path / "run", "--set", "log.progress=false",
                          "--set", "log.every=1", "--set", "checkpoint.every=1000")
    proc = subprocess.Popen([*command, "--steps", "400"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.2)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum] and "Traceback" not in err, err
    match = re.fullmatch(r"jaxdllm train: interrupted at step (\d+); checkpoint saved; the same command resumes "
                         r"from the last checkpoint", last)
    assert match, last
    step = int(match[1])
    out = subprocess.run([*command, "--steps", str(step + 2)], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and f"resumed from step {step}" in out.stdout, out.stderr
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == list(range(1, step + 3))


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_without_matplotlib_eval_reports_only_what_it_wrote(tmp_path):
    script = ("import sys; sys.modules['matplotlib'] = None; "  # as if the eval extra were not installed
              "from jaxdllm.cli import main; sys.exit(main(sys.argv[1:]))")
    env = cli_env()
    out = subprocess.run([sys.executable, "-c", script, "eval", "--tasks", "copy", "--n", "2", "--batch-size", "2",
                          "--no-progress", "--out", str(tmp_path / "ev")], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == f"wrote {tmp_path / 'ev' / 'eval.json'}"
    assert '.[eval]' in out.stderr and "not written" in out.stderr
    assert not (tmp_path / "ev" / "pareto.png").exists()
