"""Loading straight into a (data, fsdp, tensor) mesh on 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxdllm
from jaxdllm import sharding
from support.forward import forward
from support.hf_models import make_hf_model

pytestmark = pytest.mark.mesh


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen_gqa")
    make_hf_model("qwen2", "gqa").save_pretrained(path)  # 6 heads, 2 kv heads, mlp 80, vocab 128
    return path


EXPECTED = {  # parameter path -> spec under DEFAULT_RULES on a (2, 2, 2) mesh
    ("embed",): P("tensor", "fsdp"),
    ("lm_head",): P("fsdp", "tensor"),
    ("layers", 0, "attn", "q", "kernel"): P("fsdp", "tensor", None),
    ("layers", 0, "attn", "q", "bias"): P("tensor", None),
    ("layers", 0, "attn", "k", "kernel"): P("fsdp", "tensor", None),
    ("layers", 0, "attn", "o", "kernel"): P("tensor", None, "fsdp"),
    ("layers", 2, "mlp", "gate", "kernel"): P("fsdp", "tensor"),
    ("layers", 2, "mlp", "down", "kernel"): P("tensor", "fsdp"),
    ("layers", 1, "attn_norm", "scale"): P(None),
    ("final_norm", "scale"): P(None),
}


def test_loaded_parameters_carry_named_shardings_and_logits_match(ckpt):
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    single = jaxdllm.from_pretrained(ckpt)
    sharded = jaxdllm.from_pretrained(ckpt, mesh=mesh)
    params = dict(nnx.to_flat_state(nnx.state(sharded, nnx.Param)))
    for path, spec in EXPECTED.items():
        got = params[path].get_value().sharding
        assert isinstance(got, NamedSharding) and got.mesh.shape == mesh.shape, path
        assert got.spec == spec, (path, got.spec)
    q = params[("layers", 0, "attn", "q", "kernel")].get_value()
    assert q.addressable_shards[0].data.shape == (24, 3, 8)  # [48/2, 6/2, 8]

    ids = jnp.asarray(np.random.RandomState(0).randint(0, 128, (4, 10)))
    ids_sharded = jax.device_put(ids, NamedSharding(mesh, P(("data", "fsdp"), None)))
    ref = np.asarray(forward(single, ids).logits)
    got = forward(sharded, ids_sharded).logits
    np.testing.assert_allclose(np.asarray(got), ref, atol=1e-5, rtol=0)


def test_indivisible_axes_are_replicated(tmp_path):
    make_hf_model("llama", "odd_heads").save_pretrained(tmp_path)  # 3 heads, 1 kv head, vocab 61
    mesh = sharding.make_mesh(data=1, fsdp=2, tensor=4)
    model = jaxdllm.from_pretrained(tmp_path, mesh=mesh)
    assert model.layers[0].attn.q.kernel[...].sharding.spec == P("fsdp", None, None)
    assert model.embed[...].sharding.spec == P(None, "fsdp")
    ids = jnp.asarray(np.random.RandomState(0).randint(0, 61, (2, 6)))
    ref = np.asarray(forward(jaxdllm.from_pretrained(tmp_path), ids).logits)
    np.testing.assert_allclose(np.asarray(forward(model, ids).logits), ref, atol=1e-5, rtol=0)


def test_orbax_restores_into_a_mesh(ckpt, tmp_path):
    model = jaxdllm.from_pretrained(ckpt)
    jaxdllm.save_state(model, tmp_path / "state")
    mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
    restored = jaxdllm.load_state(tmp_path / "state", mesh=mesh)
    assert restored.layers[0].mlp.gate.kernel[...].sharding.spec == P("fsdp", "tensor")
    np.testing.assert_array_equal(np.asarray(restored.embed[...]), np.asarray(model.embed[...]))


def test_mesh_size_must_match_devices():
    with pytest.raises(ValueError, match="= 6 devices, but 8 are available"):
        sharding.make_mesh(data=3, fsdp=2)


def test_a_samplers_rules_reach_the_models_activation_constraints(ckpt, monkeypatch):
    """`Sampler(model, rules=...)`: every `constrain` the model makes while the loop is traced
    reads those rules (not the defaults), and so do rows: `batch` over `data` alone splits rows 2
    ways on a (2, 2, 2) mesh, not 4."""
    rules = {**sharding.DEFAULT_RULES, "batch": "data", "vocab": None}
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    model = jaxdllm.from_pretrained(ckpt, mesh=mesh, rules=rules, attention="bidirectional", mask_token_id=3)
    seen, original = [], sharding.constrain

    def spy(x, logical_axes, rules=None):
        seen.append(dict(sharding.active_rules()) if rules is None else rules)
        return original(x, logical_axes, rules)

    monkeypatch.setattr(sharding, "constrain", spy)
    config = jaxdllm.SamplerConfig(gen_length=4, block_length=4, steps=4)
    sampler = jaxdllm.decoding.Sampler(model, rules=rules)
    out = sampler(np.full((3, 5), 7, np.int32), config)
    assert out.tokens.shape == (3, 9) and sampler._row_multiple == 2
    assert seen and all(r == rules for r in seen)
    with sharding.use_rules(rules):
        assert sharding.logical_to_spec(("batch", "length", "vocab"), (8, 4, 16), mesh) == P("data", None, None)
    assert sharding.logical_to_spec(("batch", "length", "vocab"), (8, 4, 16), mesh) == P(("data", "fsdp"), None,
                                                                                          "tensor")


def test_process_rows_of_a_single_process_job_are_the_whole_batch():
    from jaxdllm.sharding import process_rows

    for sizes in ((8, 1, 1), (2, 2, 2), (1, 1, 8)):  # rows split 8, 4 ways, or replicated: one process holds all
        assert process_rows(sharding.make_mesh(*sizes), 16) == (0, 16)
