"""`jaxdllm eval`: GSM8K answer extraction on real test-split lines, the shipped model's card
reproduced, sweeps, the Pareto plot, and a kill/resume that gives the same JSON."""

import json
import re
import signal
import subprocess
import time

import pytest

import jaxdllm.eval.runner as runner
from jaxdllm import Tokenizer, from_pretrained
from jaxdllm.cli import DEFAULT_MODEL
from jaxdllm.data import build_char_tokenizer, load_gsm8k
from jaxdllm.data.gsm8k import SHIPPED_DIR
from jaxdllm.errors import ConfigError
from jaxdllm.eval import (Gsm8kEvalTask, SuiteEvalTask, checkpoint_samplers, evaluate, resolve_tasks,
                          sampler_settings, without_timing)
from support.cli import cli_command, cli_env as _cli_env

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").is_file(), reason="no shipped checkpoint")

# Five lines of GSM8K's test split (MIT, OpenAI), as in jaxdllm/data/gsm8k_files/test.jsonl.
GSM8K_LINES = [
    ("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day at "
     "the farmer\u2019s market.\n#### 18", "18"),
    ("It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total amount of fabric is 2+1=<<2+1=3>>3 bolts of "
     "fabric\n#### 3", "3"),
    ("The cost of the house and repairs came out to 80,000+50,000=$<<80000+50000=130000>>130,000\nHe increased "
     "the value of the house by 80,000*1.5=<<80000*1.5=120000>>120,000\nSo the new value of the house is "
     "120,000+80,000=$<<120000+80000=200000>>200,000\nSo he made a profit of "
     "200,000-130,000=$<<200000-130000=70000>>70,000\n#### 70000", "70000"),
    ("He sprints 3*3=<<3*3=9>>9 times\nSo he runs 9*60=<<9*60=540>>540 meters\n#### 540", "540"),
]


@pytest.fixture(scope="module")
def shipped():
    return from_pretrained(DEFAULT_MODEL, dtype="float32"), Tokenizer.from_pretrained(DEFAULT_MODEL)


# -- GSM8K extraction ----------------------------------------------------------------------------
@pytest.mark.parametrize("solution,answer", GSM8K_LINES)
def test_gsm8k_extraction_on_real_test_lines(solution, answer):
    task = Gsm8kEvalTask()
    item = runner.EvalItem("x", "q", answer)
    assert task.extract(solution) == answer and task.score(item, solution)
    # Without the '####' line an instruct model's free-form answer is read by its last number.
    body = solution.rsplit("\n####", 1)[0]
    assert task.extract(body + f"\nThe answer is ${int(answer):,}.") == answer
    # A few-shot continuation that goes on to write the next question is cut there.
    assert task.extract(solution + "\n\nQuestion: Tom has 7 apples.\nAnswer: 7 - 2 = 5\n#### 5") == answer
    assert not task.score(item, body.replace(answer, str(int(answer) + 1)) + "\n#### " + str(int(answer) + 1))


def test_gsm8k_reference_solutions_score_correct_on_the_whole_split():
    task = Gsm8kEvalTask()
    items = task.items(None, 0)
    solutions = [e.response for e in load_gsm8k("test", SHIPPED_DIR)]
    assert len(items) == 1319
    assert all(task.score(item, text) for item, text in zip(items, solutions))
    assert sum(task.score(item, "#### 0") for item in items) < 5  # a constant answer is rarely right


def test_gsm8k_prompts_plain_and_chat():
    tok = build_char_tokenizer()
    item = Gsm8kEvalTask().items(1, 0)[0]
    plain = tok.decode(Gsm8kEvalTask(shots=2, chat=False).encode(tok, item))
    assert plain.startswith("Question: Natalia sold clips") and plain.endswith("Answer:")
    assert plain.count("Question: ") == 3 and "#### 72" in plain and "#### 10" in plain
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    chat = tok.decode(Gsm8kEvalTask(shots=1).encode(tok, item))
    assert chat.startswith("<user>Natalia sold clips") and "<assistant>Natalia sold 48/2 = 24" in chat
    assert chat.endswith("at the farmers' market?<assistant>")  # (the character vocabulary has no \u2019)


def test_resolve_tasks_expands_groups():
    names = [t.name for t in resolve_tasks("suite,parallelbench,gsm8k,copy,long")]
    assert names == ["copy", "reverse", "sort", "add", "perm", "pick3", "twin", "gsm8k", "copy_long",
                     "reverse_long", "sort_long"]
    with pytest.raises(ConfigError, match="unknown task 'nope'.*or a group"):
        resolve_tasks("nope")


