"""Multi-process training on one machine: every recipe kind trained by two CPU processes of one
`jaxdllm.distributed` job (gloo collectives, one device each) equals the same recipe trained by one
process with 2 devices (same global batch, same device count), and mdm_sft also one device.

The kinds: mdm_sft, LoRA (mdm_sft on adapters), dParallel's certainty forcing (on the teacher
answers `jaxdllm distill generate` wrote over the same job), Jacobi Forcing (on the trajectories
`jaxdllm distill trajectories` wrote over the same job), Medusa heads and DiffusionGemma's
uniform block diffusion. Each job's distillation file must be byte for byte the one-process job's,
written once (process 0). The teachers are random tiny checkpoints this test writes first.

Each distributed process builds the same global batch and keeps its half
(`BatchConfig(num_shards=2, shard_index=i)`), and `make_array_from_process_local_data` assembles
the global batch, so the runs see identical data. The worker is `tests/train/multihost_worker.py`:
one invocation per process trains every kind one after another (JAX's import and the job's
gloo setup happen once). The three processes run concurrently (the two distributed ones must),
each with its own `XLA_FLAGS` device count (not the 8 fake devices of `conftest.py`).
"""

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

WORKER = Path(__file__).with_name("multihost_worker.py")
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240
RECIPES = ("mdm_sft", "lora", "certainty_forcing", "jacobi_forcing", "medusa", "diffusiongemma")
DISTILLED = ("teacher.jsonl", "trajectories.jsonl")  # certainty forcing's and Jacobi Forcing's inputs
SUMS = ("param_sum", "param_abs_sum", "trained_sum", "trained_abs_sum")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict:
    env = dict(os.environ)
    # conftest's other XLA flags (quick CPU compiles: same programs, same float semantics) are kept
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", "")).strip()
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    # conftest's persistent compilation cache: a second run loads the programs (~40% less time).
    # (JAX's jax_share_binary_between_hosts, process 0 compiling for both, hung the gloo setup here.)
    if jax.config.jax_compilation_cache_dir:
        env["JAX_COMPILATION_CACHE_DIR"] = str(jax.config.jax_compilation_cache_dir)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(jax.config.jax_persistent_cache_min_compile_time_secs)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _launch(out: Path, devices: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), str(out), *extra], env=_env(devices), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(runs: dict[str, tuple[subprocess.Popen, Path]]) -> dict[str, dict]:
    """Wait for every run (killing all on a timeout); fail with each one's output if any failed."""
    logs, failed = {}, []
    for name, (proc, _) in runs.items():
        try:
            stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
            if proc.returncode != 0:
                failed.append(f"{name} exited with {proc.returncode}")
        except subprocess.TimeoutExpired:
            for other, _ in runs.values():  # a stuck process would leave its peer waiting too
                if other.poll() is None:
                    other.kill()
            stdout, stderr = proc.communicate()
            failed.append(f"{name} timed out after {TIMEOUT_S} s")
        logs[name] = f"--- {name} (rc {proc.returncode}) stdout:\n{stdout}\n--- {name} stderr:\n{stderr}"
    if failed:
        raise AssertionError("; ".join(failed) + "\n" + "\n".join(logs.values()))
    return {name: json.loads(out.read_text()) for name, (_, out) in runs.items()}


