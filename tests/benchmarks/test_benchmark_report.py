"""The benchmarks' shared plumbing: `sampling/benchmarks/report.py` writes the JSON with the
machine's facts and the PNG together; `sampling/benchmarks/timing.py` warms up, then times."""

import json

import jax
import numpy as np

from sampling.benchmarks.report import device_facts, write_report
from sampling.benchmarks.timing import timed

FACTS = ("device", "platform", "device_count", "jax", "jaxlib", "python", "cpu_count", "cpu_affinity")


def _plot(data, path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([r["x"] for r in data["rows"]])
    ax.set_title(data["device"])
    fig.savefig(path)


def test_report_writes_json_with_device_facts_and_png(tmp_path):
    result = {"rows": [{"x": 1.0}, {"x": 2.0}], "jax": "kept"}  # a script's own key wins
    data = write_report(tmp_path / "sub" / "bench.json", result, _plot)
    written = json.loads((tmp_path / "sub" / "bench.json").read_text())
    assert (tmp_path / "sub" / "bench.png").stat().st_size > 0
    assert written == data and set(FACTS) <= set(written)
    assert written["device"] == jax.devices()[0].device_kind and written["device_count"] == jax.device_count()
    assert written["platform"] == jax.devices()[0].platform and written["jax"] == "kept"
    assert written["rows"] == result["rows"] and data["rows"] is result["rows"]


def test_report_without_plot_or_backend(tmp_path):
    """JSON only; facts given (from a child process) are written as they are."""
    write_report(tmp_path / "a.b", {"rows": []}, facts={"device": "child's"})  # a dotted stem keeps its dot
    assert json.loads((tmp_path / "a.b.json").read_text()) == {"device": "child's", "rows": []}
    assert not (tmp_path / "a.b.png").exists()
    assert set(FACTS) <= set(device_facts())


def test_timed_warms_up_then_times_each_sample():
    calls = []
    f = jax.jit(lambda x: x + 1)

    def fn():
        calls.append(1)
        return f(np.float32(len(calls)))

    t = timed(fn, warmup=2, repeats=3, iters=4)
    assert len(calls) == 2 + 3 * 4 and len(t.samples_s) == 3 and float(t.out) == len(calls) + 1
    assert t.first_s > 0 and 0 < t.min_s <= t.median_s
    cold = timed(lambda: None, warmup=0, repeats=1)
    assert cold.first_s is None and cold.out is None
