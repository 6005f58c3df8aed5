"""Models, `generate` and the trainer on a `(2, 2, 2)` mesh of 8 fake CPU devices made both ways:
`jax.make_mesh` (Explicit axes, JAX's default) and `jaxdllm.sharding.make_mesh` (Auto axes),
with and without `jax.set_mesh`; every result equals the one-device run."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType

import jaxdllm
from jaxdllm import ForwardOutput, SamplerConfig, generate, sharding
from jaxdllm.data import build_char_tokenizer, make_batch_iterator, make_mixture
from jaxdllm.train import TrainConfig, Trainer
from support.hf_models import make_hf_model
from support.llada_reference import make_llada_checkpoint

pytestmark = pytest.mark.mesh

MESHES = {
    "jax.make_mesh": lambda: jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor")),
    "sharding.make_mesh": lambda: sharding.make_mesh(data=2, fsdp=2, tensor=2),
}
# Auto-axes meshes are also covered by test_sharding.py / test_train.py; their runs here are slow-marked.
KINDS = ["jax.make_mesh", pytest.param("sharding.make_mesh", marks=pytest.mark.slow)]
SLOW_KINDS = [pytest.param(k, marks=pytest.mark.slow) for k in ("jax.make_mesh", "sharding.make_mesh")]


def test_the_two_mesh_kinds_differ():
    assert set(MESHES["jax.make_mesh"]().axis_types) == {AxisType.Explicit}
    assert set(MESHES["sharding.make_mesh"]().axis_types) == {AxisType.Auto}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen_gqa")
    make_hf_model("qwen2", "gqa").save_pretrained(path)  # 6 heads, 2 kv heads, vocab 128
    return path


@pytest.mark.slow  # ~20 s; generate and the train step below cover the Explicit-axes mesh by default
@pytest.mark.parametrize("kind", KINDS)
def test_from_pretrained_then_forward(kind, qwen):
    mesh = MESHES[kind]()
    ids = np.random.default_rng(0).integers(0, 128, (8, 10)).astype(np.int32)
    want = np.asarray(jaxdllm.from_pretrained(qwen)(ids).logits)
    model = jaxdllm.from_pretrained(qwen, mesh=mesh)
    assert len(model.layers[0].mlp.gate.kernel[...].sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(model(ids).logits), want, atol=1e-5)   # eager, no mesh context
    with jax.set_mesh(mesh):
        x = jnp.asarray(ids)                                                     # an array of the context's mesh
        np.testing.assert_allclose(np.asarray(model(x).logits), want, atol=1e-5)
        got = nnx.jit(lambda m, x: m(x).logits)(model, x)
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
        grads = nnx.grad(lambda m, x: m(x).logits.astype(jnp.float32).mean())(model, x)
    assert np.isfinite(np.asarray(grads.embed[...])).all()


@pytest.mark.parametrize("preset", ["tiny-llada", pytest.param("tiny-llada2", marks=pytest.mark.slow)])  # dense, MoE
def test_forward_returns_one_type_for_every_flag_inside_an_explicit_axes_mesh(preset):
    """`ForwardOutput` for every flag combination, the same structure and values inside
    `jax.set_mesh(jax.make_mesh(...))` as on one device: a part not asked for is None, and so
    are a dense model's router loads."""
    config = jaxdllm.ModelConfig.preset(preset)
    model = jaxdllm.Transformer(config, rngs=nnx.Rngs(0))
    mesh = MESHES["jax.make_mesh"]()
    meshed = sharding.shard_model(jaxdllm.Transformer(config, rngs=nnx.Rngs(0)), sharding.auto_mesh(mesh))
    ids = np.random.default_rng(0).integers(0, 250, (8, 16)).astype(np.int32)
    for with_cache, loads in itertools.product((False, True), repeat=2):
        call = nnx.jit(lambda m, x, c: m(x, cache=c, return_router_loads=loads))
        want = call(model, jnp.asarray(ids), model.init_cache(8, 16) if with_cache else None)
        with jax.set_mesh(mesh):
            got = call(meshed, jnp.asarray(ids), model.init_cache(8, 16) if with_cache else None)
        for out in (want, got):
            assert type(out) is ForwardOutput
            assert (out.cache is not None) == with_cache
            assert (out.router_loads is not None) == (loads and config.experts is not None)
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.fixture(scope="module")
def llada(tmp_path_factory):
    path = tmp_path_factory.mktemp("llada")
    make_llada_checkpoint(path)
    return path


