"""`sampling/benchmarks/benchmark_multihost.py` at its tiniest: step times and per-process load
memory on 1 process x 2 devices and 2 processes x 1 device, a 5 MiB checkpoint; the JSON has
every field the full run reports, every number positive and finite."""

import json
import math
import sys

import pytest

from sampling.benchmarks.benchmark_multihost import main

TOPOLOGIES = ["1x2", "2x1"]


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow  # two training jobs and two generate jobs in fresh interpreters (~40 s on 2 cores)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_tiny_run_reports_step_times_and_memory_per_process(tmp_path):
    out = tmp_path / "multihost"
    steps, warmup = 8, 3
    assert main(["--topologies", *TOPOLOGIES, "--load-topologies", *TOPOLOGIES, "--steps", str(steps),
                 "--warmup", str(warmup), "--embed", "64", "--ckpt-embed", "256", "--ckpt-mlp", "512",
                 "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert data["cpu_count"] >= 1 and data["jax"] and data["settings"]["train"]["steps"] == steps
    assert _positive(data["wall_s"])

    assert [r["topology"] for r in data["train"]] == TOPOLOGIES
    for r in data["train"]:
        assert len(r["step_ms"]) == steps - 1 and all(_positive(x) for x in r["step_ms"])
        for key in ("median_ms", "q1_ms", "q3_ms", "min_ms", "wall_s", "first_record_s", "ratio_to_reference",
                    "tokens_per_s_last", "final_loss"):
            assert _positive(r[key]), (key, r)
        assert r["q1_ms"] <= r["median_ms"] <= r["q3_ms"]
        assert r["reference"] == "1x2"
    assert data["train"][0]["ratio_to_reference"] == 1.0

    load = data["load"]
    ck = load["checkpoint"]
    assert ck["files"] == 1 and 0 < ck["largest_tensor_bytes"] < ck["tensor_bytes"] <= ck["file_bytes"]
    assert _positive(load["baseline"]["baseline_hwm"])
    assert [r["topology"] for r in load["rows"]] == TOPOLOGIES
    for row in load["rows"]:
        procs = row["per_process"]
        assert [p["process"] for p in procs] == list(range(row["processes"]))
        for p in procs:
            assert p["returncode"] == 0 and p["hwm_reset"] is True
            for key in ("import_hwm", "before_load_rss", "load_hwm", "command_hwm", "load_peak_anon",
                        "load_peak_file", "held_bytes", "model_bytes", "load_s", "load_hwm_above_baseline",
                        "command_hwm_above_baseline", "load_added"):
                assert _positive(p[key]), (key, p)
            assert p["command_hwm"] >= p["load_hwm"] >= p["before_load_rss"]
            assert p["model_bytes"] == ck["tensor_bytes"]  # every parameter loaded, in float32
            # fsdp over the job's 2 devices: a process of one device holds about half the model
            assert p["held_bytes"] <= p["model_bytes"] * p["local_devices"]
            if row["processes"] == 2:
                assert p["held_bytes"] < p["model_bytes"]
