"""`sampling/benchmarks/benchmark_first_call.py` at tiny size: three fresh processes per preset, and the
persistent cache is what makes the third one load instead of compile (JAX's own hit/miss events)."""

import json

import pytest

from sampling.benchmarks.benchmark_first_call import MODES, main


@pytest.mark.slow  # three fresh interpreters (~12 s)
def test_warm_process_loads_what_the_cold_one_wrote(tmp_path):
    out = tmp_path / "first_call"
    assert main(["--size", "tiny", "--presets", "fast-dllm-dual", "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    (row,) = result["rows"]
    for mode in MODES:
        assert "error" not in row[mode], row[mode]
    assert row["off"]["cache_folder"] is None and row["off"]["cache_hits"] == row["off"]["cache_misses"] == 0
    assert row["cold"]["cache_misses"] > 0 and row["cold"]["cache_hits"] == 0
    assert row["warm"]["cache_hits"] == row["cold"]["cache_misses"] and row["warm"]["cache_misses"] == 0