# -- sweeps ---------------------------------------------------------------------------------------
def test_sweep_is_a_product_of_validated_settings():
    settings = sampler_settings("fast-dllm-parallel", {"gen_length": 16, "block_length": 16},
                                {"threshold": [0.5, 0.9], "temperature": [0.0, 1.0]})
    assert list(settings) == ["fast-dllm-parallel threshold=0.5 temperature=0.0",
                              "fast-dllm-parallel threshold=0.5 temperature=1.0",
                              "fast-dllm-parallel threshold=0.9 temperature=0.0",
                              "fast-dllm-parallel threshold=0.9 temperature=1.0"]
    assert settings["fast-dllm-parallel threshold=0.9 temperature=0.0"].threshold == 0.9
    with pytest.raises(ConfigError, match="threshold"):
        sampler_settings("fast-dllm-parallel", {}, {"threshold": [1.5]})


def test_a_checkpoint_without_a_preset_gets_its_card_table():
    """No preset: a diffusion checkpoint is compared at one token per step and with the threshold
    rule; a causal one (its default decodes the draft canvas) with AR, Jacobi and Jacobi Forcing."""
    diffusion = checkpoint_samplers(DEFAULT_MODEL)
    assert list(diffusion) == ["llada", "threshold"]
    assert all(c.policy.canvas == "masked_canvas" for c in diffusion.values())
    causal = checkpoint_samplers(DEFAULT_MODEL.parent / "tasks-qwen2-small", gen_length=8)
    assert list(causal) == ["ar", "jacobi", "jacobi-mr"]
    assert [c.window for c in causal.values()] == [1, 8, 8] and all(c.gen_length == 8 for c in causal.values())
    with pytest.raises(ConfigError, match="need --preset"):
        checkpoint_samplers(DEFAULT_MODEL, sweep={"threshold": [0.5]})
    with pytest.raises(ConfigError, match="disagree"):
        checkpoint_samplers(DEFAULT_MODEL, "llada", gen_length=8, overrides={"gen_length": 16})


def test_sweep_trades_accuracy_for_forwards_on_the_shipped_model(shipped, tmp_path):
    model, tok = shipped
    samplers = sampler_settings("fast-dllm-parallel", {"gen_length": 16, "block_length": 16},
                                {"threshold": [0.05, 0.9]})
    report = evaluate(model, tok, resolve_tasks("perm,twin"), samplers, n=24, batch_size=12, out=tmp_path,
                      progress=False, log=lambda line: None)
    low, high = (report["results"][f"fast-dllm-parallel threshold={t}"] for t in (0.05, 0.9))
    # A low threshold commits many tokens per forward, and on perm mixes permutations into invalid answers.
    assert low["perm"]["answer_tokens_per_forward"] > 2 * high["perm"]["answer_tokens_per_forward"]
    assert low["perm"]["accuracy"] < high["perm"]["accuracy"]
    assert high["twin"]["n"] == 24 and 0 <= high["twin"]["accuracy"] <= 1  # the model never saw twin
    assert set(high["mean"]) == {"n", "accuracy", "mean_nfe", "answer_tokens_per_forward"}
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "eval.json").read_text()) == report


# -- resume ---------------------------------------------------------------------------------------
def test_interrupted_run_resumes_to_the_same_json(shipped, tmp_path, monkeypatch):
    model, tok = shipped
    tasks = resolve_tasks("reverse,pick3")
    samplers = sampler_settings("fast-dllm-parallel", {"gen_length": 16, "block_length": 16})
    kw = dict(n=12, batch_size=4, progress=False, log=lambda line: None)
    whole = evaluate(model, tok, tasks, samplers, out=tmp_path / "whole", **kw)

    calls = []
    real_generate = runner.generate

    def dies_on_the_fourth_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(runner, "generate", dies_on_the_fourth_batch)
    with pytest.raises(KeyboardInterrupt):
        evaluate(model, tok, tasks, samplers, out=tmp_path / "resumed", **kw)
    assert not (tmp_path / "resumed" / "eval.json").exists()
    with open(tmp_path / "resumed" / "items.jsonl", "a") as f:
        f.write('{"key": "trunc')  # a write cut by the kill
    calls.clear()
    resumed = evaluate(model, tok, tasks, samplers, out=tmp_path / "resumed", **kw)
    assert len(calls) == 3  # only the batches that had not finished
    assert without_timing(resumed) == without_timing(whole)
    assert json.loads((tmp_path / "resumed" / "eval.json").read_text()) == resumed


