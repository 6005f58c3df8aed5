"""`sampling/benchmarks/benchmark_gpu_scale.py`: the bandwidth floor's weight bytes agree with the
configs' own parameter counts, and (slow) a tiny run gives the PyTorch counterparts' tokens on the
weights handed over in memory, records what it cannot run, and stops at its time budget."""

import json

import pytest

from jaxdllm.models.config import ModelConfig
from sampling.benchmarks.benchmark_gpu_scale import MODELS, main, markdown, step_weight_bytes


@pytest.mark.parametrize("name", ["llada-8b", "qwen2.5-7b", "llada2-mini", "diffusiongemma-26b-a4b"])
def test_step_weight_bytes_between_the_active_and_all_parameters(name):
    c = ModelConfig.preset(name)
    lookup = 0 if c.tie_embeddings else c.vocab_size * c.embed_dim
    if c.experts is None:
        assert step_weight_bytes(c, 2, 1) == step_weight_bytes(c, 2, 4096) == 2 * (c.num_params - lookup)
        return
    # one token reads the experts it picks; a long canvas reads every expert
    assert step_weight_bytes(c, 2, 1) == pytest.approx(2 * (c.active_params - lookup), rel=1e-6)
    assert step_weight_bytes(c, 2, 100_000) == pytest.approx(2 * (c.num_params - lookup), rel=1e-6)
    assert step_weight_bytes(c, 2, 1) < step_weight_bytes(c, 2, 32) < step_weight_bytes(c, 2, 256)


@pytest.mark.slow  # a tiny run of three models on both sides (~30 s)
def test_tiny_run_matches_pytorch_and_records_what_it_skips(tmp_path):
    out = tmp_path / "scale"
    assert main(["--size", "tiny", "--models", "llada-8b", "qwen2.5-7b", "diffusiongemma-26b-a4b",
                 "--batches", "2", "--reps", "1", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert out.with_suffix(".png").is_file()
    rows = {(r["model"], r["row"]): r for r in data["rows"]}
    expected = {(m, r.name) for m in ("llada-8b", "qwen2.5-7b", "diffusiongemma-26b-a4b") for r in MODELS[m].rows}
    assert set(rows) == expected
    for key in [("qwen2.5-7b", "transformers greedy"), ("diffusiongemma-26b-a4b", "transformers generate")]:
        r = rows[key]
        assert "error" not in r and r["tokens_equal"], r  # fp32 on a CPU: the same tokens as jaxdllm's row
        assert rows[(key[0], r["pairs"])]["vs_pytorch"] == pytest.approx(
            rows[(key[0], r["pairs"])]["tokens_per_s"] / r["tokens_per_s"])
    assert rows[("diffusiongemma-26b-a4b", "diffusiongemma pallas-experts")]["tokens_equal"]
    for name in ("fast-dllm generate", "fast-dllm dual cache"):  # no published checkout given
        assert rows[("llada-8b", name)]["skipped"].startswith("no Fast-dLLM checkout")
    for r in data["rows"]:
        if r["side"] == "jaxdllm":
            assert "error" not in r, r
            assert r["steps"] > 0 and r["x_floor"] > 0 and r["peak_gb"] > 0 and r["compile_s"] is not None
    assert "| qwen2.5-7b | ar | 2 |" in markdown(data)

    spent = tmp_path / "spent"
    assert main(["--size", "tiny", "--models", "qwen2.5-7b", "--budget-s", "0", "--out", str(spent)]) == 0
    skipped = json.loads(spent.with_suffix(".json").read_text())["rows"]
    assert skipped and all(r["skipped"].startswith("time budget") for r in skipped)
