"""The teacher's answers for distillation (`jaxdllm distill generate`): deterministic per seed,
checked by each task's rule (re-checked here by hand), exactly resumed after `kill -9`, the same
on a mesh as on one device; and the recipe's three commands (distill, train with
`certainty_forcing`, generate with the `dparallel` preset) run end to end."""

import json
import signal
import subprocess
import textwrap
import time
from collections import Counter
from pathlib import Path

import jax
import pytest

from jaxdllm import SamplerConfig, from_pretrained
from jaxdllm.cli import main
from jaxdllm.data import Example, make_mixture
from jaxdllm.errors import DataError
from jaxdllm.sharding import make_mesh
from jaxdllm.tokenizer import Tokenizer
from jaxdllm.train.distill import check_answer, generate_answers, read_answers
from jaxdllm.train.distill.teacher import read_prompt_files
from support.cli import cli_command, cli_env

SHIPPED = Path(__file__).resolve().parents[2] / "checkpoints" / "tasks-llada-small"
ONE_TOKEN_PER_STEP = SamplerConfig(gen_length=16, block_length=16, steps=16)


@pytest.fixture(scope="module")
def teacher():
    return from_pretrained(SHIPPED, dtype="float32"), Tokenizer.from_pretrained(SHIPPED)


def _lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _right_by_hand(prompt: str, answer: str) -> bool:
    """Each task's rule, written out again here."""
    if "+" in prompt:
        a, b = prompt.rstrip("=").split("+")
        return answer == str(int(a) + int(b))
    verb, digits = prompt.rstrip("=").rsplit(" ", 1)
    if verb == "perm":
        return sorted(answer) == sorted(digits)
    if verb == "pick 3 from":
        return len(answer) == 3 and not Counter(answer) - Counter(digits)
    return answer == {"copy": digits, "reverse": digits[::-1], "sort": "".join(sorted(digits))}[verb]


def test_answers_are_checked_and_only_right_ones_are_kept(teacher, tmp_path):
    model, tok = teacher
    examples = make_mixture(["add", "perm", "pick3", "sort"], 12, seed=3)
    out = tmp_path / "t.jsonl"
    stats = generate_answers(model, tok, examples, ONE_TOKEN_PER_STEP, out, batch_size=16, progress=False)
    lines = _lines(out)
    assert [r["prompt"] for r in lines] == [e.prompt for e in examples]
    verdicts = [_right_by_hand(r["prompt"], r["answer"]) for r in lines]
    assert [r["correct"] for r in lines] == verdicts
    assert 0 < sum(verdicts) < len(verdicts)              # the teacher gets some additions wrong
    assert all(r["nfe"] == 16 and 1 <= r["answer_tokens"] <= 16 for r in lines)
    kept = read_answers(out)
    assert [(e.prompt, e.response) for e in kept] == [(r["prompt"], r["answer"]) for r in lines if r["correct"]]
    assert len(read_answers(out, keep="all")) == len(lines)
    assert stats["tasks"]["all"]["kept"] == sum(verdicts)
    assert json.loads((tmp_path / "t.jsonl.stats.json").read_text())["tasks"]["add"]["n"] == 12


@pytest.mark.slow  # three teacher runs (~7 s): the default run's 6-minute budget
def test_deterministic_per_seed(teacher, tmp_path):
    model, tok = teacher
    examples = make_mixture(["perm", "pick3"], 8, seed=0)
    sampled = ONE_TOKEN_PER_STEP.replace(temperature=1.0)  # the seed matters only when sampling
    runs = {}
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        generate_answers(model, tok, examples, sampled, tmp_path / f"{name}.jsonl", batch_size=8, seed=seed,
                         progress=False)
        runs[name] = (tmp_path / f"{name}.jsonl").read_bytes()
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_mesh_sharded_teacher_equals_one_device(teacher, tmp_path):
    _, tok = teacher
    examples = make_mixture(["perm", "add"], 6, seed=1)
    outs = []
    for name, mesh in (("one", make_mesh(data=1, devices=jax.devices()[:1])),
                       ("four", make_mesh(data=4, devices=jax.devices()[:4]))):
        model = from_pretrained(SHIPPED, dtype="float32", mesh=mesh)
        generate_answers(model, tok, examples, ONE_TOKEN_PER_STEP, tmp_path / f"{name}.jsonl", batch_size=6,
                         progress=False)
        outs.append((tmp_path / f"{name}.jsonl").read_bytes())
    assert outs[0] == outs[1]