@pytest.mark.parametrize("kind", KINDS)
def test_generate_equals_one_device(kind, llada):
    mesh = MESHES[kind]()
    rng = np.random.default_rng(1)
    lengths = [3, 7, 5, 8, 2, 6, 8, 4]
    ids = np.zeros((8, 8), np.int32)
    attention = np.zeros((8, 8), np.int32)
    for row, n in enumerate(lengths):                                            # left-padded, ragged
        ids[row, 8 - n:] = rng.integers(5, 100, n)
        attention[row, 8 - n:] = 1
    config = SamplerConfig(gen_length=16, block_length=8, policy="threshold", threshold=0.5)
    want = generate(jaxdllm.from_pretrained(llada), ids, config, attention_mask=attention)
    model = jaxdllm.from_pretrained(llada, mesh=mesh)
    for context in (False, True):
        if context:
            with jax.set_mesh(mesh):
                got = generate(model, ids, config, attention_mask=attention)
        else:
            got = generate(model, ids, config, attention_mask=attention)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(got.nfe, want.nfe)


@pytest.mark.parametrize("kind", KINDS)
def test_a_second_model_in_the_loop_decodes_sharded_as_on_one_device(kind, llada):
    """APD: the diffusion model and its causal verifier (`policy_params`) both placed on the mesh;
    the loop runs them as placed and gives the one-device tokens."""
    from support.models import tiny_model

    mesh = MESHES[kind]()
    ids = np.random.default_rng(3).integers(5, 100, (8, 6)).astype(np.int32)
    config = SamplerConfig(gen_length=8, policy="apd", mix=0.5, draft_window=4, kv_window=2)
    verifier = lambda: tiny_model("tiny-qwen2", vocab_size=130, eos_token_id=127, pad_token_id=127,  # noqa: E731
                                  bos_token_id=127)
    want = generate(jaxdllm.from_pretrained(llada), ids, config, policy_params=verifier())
    placed = sharding.shard_model(verifier(), mesh)
    assert len(placed.layers[0].mlp.gate.kernel[...].sharding.device_set) == 8
    got = generate(jaxdllm.from_pretrained(llada, mesh=mesh), ids, config, policy_params=placed)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.nfe, want.nfe)


@pytest.mark.parametrize("kind", KINDS)
def test_a_one_device_model_decodes_under_a_callers_mesh(kind, llada):
    """A model loaded without a mesh, called inside `jax.set_mesh(mesh)`: it decodes on its own
    device, as outside the context."""
    ids = np.random.default_rng(2).integers(5, 100, (2, 6)).astype(np.int32)
    config = SamplerConfig(gen_length=8, block_length=8, policy="threshold", threshold=0.5)
    model = jaxdllm.from_pretrained(llada)
    want = generate(model, ids, config)
    with jax.set_mesh(MESHES[kind]()):
        got = generate(model, ids, config)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.nfe, want.nfe)


def _recipe() -> TrainConfig:
    return TrainConfig.from_dict({
        "model": {"preset": "tiny-llada", "embed_dim": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 2,
                  "head_dim": 16, "mlp_dim": 64, "max_position": 64, "attention_impl": "xla"},
        "data": {"examples_per_task": 50, "seq_len": 32, "batch_size": 16},
        "train": {"steps": 2}, "log": {"every": 1, "progress": False}})


@pytest.mark.parametrize("kind", SLOW_KINDS)  # slow: the default run's 6-minute budget (tests/train/test_train.py: one mesh)
def test_train_step_equals_one_device(kind):
    config = _recipe()
    batch = next(make_batch_iterator(make_mixture(config.data.tasks, 50, 0), build_char_tokenizer(),
                                     Trainer.batch_config_for(config)))
    single = Trainer(config, mesh=sharding.make_mesh(devices=jax.devices()[:1]))
    want = single.train_step(batch)
    mesh = MESHES[kind]()
    for context in (False, True):
        if context:                                                              # built and run inside it
            with jax.set_mesh(mesh):
                trainer = Trainer(config, mesh=mesh)
                got = trainer.train_step(batch)
        else:
            trainer = Trainer(config, mesh=mesh)
            got = trainer.train_step(batch)
        assert len(jax.tree.leaves(trainer.trainable)[0].sharding.device_set) == 8
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        for a, b in zip(jax.tree.leaves(single.trainable), jax.tree.leaves(trainer.trainable)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-4)