def _write_teachers(folder: Path) -> Path:
    spec = importlib.util.spec_from_file_location("multihost_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    for kind in worker.TEACHERS:
        worker.write_teacher(folder / kind, kind)
    return folder


# 3 processes, each compiling 6-7 train steps (and 2 decoding loops): 45 s on 2 idle CPU cores (26 s with
# conftest's compilation cache warm), 137 s on 2 cores at load 14
@pytest.mark.slow
def test_every_recipe_kind_trains_the_same_in_two_processes_as_in_one(tmp_path):
    teachers = str(_write_teachers(tmp_path / "teachers"))
    port = str(_free_port())
    jobs = {"two_processes": tmp_path / "two_processes", "two_devices": tmp_path / "two_devices"}
    runs = {f"process{i}": (tmp_path / f"process{i}.json", 1,
                            ("--workdir", str(jobs["two_processes"]), "--port", port, "--process-id", str(i),
                             "--num-processes", "2"))
            for i in range(2)}
    # the same process also trains mdm_sft on one of its devices (the 1-device reference)
    runs["two_devices"] = (tmp_path / "two_devices.json", 2, ("--workdir", str(jobs["two_devices"]),
                                                              "--one-device", "mdm_sft"))
    results = _finish({name: (_launch(out, devices, "--teachers", teachers, *extra), out)
                       for name, (out, devices, extra) in runs.items()})
    p0, p1, two = (results[k] for k in ("process0", "process1", "two_devices"))

    # The cluster formed: 2 processes x 1 device, a 2-way data mesh, each process feeding half the batch.
    for i, r in enumerate((p0, p1)):
        assert (r["process_index"], r["process_count"], r["device_count"], r["local_device_count"]) == (i, 2, 2, 1)
    assert (two["process_count"], two["device_count"]) == (1, 2)
    for r, rows in ((p0, 4), (p1, 4), (two, 8)):
        assert list(r["recipes"]) == list(RECIPES)
        for name, run in r["recipes"].items():
            assert run["mesh"] == {"data": 2, "fsdp": 1, "tensor": 1} and run["rows_per_process"] == rows, name
            assert run["steps"] == [1, 2, 3], name
    one = two["one_device"]["mdm_sft"]
    assert one["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1} and one["rows_per_process"] == 8
    assert one["steps"] == [1, 2, 3]

    # The distillation files: written once (by process 0, each prompt one line, in order), and
    # byte for byte what the one-process job wrote; so are their statistics.
    for name in DISTILLED:
        mine, reference = (jobs[j] / name for j in ("two_processes", "two_devices"))
        lines = [json.loads(line) for line in mine.read_text().splitlines()]
        assert [r["index"] for r in lines] == list(range(16)), name
        assert mine.read_bytes() == reference.read_bytes(), name
        stats = [json.loads(Path(f"{p}.stats.json").read_text())["tasks"] for p in (mine, reference)]
        assert stats[0] == stats[1], name

    # Tolerances. Same global batch, same device count, same reduction: the 2-process run equals
    # the 2-device run (in practice bit for bit: gloo sums the 2 per-device partials just as the
    # in-process all-reduce does, and every other op is the same per-device program); rtol 1e-6
    # leaves room for a reordered 2-term float32 sum (~1 ulp, 6e-8) compounded over 3 steps. Against
    # 1 device the reduction order of the batch mean differs (~1e-7 relative): rtol 1e-5.
    for name in RECIPES:
        mine, other, ref = p0["recipes"][name], p1["recipes"][name], two["recipes"][name]
        for key in ("losses", "grad_norms", *SUMS):  # both processes hold the same replicated values
            assert mine[key] == other[key], (name, key)
        np.testing.assert_allclose(mine["losses"], ref["losses"], rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(mine["grad_norms"], ref["grad_norms"], rtol=1e-6, err_msg=name)
        np.testing.assert_allclose([mine[k] for k in SUMS], [ref[k] for k in SUMS], rtol=1e-6, err_msg=name)
        # The model trained: the losses are not all equal, and what the optimiser updates moved.
        assert len(set(np.round(mine["losses"], 4))) > 1, name
        assert mine["trained_sum"] != mine["init_trained_sum"], name
    mdm = p0["recipes"]["mdm_sft"]
    for key in ("losses", "grad_norms"):
        np.testing.assert_allclose(mdm[key], one[key], rtol=1e-5)
    np.testing.assert_allclose([mdm[k] for k in SUMS], [one[k] for k in SUMS], rtol=1e-5)