def test_gsm8k_answers_are_read_as_the_papers_do():
    # The last lines of three GSM8K test solutions (MIT license, github.com/openai/grade-school-math).
    first = Example("Janet's ducks ...", "", "gsm8k", "18")
    assert check_answer(first, "She makes 9 * 2 = $18 every day at the farmer's market.\n#### 18")
    assert check_answer(first, "She makes 9 * 2 = $18 every day at the farmer's market.")  # no ####: last number
    assert not check_answer(first, "Janet sells 16 - 3 - 4 = 9 duck eggs a day.\n#### 9")
    house = Example("Josh decides to try flipping a house ...", "", "gsm8k", "70000")
    assert check_answer(house, "So he made a profit of 200,000-130,000=$70,000")
    assert check_answer(Example("A robe takes ...", "", "gsm8k", "3"),
                        "So the total amount of fabric is 2+1=3 bolts of fabric\n#### 3")
    assert not check_answer(house, "I cannot tell.")
    assert check_answer(Example("free text", "", "mine"), "anything") is None   # nothing to check against
    # MATH-style references (PRM12K): the last \\boxed{} of the solution against the bare answer.
    half = Example("What is 1/4 + 1/4?", "", "prm12k", "\\frac{1}{2}")
    assert check_answer(half, "Adding, $\\frac14+\\frac14=\\boxed{\\frac{1}{2}}$.")
    assert not check_answer(half, "So $\\boxed{\\frac{1}{4}}$.")
    # A worked solution as the reference: its own final answer counts.
    assert check_answer(Example("Janet's ducks ...", "", "gsm8k", "She makes 9 * 2 = 18.\n#### 18"), "#### 18")


