"""The grouped matmul kernel (`jaxdllm.models.grouped_matmul`, Pallas interpreted on the CPU) against
XLA's `jax.lax.ragged_dot`, values and gradients, on ragged groups (empty ones, rows past the groups,
groups over several row tiles); the MoE models run with `moe_impl="pallas"` against their default
path; and the kernel lowers to Triton for CUDA (one custom call per projection, no ragged dot)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdllm import ConfigError, ModelConfig, RunOptions, Transformer
from jaxdllm.attention.platform import exporter, lowering_for
from jaxdllm.lowering import program_facts
from jaxdllm.models.grouped_matmul import grouped_matmul, row_tile, tile_layout
from support.forward import forward


def _ragged_dot(x, w, sizes):
    return jax.lax.ragged_dot(x, w, sizes, preferred_element_type=jnp.float32)


@pytest.mark.parametrize("rows,sizes,k,n,tile", [
    (40, [8, 0, 4, 5, 14], 32, 48, 16),     # an empty group; 9 rows past the groups
    (70, [3, 60, 0, 7], 64, 32, None),      # one group over two tiles (the default tile here: 32)
])
def test_kernel_equals_ragged_dot_with_its_gradients(rows, sizes, k, n, tile):
    rng = np.random.default_rng(rows)
    x = jnp.asarray(rng.normal(size=(rows, k)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(len(sizes), k, n)), jnp.float32)
    sizes = jnp.asarray(sizes, jnp.int32)
    got = grouped_matmul(x, w, sizes, tile=tile, interpret=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(_ragged_dot(x, w, sizes)), atol=1e-4, rtol=1e-5)
    cotangent = jnp.asarray(rng.normal(size=(rows, n)), jnp.float32)
    ours = jax.vjp(lambda a, b: grouped_matmul(a, b, sizes, tile=tile, interpret=True), x, w)[1](cotangent)
    want = jax.vjp(lambda a, b: _ragged_dot(a, b, sizes), x, w)[1](cotangent)
    for a, b in zip(ours, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-5)


def test_layout_pads_each_group_to_whole_tiles():
    layout = tile_layout(jnp.asarray([3, 0, 17, 1], jnp.int32), 24, tile=8)
    assert layout.tiles == 3 + 4 and int(layout.real_tiles[0]) == 1 + 3 + 1
    np.testing.assert_array_equal(np.asarray(layout.position),
                                  [0, 1, 2] + list(range(8, 25)) + [32] + [56] * 3)  # 3 rows past: dropped
    np.testing.assert_array_equal(np.asarray(layout.tile_group)[:5], [0, 2, 2, 2, 3])
    assert row_tile(16384, 128) == 128 and row_tile(256, 256) == 16 and row_tile(2048, 128) == 16


@pytest.mark.parametrize("preset", ["tiny-llada2", "tiny-diffusiongemma"])
def test_moe_models_with_the_kernel_equal_their_default_path(preset):
    config = ModelConfig.preset(preset).replace(experts={"expert_dim": 32})  # the kernel's tiles: multiples of 16
    model = Transformer(config, RunOptions(), rngs=nnx.Rngs(0))
    ids = jnp.asarray(np.random.default_rng(1).integers(3, 250, (2, 20)), jnp.int32)
    kernel = model.with_options(moe_impl="pallas")
    want = forward(model, ids)
    got = forward(kernel, ids)
    np.testing.assert_allclose(np.asarray(got.logits), np.asarray(want.logits), atol=2e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="moe_impl must be one of"):
        RunOptions(moe_impl="megablocks")


def test_the_kernel_lowers_to_triton_for_cuda():
    """At DiffusionGemma 26B-A4B's expert shapes: one Triton call, no ragged dot left for XLA."""
    args = (jax.ShapeDtypeStruct((2048, 2816), jnp.bfloat16), jax.ShapeDtypeStruct((128, 2816, 704), jnp.bfloat16),
            jax.ShapeDtypeStruct((128,), jnp.int32))
    try:
        with lowering_for("cuda"):
            exported = exporter(jax.jit(lambda x, w, s: grouped_matmul(x, w, s)), "cuda")(*args)
    except RuntimeError as e:  # newer JAX lowers Pallas Triton only with a GPU device present
        if "No supported GPU devices found" not in str(e):
            raise
        pytest.skip(f"jax {jax.__version__} cannot lower the Triton kernel without a GPU")
    assert program_facts(exported)["triton_kernels"] == 1
    assert "ragged_dot" not in exported.mlir_module()
