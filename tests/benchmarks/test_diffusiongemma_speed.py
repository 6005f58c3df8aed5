"""`sampling/benchmarks/diffusiongemma_speed.py`: the scaled shapes keep the published proportions and
survive the config.json round trip, `--real-shape` is refused where it cannot run, transformers'
outputs become the same columns as jaxdllm's, and (slow) a tiny run writes every column with both
sides giving the same tokens and forwards."""

import json

import numpy as np
import pytest

from jaxdllm.models.families.diffusion_gemma import config_from_hf, published_layer_types
from sampling.benchmarks.diffusiongemma_speed import (COLUMNS, SHAPES, SIDES, describe, hf_config_dict, hf_result,
                                                      main, make_model, markdown, refuse_real_shape, side_columns,
                                                      size_config)
from sampling.benchmarks.timing import Timing
from support.optional import require, torch, transformers


@pytest.mark.parametrize("size", [s for s in SHAPES if s != "tiny"])
def test_scaled_shapes_keep_the_published_proportions(size):
    real, c = size_config("real"), size_config(size)
    assert c.gemma4.layer_types == published_layer_types(c.num_layers)
    assert real.gemma4.layer_types == published_layer_types(real.num_layers)
    for config in (real, c):
        g, e = config.gemma4, config.experts
        assert config.num_heads == 2 * config.num_kv_heads == 8 * g.full_kv_heads
        assert g.full_head_dim == 2 * config.head_dim
        assert 4 * config.mlp_dim == 3 * config.embed_dim and 4 * e.expert_dim == config.embed_dim
        assert e.num_experts == 16 * e.experts_per_token
    # everything else as published
    assert (c.gemma4.full_rope_theta, c.gemma4.final_softcap, c.rope_theta) == \
           (real.gemma4.full_rope_theta, real.gemma4.final_softcap, real.rope_theta)
    assert c.num_params < 5e8  # a few hundred million at most: minutes on a CPU


@pytest.mark.parametrize("size", list(SHAPES) + ["real"])
def test_transformers_config_reads_back_as_the_same_shape(size):
    c = size_config(size)
    raw = hf_config_dict(c)
    assert raw["model_type"] == "diffusion_gemma" and raw["canvas_length"] == c.block_size
    back = config_from_hf(json.loads(json.dumps(raw)), "test")  # as written to config.json
    assert describe(back) == describe(c)
    if size == "real":
        assert round(c.num_params / 1e7) == 2525  # 25.25B text parameters
        assert (raw["text_config"]["hidden_size"], raw["text_config"]["num_experts"]) == (2816, 128)


def test_real_shape_builds_in_bf16_with_the_published_parameter_count():
    """`--real-shape`'s transformers model, made on the meta device (no memory)."""
    require("torch"), require("transformers")  # make_model imports them inside
    c = size_config("real")
    model = make_model(c, "bfloat16", "meta", seed=0)
    assert isinstance(model, transformers.DiffusionGemmaForBlockDiffusion)
    text = {n: p for n, p in model.named_parameters() if "vision" not in n}
    # jaxdllm counts the 2 x 30 layer scalars, buffers in transformers
    assert sum(p.numel() for p in text.values()) + 2 * c.num_layers == c.num_params
    assert {p.dtype for p in text.values()} == {torch.bfloat16} and torch.get_default_dtype() == torch.float32
    layers = model.model.decoder.layers
    assert layers[0].self_attn.k_proj.weight.shape == (8 * 256, 2816)   # sliding: 8 K/V heads of 256
    assert layers[5].self_attn.k_proj.weight.shape == (2 * 512, 2816)   # full: 2 K/V heads of 512


def test_real_shape_is_refused_where_it_cannot_run(tmp_path):
    c = size_config("real")
    ok = refuse_real_shape("gpu", int(141e9), int(200e9), c)
    assert ok is None
    assert "jax backend is 'cpu'" in refuse_real_shape("cpu", None, int(200e9), c)
    assert "H200" in refuse_real_shape("gpu", int(80e9), int(200e9), c)
    assert "free" in refuse_real_shape("gpu", int(141e9), int(30e9), c)
    require("torch"), require("transformers")  # without them the benchmark stops before it looks for a GPU
    with pytest.raises(SystemExit, match="runs on one GPU"):  # this machine: no GPU, before any model is made
        main(["--real-shape", "--out", str(tmp_path / "x")])
    assert not list(tmp_path.iterdir())


def test_transformers_output_as_columns():
    # two rows: one stopped at EOS in its second canvas (pad after), the output cut short at 2 of 3 canvases
    sequences = np.array([[7, 7, 5, 6, 1, 0], [7, 7, 5, 6, 8, 9]])
    out = hf_result(sequences, np.array([3 / 5, 4 / 6]), prompt_len=2, gen_length=6, forwards=7)
    assert out["tokens"].tolist() == [[5, 6, 1, 0, 0, 0], [5, 6, 8, 9, 0, 0]]
    assert out["nfe"] == [5, 6] and out["forwards"] == 7
    cols = side_columns(Timing(2.0, (0.5, 0.25, 1.0), None), out["tokens"], out["nfe"], out["forwards"])
    assert set(cols) == set(COLUMNS)
    assert cols["median_s"] == 0.5 and cols["tokens_per_s"] == 7 / 0.5 and cols["nfe"] == 5.5
    assert cols["tokens_per_forward"] == 7 / 11 and cols["ms_per_forward"] == pytest.approx(500 / 7)
    # a row with no token has no NFE to recover from tokens per forward
    empty = hf_result(np.array([[7, 0, 0]]), np.array([0.0]), prompt_len=1, gen_length=2, forwards=3)
    assert empty["nfe"] == [None]
    assert side_columns(Timing(1.0, (1.0,), None), empty["tokens"], empty["nfe"], 3)["nfe"] is None


@pytest.mark.slow  # the tiny size on both sides, two batches (~25 s)
def test_tiny_run_writes_every_column_and_both_sides_agree(tmp_path):
    out = tmp_path / "dg_speed"
    assert main(["--sizes", "tiny", "--batch", "1", "2", "--repeats", "1", "--torch-threads", "1",
                 "--out", str(out)]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert {"device", "jax", "torch", "torch_threads", "transformers"} <= set(result)
    assert result["shapes"]["tiny"]["layer_types"] == "ssFF" and result["shapes"]["tiny"]["gen_length"] == 16
    assert [r["row"] for r in result["rows"]] == ["tiny-b1", "tiny-b2"]
    for r in result["rows"]:
        assert "error" not in r, r
        for side in SIDES:
            cols = r["sides"][side]
            assert set(COLUMNS) <= set(cols) and cols["tokens_per_s"] > 0 and cols["first_call_s"] > 0
        # argmax and shared draws: the same work on both sides
        assert r["tokens_equal"] and r["nfe_equal"], r
        assert r["sides"]["jaxdllm"]["forwards"] == r["sides"]["transformers"]["forwards"]
    assert "| tiny | 2 | transformers |" in markdown(result)
