"""Routed experts on a CPU (`moe_impl="tiles"`, what `auto` runs there on one device): each expert over
its own rows, a loop over row tiles (`jaxdllm.models.grouped_matmul.tile_loop`), against a dense
reference written here (every expert on every token, mixed by the routing weights), values and
gradients: uneven routing (empty experts, one expert over several tiles, every token on the same
experts), bf16, the LLaDA2 MoE layer at batch > 1, and which path `auto` picks."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxdllm import ModelConfig, RunOptions, sharding
from jaxdllm.models import grouped_matmul as gm
from jaxdllm.models.moe import MoE, cpu_impl, grouped_swiglu, route


def dense_reference(x, experts, weights, gate, up, down, activation=jax.nn.silu):
    """Every expert on every token, mixed by a dense `[T, E]` matrix of the routing weights."""
    t, e = x.shape[0], gate.shape[0]
    mix = jnp.zeros((t, e), jnp.float32).at[jnp.arange(t)[:, None], experts].add(weights)
    hi = jax.lax.Precision.HIGHEST
    hidden = activation(jnp.einsum("td,edm->tem", x, gate, precision=hi)) * jnp.einsum("td,edm->tem", x, up,
                                                                                         precision=hi)
    return jnp.einsum("tem,emd,te->td", hidden, down, mix, precision=hi)


def _routing(kind, t, k, e, rng):
    if kind == "uniform":
        return np.stack([rng.choice(e, k, replace=False) for _ in range(t)])
    if kind == "skewed":  # most pairs on expert 2 (several tiles), experts 0, 4, 5 empty
        first = np.where(rng.random(t) < 0.8, 2, rng.choice([1, 3], t))
        second = np.where(first == 2, rng.choice([1, 3, 6, 7], t), 2)
        return np.stack([first, second], -1)[:, :k]
    return np.tile(np.arange(k), (t, 1))  # "one": every token on the same experts


@pytest.mark.parametrize("t,k,e,d,m,kind", [
    (40, 3, 8, 12, 10, "uniform"),
    (50, 2, 8, 16, 24, "skewed"),
    (33, 2, 6, 8, 16, "one"),
])
def test_tiles_equal_the_dense_reference_with_gradients(t, k, e, d, m, kind):
    rng = np.random.default_rng(t)
    x = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)
    experts = jnp.asarray(_routing(kind, t, k, e, rng), jnp.int32)
    weights = jnp.asarray(rng.random((t, k)), jnp.float32)
    kernels = [jnp.asarray(rng.standard_normal(s) * 0.3, jnp.float32) for s in [(e, d, m), (e, d, m), (e, m, d)]]
    cotangent = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)

    def loss(fn, x, weights, *kernels):
        y = fn(x, experts, weights, *kernels)
        return jnp.sum(y * cotangent), y

    tiles = lambda *a: grouped_swiglu(*a, impl="tiles")[0]  # noqa: E731
    grad = lambda fn: jax.jit(jax.grad(functools.partial(loss, fn), argnums=(0, 1, 2, 3, 4), has_aux=True))  # noqa: E731
    got_grads, got = grad(tiles)(x, weights, *kernels)
    want_grads, want = grad(dense_reference)(x, weights, *kernels)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    for name, a, b in zip(("x", "weights", "gate", "up", "down"), got_grads, want_grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-5, err_msg=name)
    _, load = jax.jit(functools.partial(grouped_swiglu, impl="tiles"))(x, experts, weights, *kernels)
    np.testing.assert_array_equal(np.asarray(load), np.bincount(np.asarray(experts).reshape(-1), minlength=e))


def test_layout_holds_every_pair_however_they_route():
    """No capacity: a tile size from the mean load, yet every pair on one expert still fits."""
    rows, groups = 64, 32
    tile = gm.loop_tile(rows, groups)
    assert tile == 8 and gm.loop_tile(256, 32) == 16 and gm.loop_tile(4096, 32) == 128
    layout = gm.tile_layout(jnp.zeros((groups,), jnp.int32).at[5].set(rows), rows, tile)
    assert int(layout.real_tiles[0]) == rows // tile
    np.testing.assert_array_equal(np.asarray(layout.position), np.arange(rows))


def test_bf16_tiles_round_as_the_dense_path():
    rng = np.random.default_rng(3)
    t, k, e, d, m = 24, 2, 8, 16, 32
    x = jnp.asarray(rng.standard_normal((t, d)), jnp.bfloat16)
    experts = jnp.asarray(_routing("uniform", t, k, e, rng), jnp.int32)
    weights = jnp.asarray(rng.random((t, k)), jnp.float32)
    kernels = [jnp.asarray(rng.standard_normal(s) * 0.3, jnp.bfloat16) for s in [(e, d, m), (e, d, m), (e, m, d)]]
    run = lambda impl: jax.jit(functools.partial(grouped_swiglu, impl=impl))(x, experts, weights, *kernels)[0]  # noqa: E731
    np.testing.assert_allclose(np.asarray(run("tiles")), np.asarray(run("dense")), atol=2e-5, rtol=1e-5)


def test_llada2_moe_layer_at_batch_two_values_and_gradients():
    """The LLaDA2 MoE layer (router, routed experts, shared expert) on `[2, 7, D]`: `tiles` against the
    dense reference fed the same routing, and every parameter's gradient."""
    config = ModelConfig.preset("tiny-llada2")
    layer = MoE(config, RunOptions(moe_impl="tiles"), rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 7, config.embed_dim)), jnp.float32)

    def reference(layer, x):
        flat = x.reshape(-1, x.shape[-1])
        experts, weights = route(flat, layer.router[...], layer.expert_bias[...], config.experts)
        y = dense_reference(flat, experts, weights, layer.gate.kernel[...], layer.up.kernel[...],
                            layer.down.kernel[...]).reshape(x.shape)
        return y + layer.shared(x)

    loss = lambda fn: nnx.jit(nnx.value_and_grad(lambda layer, x: jnp.sum(jnp.sin(fn(layer, x))), argnums=(0, 1)))  # noqa: E731
    got, (got_params, got_x) = loss(lambda layer, x: layer(x)[0])(layer, x)
    want, (want_params, want_x) = loss(reference)(layer, x)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got_x), np.asarray(want_x), atol=1e-5, rtol=1e-5)
    flat_got, flat_want = nnx.to_flat_state(nnx.state(got_params)), dict(nnx.to_flat_state(nnx.state(want_params)))
    for path, value in flat_got:
        np.testing.assert_allclose(np.asarray(value[...]), np.asarray(flat_want[path][...]), atol=1e-5, rtol=1e-5,
                                   err_msg=str(path))


@pytest.mark.mesh
def test_auto_runs_tiles_on_one_cpu_device_and_the_dense_mix_when_small_or_over_a_mesh():
    kernel = jnp.ones((16, 64, 32))
    mesh = sharding.auto_mesh(sharding.make_mesh(fsdp=4, tensor=2))
    spread = jax.device_put(kernel, NamedSharding(mesh, PartitionSpec("fsdp", None, "tensor")))
    seen = []
    trace = jax.jit(lambda w: seen.append((cpu_impl(256, w), cpu_impl(32, w))) or w)
    trace(kernel)
    trace(spread)
    assert seen == [("tiles", "dense"), ("dense", "dense")]
