"""A training job across processes, through the command line as users run it: `jaxdllm launch`
starts the processes, `jaxdllm train` joins them. One run is taken through everything a long job
meets: a process killed mid-training (the launcher names it and stops the others within a bound),
an interrupted checkpoint write left behind, a restart that resumes from the last complete
checkpoint with fsdp over both processes, then two changes of topology (2 processes x 2 devices ->
1 x 4 -> 4 x 1 with tensor parallelism across the processes). Its
per-step losses and final weights equal one uninterrupted single-process run on the same 4 devices.

Tolerance: every topology computes the same global batch over 4 devices; only the order in which
the per-device partial sums of the batch mean and the gradients are added differs (gloo across
processes, XLA's all-reduce within one), about 1e-7 relative per step in float32, so losses are
compared at rtol 1e-5 and weights at rtol 1e-4 (Adam's normalisation amplifies the last bits over
the steps, still far below what one step changes).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

REPO = Path(__file__).resolve().parents[2]
RECIPE = """
[model]
preset = "tiny-llada"
embed_dim = 32
num_layers = 1
num_heads = 2
num_kv_heads = 2
head_dim = 16
mlp_dim = 64
max_position = 64
attention_impl = "xla"

[data]
source = "tasks"
tasks = ["copy", "reverse"]
examples_per_task = 400
seq_len = 32
batch_size = 16

[optim]
lr = 3e-3
warmup_steps = 2
schedule = "cosine"

[train]
steps = 400

[checkpoint]
every = 2
keep = 3

[log]
every = 1
progress = false
"""
LOST_BOUND_S = 60  # from the kill to the launcher's exit: the grace (5 s) plus the slowest process's stop


def _env(devices: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXDLLM_")}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"  # not conftest's 8 devices
    env["JAX_PLATFORMS"] = "cpu"
    env["JAXDLLM_HEARTBEAT_TIMEOUT_S"] = "10"
    return env


def _jaxdllm(args: list[str], devices: int, processes: int = 1, **popen) -> subprocess.Popen:
    cli = [sys.executable, "-m", "jaxdllm.cli"]
    if processes > 1:
        cli += ["launch", "-n", str(processes), "--devices-per-process", str(devices), "--grace", "5", "--", *cli]
    return subprocess.Popen(cli + args, env=_env(devices), cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **popen)


def _run(args, devices, processes=1, timeout=400) -> str:
    proc = _jaxdllm(args, devices, processes)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"{args} on {processes}x{devices}: rc {proc.returncode}\n{out}\n{err}"
    return out + err


def _metrics(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _children(pid: int) -> dict[int, int]:
    """`{JAXDLLM_PROCESS_ID: pid}` of the processes `pid` launched."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != pid:
                continue
            env = dict(item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item)
        except (OSError, IndexError, ValueError):
            continue
        if "JAXDLLM_PROCESS_ID" in env:
            found[int(env["JAXDLLM_PROCESS_ID"])] = int(entry.name)
    return found


def _complete_steps(workdir: Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.slow  # 10 processes start and compile the train step: about 2-3 minutes on 2 cores
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the launched processes in /proc")
def test_killed_resumed_and_moved_across_topologies_equals_one_uninterrupted_run(tmp_path):
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(RECIPE)
    run = tmp_path / "run"
    train = ["train", str(recipe), "--workdir", str(run)]

    # 1. 2 processes x 2 devices; process 1 is killed once a few steps are checkpointed.
    job = _jaxdllm(train, devices=2, processes=2)
    deadline = time.monotonic() + 300
    while not ((run / "checkpoints").is_dir() and any(s >= 4 for s in _complete_steps(run))):
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.05)
    os.kill(_children(job.pid)[1], signal.SIGKILL)
    killed = time.monotonic()
    out, err = job.communicate(timeout=LOST_BOUND_S + 30)
    assert time.monotonic() - killed < LOST_BOUND_S
    assert job.returncode == 128 + signal.SIGKILL, err
    assert "jaxdllm launch: process 1 of 2 was killed by SIGKILL; stopping the other 1" in err.splitlines()
    last = _complete_steps(run)[-1]
    # A write interrupted by the kill (or planted here, where the kill fell between two writes) is
    # left as orbax's temporary folder and never taken for a checkpoint.
    partial = run / "checkpoints" / f"{last + 1}.orbax-checkpoint-tmp-1700000000"
    if not any(p.name.startswith(f"{last + 1}.") for p in (run / "checkpoints").iterdir()):
        (partial / "state").mkdir(parents=True)
        (partial / "state" / "_METADATA").write_text("{")  # half written

    # 2. The same job restarted: it resumes from the last complete checkpoint, now with the
    # parameters sharded over an fsdp axis that spans both processes (the checkpoint's shards are
    # written by the processes that hold them).
    out = _run(train + ["--steps", str(last + 2), "--set", "mesh.data=1", "--set", "mesh.fsdp=4"],
               devices=2, processes=2)
    assert f"resumed from step {last} in {run}" in out
    # 3. and 4. Continued on one process with 4 devices, then on 4 processes of one device each.
    out = _run(train + ["--steps", str(last + 4)], devices=4)
    assert f"resumed from step {last + 2}" in out
    # (4 x 1 with tensor parallelism over the 4 processes: every process feeds the whole batch)
    out = _run(train + ["--steps", str(last + 6), "--export", str(run / "model"), "--set", "mesh.data=1",
                        "--set", "mesh.tensor=4"], devices=1, processes=4)
    assert f"resumed from step {last + 4}" in out

    # One uninterrupted run on 1 process x 4 devices.
    ref = tmp_path / "ref"
    _run(["train", str(recipe), "--workdir", str(ref), "--steps", str(last + 6), "--export", str(ref / "model")],
         devices=4)

    got, want = _metrics(run), _metrics(ref)
    assert [r["step"] for r in got] == list(range(1, last + 7))  # each step logged once, none lost or repeated
    assert [r["step"] for r in want] == list(range(1, last + 7))
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose([r[key] for r in got], [r[key] for r in want], rtol=1e-5, err_msg=key)
    assert len({round(r["loss"], 4) for r in got}) > 1  # it trained
    a, b = (load_file(str(next((d / "model").glob("*.safetensors")))) for d in (run, ref))
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-6, err_msg=name)
    # The exported folder is whole: the weights above, and the side files process 0 writes.
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (run / "model" / name).is_file(), name
