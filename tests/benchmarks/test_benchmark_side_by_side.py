"""CPU smoke test of `sampling/benchmarks/benchmark_side_by_side.py`: jaxdllm and the PyTorch eager port on the
same tiny fp32 weights give the same answers, the sharpened LM head makes the threshold policy
commit several tokens per forward, and every column and the on-paper TPU rows are written."""

import json

import numpy as np
import pytest

from support.llada_reference import make_llada_checkpoint
from support.optional import lazy, torch
from support.sampler_fixtures import HEAD_SCALE, MASK_ID

from sampling.benchmarks.benchmark_side_by_side import COLUMNS, DECODERS, TPUS, PortModel, main

torch_llada = lazy("sampling.torch_reference.torch_llada")
torch_port = lazy("sampling.torch_reference.torch_port")


@pytest.mark.slow  # a whole benchmark run at tiny size (~15 s)
def test_tiny_run_writes_every_column_and_matches_the_port(tmp_path):
    out = tmp_path / "side_by_side"
    rc = main(["--size", "tiny", "--rows", "fast-dllm-parallel", "fast-dllm-dual", "--batches", "1", "2",
               "--gen-length", "32", "--reps", "1", "--no-torch-compile", "--torch-threads", "1",
               "--out", str(out)])
    assert rc == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert result["gen_length"] == 32 and result["prompt_len"] == 16
    assert result["head_scale"] > 1 and "LM head" in result["weights"]
    assert "lower bounds" in result["tpu_assumptions"]["note"]
    rows = result["rows"]
    assert [r["row"] for r in rows] == ["fast-dllm-parallel-b1", "fast-dllm-parallel-b2",
                                        "fast-dllm-dual-b1", "fast-dllm-dual-b2"]
    for r in rows:
        assert "error" not in r, r
        assert list(r["decoders"]) == list(DECODERS)
        assert r["decoders"]["torch_compile"] == {"skipped": "--no-torch-compile"}
        jax_cols, port = r["decoders"]["jaxdllm"], r["decoders"]["torch_eager"]
        for cols in (jax_cols, port):
            assert set(COLUMNS) <= set(cols), set(COLUMNS) - set(cols)
            assert cols["ms_per_step"] > 0 and cols["tokens_per_s"] > 0 and 0 < cols["mfu"]
            assert cols["x_floor"] > 0 and cols["first_call_s"] > 0
        # fp32 on CPU: the same answers, the same forwards (jaxdllm's derived from its commits)
        assert jax_cols["tokens_equal_port"] is True and jax_cols["rows_equal_fraction"] == 1.0, r["row"]
        assert jax_cols["nfe"] == port["nfe"] and jax_cols["forwards"] == port["forwards"], r["row"]
        assert jax_cols["flops_per_step"] == pytest.approx(port["flops_per_step"])
        # the sharpened head: the threshold policy commits several tokens per forward
        assert r["policy"] == "threshold" and jax_cols["tokens_per_forward"] > 1.5, r["row"]
        assert r["jax_over_port_tokens_per_s"] > 0 and r["jax_over_compile_tokens_per_s"] is None
        assert set(r["tpu"]) == set(TPUS)
        for est in r["tpu"].values():
            assert est["ms_per_step"] > 0 and est["tokens_per_s"] > 0
    assert result["summary"]["jaxdllm_rows_equal_port"] == 1.0


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_batched_entropy_loop_equals_the_port_per_row(tmp_path, cache):
    """The batched dParallel loop of the benchmark equals `torch_port.generate(policy="entropy")`
    on each row alone, and the forwards it records match the rows' NFE."""
    make_llada_checkpoint(tmp_path, head_scale=HEAD_SCALE)
    model = PortModel(torch_llada.TorchLLaDA.from_pretrained(tmp_path).eval(), MASK_ID)
    prompts = torch.as_tensor(np.random.RandomState(5).randint(0, 120, (3, 6)), dtype=torch.long)
    kw = dict(gen_length=16, block_length=8, steps=16, mask_id=MASK_ID, entropy_threshold=0.5, cache=cache)
    out = torch_port.generate_batch(model, prompts, policy="entropy", **kw)
    assert len(model.calls) >= int(out["nfe"].max()) and int(out["nfe"].min()) < 16
    for i in range(len(prompts)):
        ref = torch_port.generate(model, prompts[i:i + 1], policy="entropy", **kw)
        torch.testing.assert_close(out["tokens"][i], ref["tokens"][0], rtol=0, atol=0)
        assert int(out["nfe"][i]) == ref["nfe"]
