"""Weight-only int8 (`quantization="int8"`): the quantized kernels against an absmax
quantization written here in numpy, the int8 model against a float model holding the rounded
weights, its logits against bf16 within a stated tolerance, and int8 through checkpoint import
(sharded and stacked), export and the command line."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdllm import ModelConfig, RunOptions, Transformer, sharding
from jaxdllm.checkpoint import from_pretrained, save_pretrained
from jaxdllm.models.quantize import quantize_kernel, quantize_weights
from support.cli import run_cli
from support.forward import forward

# The bf16 tolerance: int8 weights (bf16 compute) against the bf16 model, on random tiny models
# whose logits reach 0.6-0.7: at most 0.02 apart anywhere, 0.004 on average, and the same argmax
# at 97 % of positions or more (measured: max 0.008, mean 0.0012-0.0014, argmax 99.2-100 %).
BF16_MAX_ABS, BF16_MEAN_ABS, BF16_ARGMAX = 0.02, 0.004, 0.97


def _numpy_absmax(w: np.ndarray, contracted: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """int8 values and scales, one scale per output channel, as qwix documents symmetric int8:
    scale = max |w| over the contracted axes / 127.5 (every bucket up to 127 fully used), values
    rounded to nearest and clipped to [-128, 127]."""
    scale = np.abs(w).max(axis=contracted, keepdims=True) / 127.5
    return np.clip(np.round(w / scale), -128, 127).astype(np.int8), scale.astype(np.float32)


def _ids(batch=2, length=24, seed=1):
    return np.random.default_rng(seed).integers(0, 250, (batch, length)).astype(np.int32)


@pytest.mark.parametrize("shape,contracted", [((64, 4, 16), (0,)), ((4, 16, 64), (0, 1)), ((64, 128), (0,))])
def test_int8_kernels_match_a_numpy_absmax_quantization(shape, contracted):
    w = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    scale_shape = tuple(1 if i in contracted else n for i, n in enumerate(shape))
    qvalue, scale = quantize_kernel(w, scale_shape)
    want_q, want_scale = _numpy_absmax(w, contracted)
    assert qvalue.dtype == jnp.int8 and scale.shape == scale_shape
    np.testing.assert_allclose(np.asarray(scale), want_scale, rtol=1e-6)
    # They may differ by one only at a tie (x.5, e.g. the absmax element itself at -127.5).
    apart = np.asarray(qvalue).astype(int) - want_q
    at_tie = np.isclose(np.abs(w / want_scale) % 1, 0.5, atol=1e-3)
    assert (np.abs(apart) <= 1).all() and (at_tie | (apart == 0)).all()


@pytest.mark.parametrize("preset,scan", [("tiny-llada", True), ("tiny-qwen2", False), ("tiny-dream", True)])
def test_the_int8_model_equals_a_float_model_holding_the_dequantized_weights(preset, scan):
    """fp32 compute: the int8 forward (qwix's dequantizing einsum) against the float forward on
    `int8 * scale` computed here in numpy; the int8 values themselves are checked above."""
    model = Transformer(ModelConfig.preset(preset), RunOptions(scan_layers=scan), rngs=nnx.Rngs(0))
    int8 = quantize_weights(model)
    quantized = dict(nnx.to_flat_state(nnx.state(int8, nnx.Param)))
    rounded = nnx.clone(model)
    kernels = 0
    for path, var in nnx.to_flat_state(nnx.state(rounded, nnx.Param)):
        if quantized[path].get_value().dtype == jnp.int8:
            scale = quantized[path[:-1] + ("kernel_scale",) if path[-1] == "kernel" else ("lm_head_scale",)]
            var.set_value(jnp.asarray(np.asarray(quantized[path].get_value()).astype(np.float32)
                                      * np.asarray(scale.get_value())))
            kernels += 1
    assert kernels == (1 if scan else 2) * 7 + 1  # every projection and the LM head
    ids = _ids()
    np.testing.assert_allclose(np.asarray(forward(int8, ids).logits), np.asarray(forward(rounded, ids).logits), atol=2e-5, rtol=0)


@pytest.mark.parametrize("preset", [pytest.param("tiny-llada", marks=pytest.mark.slow), "tiny-qwen2"])  # 6-minute budget
def test_int8_logits_are_within_the_stated_tolerance_of_bf16(preset):
    model = Transformer(ModelConfig.preset(preset), RunOptions("bfloat16", "bfloat16"), rngs=nnx.Rngs(0))
    int8 = quantize_weights(model)
    ids = _ids(batch=4, length=32)
    a, b = np.asarray(forward(model, ids).logits), np.asarray(forward(int8, ids).logits)
    diff = np.abs(a - b)
    assert diff.max() <= BF16_MAX_ABS and diff.mean() <= BF16_MEAN_ABS, (diff.max(), diff.mean())
    assert np.mean(a.argmax(-1) == b.argmax(-1)) >= BF16_ARGMAX
    weights = lambda m: sum(x.nbytes for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
    assert weights(int8) < 0.75 * weights(model)  # the tiny model's embedding table stays bf16


@pytest.mark.parametrize("scan,mesh_shape", [  # two of four in the default run (its 6-minute budget)
    (False, None), pytest.param(True, (1, 4, 2), marks=pytest.mark.mesh),
    pytest.param(True, None, marks=pytest.mark.slow), pytest.param(False, (1, 4, 2), marks=[pytest.mark.mesh, pytest.mark.slow])])
def test_import_quantizes_each_tensor_in_its_shard(tmp_path, scan, mesh_shape):
    model = Transformer(ModelConfig.preset("tiny-llada"), rngs=nnx.Rngs(0))
    save_pretrained(model, tmp_path)
    mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2) if mesh_shape else None
    loaded = from_pretrained(tmp_path, quantization="int8", scan_layers=scan, mesh=mesh)
    ids = _ids()
    want = forward(quantize_weights(model), ids).logits
    np.testing.assert_allclose(np.asarray(forward(loaded, ids).logits), np.asarray(want), atol=1e-5)
    up = loaded.layers.mlp.up if scan else loaded.layers[0].mlp.up
    assert up.kernel.get_value().dtype == jnp.int8 and up.kernel_scale.get_value().dtype == jnp.float32
    if mesh:  # the int8 kernel keeps the float kernel's shards; its scales follow the output axis
        spec = up.kernel.get_value().sharding.spec
        assert tuple(spec)[-2:] == ("fsdp", "tensor")
        assert tuple(up.kernel_scale.get_value().sharding.spec)[-1] == "tensor"


def test_export_writes_the_float_weights_int8_stands_for(tmp_path):
    model = Transformer(ModelConfig.preset("tiny-qwen2"), rngs=nnx.Rngs(0))
    int8 = quantize_weights(model)
    save_pretrained(int8, tmp_path)
    back = from_pretrained(tmp_path)
    assert back.layers[0].mlp.up.kernel.get_value().dtype == jnp.float32
    ids = _ids()
    np.testing.assert_allclose(np.asarray(forward(back, ids).logits), np.asarray(forward(int8, ids).logits), atol=1e-5)


@pytest.mark.slow  # two fresh processes
def test_generate_and_eval_take_quantize_int8(tmp_path):
    """The command line: `generate --quantize int8` decodes; `eval --quantize int8` keeps its own
    default results folder, so a float run's records are never resumed as int8 ones."""
    from jaxdllm.cli import default_eval_dir

    run = run_cli("generate", "--prompt", "reverse 4821=", "--quantize", "int8", timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == "1284"
    folder = tmp_path / "model"
    assert default_eval_dir(folder, "int8").name == default_eval_dir(folder).name + "-int8"
    bad = run_cli("generate", "--prompt", "x", "--quantize", "int4", timeout=120)
    assert bad.returncode == 2 and "invalid choice: 'int4'" in bad.stderr


@pytest.mark.slow  # two fresh processes
def test_inspect_plans_int8_weights():
    from jaxdllm.shipped import checkpoint_dir

    run = run_cli("inspect", checkpoint_dir("tasks-llada-small"), "--plan", "v5e-1", "--plan-dtype", "int8", timeout=300)
    assert run.returncode == 0, run.stderr
    plan = json.loads(run.stdout)["memory_plan"]["v5e-1"]
    float_run = run_cli("inspect", checkpoint_dir("tasks-llada-small"), "--plan", "v5e-1", timeout=300)
    assert plan["fits"] and plan["weights_gib"] <= json.loads(float_run.stdout)["memory_plan"]["v5e-1"]["weights_gib"]
