"""`jaxdllm generate` and `jaxdllm eval` as multi-process jobs (`jaxdllm launch`, 2 processes x 2
CPU devices) with the model sharded over every device of the job: the same tokens as one process
on one device, the answer printed and the results written once.

Decoding is argmax here (the default samplers), so equal tokens are the right comparison: the
sharded forwards differ from the one-device forward only in float32 reduction order, far below
the margins between the shipped model's top tokens on these prompts.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jaxdllm.eval.evaluate import without_timing

REPO = Path(__file__).resolve().parents[1]
MODEL = "tasks-llada-small"


def _jaxdllm(args, devices: int, processes: int = 1) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXDLLM_")}
    env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    cli = [sys.executable, "-m", "jaxdllm.cli"]
    if processes > 1:
        cli += ["launch", "-n", str(processes), "--devices-per-process", str(devices), "--", *cli]
    done = subprocess.run(cli + args, env=env, cwd=REPO, text=True, capture_output=True, timeout=400)
    assert done.returncode == 0, f"{args}: rc {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _gloo(line: str) -> bool:
    """gloo's connection notes (printed by two threads of one process, sometimes within one line)."""
    return "[Gloo]" in line or "peer ranks" in line


def _own_lines(text: str) -> list[str]:
    """Process 0's lines (the launcher prefixes the others'), without gloo's connection notes. Two threads'
    notes can interleave so that one note's last word, its peer count, lands on a line of its own: such a
    line is dropped once for each note left without its count."""
    own = [line for line in text.splitlines() if not line.startswith("[process ")]
    notes = [line for line in own if _gloo(line)]
    orphans = sum(line.count("[Gloo]") - len(re.findall(r"peer ranks is : \d", line)) for line in notes)
    counts = {word for line in notes for word in re.findall(r"connected to (\d+) peer ranks", line)}
    kept = []
    for line in own:
        if _gloo(line):
            continue
        if orphans and line.strip() in counts:
            orphans -= 1
            continue
        kept.append(line)
    return kept


@pytest.mark.slow  # 6 processes load the shipped model and compile the decoding loop: about a minute
def test_generate_and_eval_across_processes_equal_one_process(tmp_path):
    generate = ["generate", "--model", MODEL, "--prompt", "reverse 4821="]
    one = _jaxdllm(generate, devices=1)
    # fsdp over every device of the job (the multi-process default), and tensor parallel across the two processes
    for mesh in ([], ["--mesh", "data=1,fsdp=2,tensor=2"]):
        job = _jaxdllm(generate + mesh, devices=2, processes=2)
        assert _own_lines(job.stdout) == one.stdout.splitlines()  # the answer, printed once
        answer = one.stdout.strip()
        others = [line for line in (job.stdout + job.stderr).splitlines()
                  if line.startswith("[process 1]") and (answer in line or "[nfe" in line)]
        assert not others, others  # the other process decodes too, but prints nothing of it
        nfe = lambda text: next(line.split("|")[0] for line in _own_lines(text) if line.startswith("[nfe"))
        assert nfe(job.stderr) == nfe(one.stderr)

    evaluate = ["eval", "--model", MODEL, "--tasks", "copy,reverse", "--n", "6", "--batch-size", "4",
                "--no-progress"]
    _jaxdllm(evaluate + ["--out", str(tmp_path / "one")], devices=1)
    job = _jaxdllm(evaluate + ["--out", str(tmp_path / "job"), "--mesh", "data=2,fsdp=2"], devices=2, processes=2)
    assert sum(line.startswith("wrote ") for line in job.stdout.splitlines()) == 1
    assert not any("wrote" in line for line in job.stdout.splitlines() if line.startswith("[process 1]"))
    reports = {name: json.loads((tmp_path / name / "eval.json").read_text()) for name in ("one", "job")}
    assert without_timing(reports["job"]["results"]) == without_timing(reports["one"]["results"])
    items = {name: [json.loads(line) for line in (tmp_path / name / "items.jsonl").read_text().splitlines()]
             for name in ("one", "job")}
    assert len(items["job"]) == len(items["one"]) == 2 * 2 * 6  # every item once: 2 samplers x 2 tasks x 6
    decoded = lambda records: sorted((r["key"], r["id"], r["response"], r["nfe"]) for r in records)
    assert decoded(items["job"]) == decoded(items["one"])