def test_new_weights_at_the_same_path_are_decoded_again(shipped, tmp_path, monkeypatch):
    """A checkpoint exported again to the same folder must not reuse the old weights' answers."""
    import shutil

    from jaxdllm.cli import DEFAULT_MODEL
    from jaxdllm.eval.evaluate import weights_version

    model, tok = shipped
    copy = shutil.copytree(DEFAULT_MODEL, tmp_path / "model")
    tasks, samplers = resolve_tasks("reverse"), sampler_settings("fast-dllm-parallel", {"gen_length": 16,
                                                                                          "block_length": 16})
    calls = []
    real_generate = runner.generate
    monkeypatch.setattr(runner, "generate", lambda *a, **k: calls.append(1) or real_generate(*a, **k))
    kw = dict(n=4, batch_size=4, progress=False, log=lambda line: None, out=tmp_path / "out", model_id=str(copy))
    before = weights_version(copy)
    evaluate(model, tok, tasks, samplers, model_version=before, **kw)
    evaluate(model, tok, tasks, samplers, model_version=weights_version(copy), **kw)
    assert len(calls) == 1  # same weights: resumed
    (copy / "model.safetensors").write_bytes((copy / "model.safetensors").read_bytes())  # written again
    assert weights_version(copy) != before
    evaluate(model, tok, tasks, samplers, model_version=weights_version(copy), **kw)
    assert len(calls) == 2


def _eval_command(out):
    return cli_command("eval", "--tasks", "reverse,perm", "--n", "64", "--batch-size", "4", "--preset",
                       "fast-dllm-parallel", "--out", out, "--no-progress")


@pytest.fixture(scope="module")
def whole_eval(tmp_path_factory):
    """The uninterrupted run's eval.json."""
    out = tmp_path_factory.mktemp("whole")
    subprocess.run(_eval_command(out), check=True, env=_cli_env(), capture_output=True)
    return json.loads((out / "eval.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM], ids=["kill", "ctrl-c", "term"])
def test_a_stopped_cli_run_resumes_to_the_same_json(signum, whole_eval, tmp_path):
    """A real signal in the middle of `jaxdllm eval`, then the same command again. Ctrl-C and
    SIGTERM end in one line naming what was kept (exit 130 / 143); the final JSON is the
    uninterrupted run's."""
    proc = subprocess.Popen(_eval_command(tmp_path / "stopped"), env=_cli_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    items = tmp_path / "stopped" / "items.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if items.is_file() and len(items.read_text().splitlines()) >= 8:  # two batches written
            break
        time.sleep(0.05)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    written = len(items.read_text().splitlines())
    assert 8 <= written < 128, written  # stopped in the middle (128 items: a warm compilation cache is fast)
    if signum != signal.SIGKILL:
        assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum], err
        assert "Traceback" not in err
        assert re.fullmatch(rf"jaxdllm eval: interrupted; {written} decoded items kept in \S+items.jsonl; the same "
                            r"command resumes after the last finished batch", err.strip().splitlines()[-1]), err
    subprocess.run(_eval_command(tmp_path / "stopped"), check=True, env=_cli_env(), capture_output=True)
    resumed = json.loads((tmp_path / "stopped" / "eval.json").read_text())
    assert without_timing(resumed) | {"model": None} == without_timing(whole_eval) | {"model": None}


# -- the shipped model's card ---------------------------------------------------------------------
def _card_rows():
    card = json.loads((DEFAULT_MODEL / "eval.json").read_text())
    return [(sampler, row) for sampler, rows in card.items() for row in rows]


def _check_against_card(report, rows):
    for sampler, row in rows:
        got = report["results"][sampler][row["task"]]
        assert got["n"] == row["n"] == 200
        assert got["accuracy"] == pytest.approx(row["accuracy"], abs=1e-9), (sampler, row["task"])
        assert got["mean_nfe"] == pytest.approx(row["mean_nfe"], abs=1e-9), (sampler, row["task"])
        assert got["answer_tokens_per_forward"] == pytest.approx(row["answer_tokens_per_forward"], rel=1e-9)


@pytest.mark.slow
def test_eval_reproduces_the_whole_card(tmp_path):
    """`jaxdllm eval` with the card's default samplers reproduces every row of the card.

    The command runs as a user runs it, in a fresh process (tests/support/cli.py): 2,400 items at up
    to 16 forwards each, whose time is the forwards themselves, which XLA's default CPU optimisations
    run in about two thirds of the time this process's quick-compile flags (tests/conftest.py) take."""
    done = subprocess.run(cli_command("eval", "--tasks", "suite", "--out", tmp_path, "--no-progress"),
                          env=_cli_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_against_card(json.loads((tmp_path / "eval.json").read_text()), _card_rows())


def test_suite_items_are_the_held_out_split():
    items = SuiteEvalTask("copy").items(5, 1234)
    from jaxdllm.data import instance_split

    assert all(instance_split("copy", i.prompt) == "test" and i.id == i.prompt for i in items)