def test_prompt_files_take_the_first_present_keys(tmp_path):
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text('{"question": "Q1?", "answer": "so 3\\n#### 3"}\n\n{"question": "Q2?", "answer": "#### 4"}\n')
    prm = tmp_path / "prm.jsonl"
    prm.write_text('{"problem": "P1?", "answer": "\\\\frac{1}{2}", "task": "prm12k"}\n')
    prompts = read_prompt_files([gsm, prm], ("prompt", "question", "problem"), ("answer", "solution"))
    assert [(e.prompt, e.answer, e.task) for e in prompts] == [
        ("Q1?", "so 3\n#### 3", ""), ("Q2?", "#### 4", ""), ("P1?", "\\frac{1}{2}", "prm12k")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: no string field among \['prompt'\]"):
        read_prompt_files([bad])


STOPPED_EXAMPLES_PER_TASK = 16  # 48 answers, 12 batches: stopped after 6 lines, most of the run is left


def _stop_recipe(folder: Path, out: Path) -> Path:
    """The stopped runs' recipe: 48 answers (16 per task) in batches of 4, written to `out`."""
    recipe = folder / "distill.toml"
    recipe.write_text(textwrap.dedent(f"""
        [model]
        init_from = "{SHIPPED}"
        [distill]
        tasks = ["perm", "add", "pick3"]
        examples_per_task = {STOPPED_EXAMPLES_PER_TASK}
        dtype = "float32"
        sampler = {{ gen_length = 16, block_length = 16, steps = 16 }}
        batch_size = 4
        out = "{out}"
        [log]
        progress = false
    """))
    return recipe


@pytest.fixture(scope="module")
def uninterrupted_answers(tmp_path_factory):
    """The file one uninterrupted run of the stopped runs' recipe writes: the same for every way of
    stopping it, so made once (the answers do not depend on where they are written)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    out = folder / "straight.jsonl"
    done = subprocess.run(cli_command("distill", "generate", _stop_recipe(folder, out)), capture_output=True,
                          text=True, env=cli_env())
    assert done.returncode == 0, done.stderr
    return out.read_bytes()


@pytest.mark.slow  # two fresh processes each (and one uninterrupted run for both), each loading JAX and compiling
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_a_stopped_run_resumes_exactly(signum, uninterrupted_answers, tmp_path):
    killed = tmp_path / "killed.jsonl"
    total = 3 * STOPPED_EXAMPLES_PER_TASK
    env = cli_env()
    command = cli_command("distill", "generate", _stop_recipe(tmp_path, killed))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if killed.is_file() and killed.read_text().count("\n") >= 6:
            break
        time.sleep(0.01)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    written = killed.read_text().count("\n")
    assert 6 <= written < total, "the run was not interrupted part-way: make it longer"
    if signum == signal.SIGTERM:  # the batches' lines are whole, and the one line says how many
        assert proc.returncode == 143 and "Traceback" not in err, err
        assert err.strip().splitlines()[-1] == (f"jaxdllm distill: interrupted; {written} answers kept in {killed}; "
                                                "the same command resumes after the last finished batch")
        assert written % 4 == 0
    else:
        with killed.open("a") as f:
            f.write('{"index": 999, "prompt": "perm 12')     # and a line cut short by the kill
    done = subprocess.run(command, capture_output=True, text=True, env=env)  # resume
    assert done.returncode == 0, done.stderr
    assert killed.read_bytes() == uninterrupted_answers  # as one uninterrupted run
    assert len(_lines(killed)) == total


def test_resume_refuses_other_settings_and_foreign_files(teacher, tmp_path):
    model, tok = teacher
    examples = make_mixture(["perm"], 4, seed=0)
    out = tmp_path / "t.jsonl"
    generate_answers(model, tok, examples, ONE_TOKEN_PER_STEP, out, batch_size=4, progress=False)
    with pytest.raises(DataError, match="other settings.*sampler"):
        generate_answers(model, tok, examples, ONE_TOKEN_PER_STEP.replace(steps=8), out, batch_size=4, progress=False)
    foreign = tmp_path / "mine.jsonl"
    foreign.write_text('{"prompt": "x", "answer": "y"}\n')
    with pytest.raises(DataError, match="not written by"):
        generate_answers(model, tok, examples, ONE_TOKEN_PER_STEP, foreign, batch_size=4, progress=False)
    with pytest.raises(DataError, match="empty"):
        generate_answers(model, tok, [], ONE_TOKEN_PER_STEP, tmp_path / "e.jsonl", progress=False)


@pytest.mark.slow  # distil, train and generate end to end: ~25 s
def test_distill_train_generate_commands(tmp_path, capsys):
    """The README's three commands at smoke size: teacher answers, certainty-forcing training
    (LoRA), then the exported model decodes with the dParallel preset."""
    recipe = tmp_path / "dparallel.toml"
    recipe.write_text(textwrap.dedent(f"""
        [model]
        init_from = "{SHIPPED}"
        attention_impl = "xla"
        [distill]
        tasks = ["perm", "copy"]
        examples_per_task = 8
        dtype = "float32"
        sampler = {{ gen_length = 16, block_length = 16, steps = 16 }}
        batch_size = 8
        out = "{tmp_path / 'teacher.jsonl'}"
        [data]
        source = "teacher"
        batch_size = 8
        [objective]
        kind = "certainty_forcing"
        block_length = 16
        [lora]
        rank = 4
        alpha = 4.0
        [optim]
        lr = 1e-4
        schedule = "constant"
        [train]
        steps = 2
        [log]
        every = 1
        progress = false
        agreement_every = 2
        agreement_prompts = 8
        agreement_fast = {{ preset = "dparallel", entropy_threshold = 0.5 }}
    """))
    assert main(["distill", "generate", str(recipe)]) == 0
    assert "kept 100.0%" in capsys.readouterr().out
    assert main(["train", str(recipe), "--workdir", str(tmp_path / "run"), "--export", str(tmp_path / "model")]) == 0
    metrics = _lines(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2] and all(m["entropy"] > 0 for m in metrics[1:])
    # Before any update the student is the teacher: greedy decoding with the teacher's sampler
    # writes every one of its answers again, in 16 forwards each.
    assert metrics[0]["teacher_agreement"] == 1.0 and metrics[0]["teacher_sampler_nfe"] == 16.0
    assert 1 <= metrics[0]["fast_nfe"] < 16 and 0 <= metrics[0]["fast_agreement"] <= 1
    assert "teacher_agreement" not in metrics[1] and 0 <= metrics[2]["teacher_agreement"] <= 1
    capsys.readouterr()
    assert main(["generate", "--model", str(tmp_path / "model"), "--preset", "dparallel",
                 "--prompt", "perm 4312="]) == 0
    out = capsys.readouterr()
    assert sorted(out.out.strip()) == sorted("4312"), out
    assert "[nfe" in out.err


def test_agreement_settings_are_checked():
    from jaxdllm.errors import ConfigError
    from jaxdllm.train.agreement import agreement_from_recipe
    from jaxdllm.train.config import TrainConfig

    base = {"model": {"init_from": str(SHIPPED)}, "distill": {"tasks": ["copy"]},
            "data": {"source": "teacher"}, "objective": {"kind": "certainty_forcing"}}
    for log, match in (({"every": 25, "agreement_every": 30}, "multiple of"),
                       ({"agreement_every": -1}, ">= 0"),
                       ({"agreement_every": 50, "agreement_fast": {"preset": "nope"}}, "nope"),
                       ({"agreement_every": 50, "agreement_fast": {"entropy_treshold": 0.5}}, "entropy_treshold")):
        with pytest.raises(ConfigError, match=match):
            TrainConfig.from_dict({**base, "log": log})
    plain = TrainConfig.from_dict({"model": {"preset": "tiny-llada"}, "log": {"agreement_every": 50}})
    with pytest.raises(ConfigError, match="source = \"teacher\""):
        agreement_from_recipe(plain, Tokenizer.from_pretrained(SHIPPED))
    assert agreement_from_recipe(TrainConfig.from_dict(base), None) is None  # off by default
