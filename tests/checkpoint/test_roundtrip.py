"""from_pretrained -> save_pretrained -> from_pretrained is lossless, and transformers reloads it."""

import json

import numpy as np
import jax.numpy as jnp
import pytest
from flax import nnx

import jaxdllm
from support.forward import forward
from support.hf_models import hf_logits, make_hf_model
from support.optional import transformers


def _flat_params(model):
    return {path: np.asarray(v.get_value()) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _assert_bitwise_equal(a, b):
    fa, fb = _flat_params(a), _flat_params(b)
    assert fa.keys() == fb.keys()
    for path in fa:
        assert fa[path].dtype == fb[path].dtype, path
        np.testing.assert_array_equal(fa[path].view(np.uint8), fb[path].view(np.uint8), err_msg=str(path))


@pytest.mark.parametrize("kind,tie", [("llama", False), ("qwen2", False), ("qwen2", True)])
def test_round_trip_is_bitwise_and_transformers_reloads(tmp_path, kind, tie):
    hf = make_hf_model(kind, "gqa", tie=tie)
    hf.save_pretrained(tmp_path / "src")
    first = jaxdllm.from_pretrained(tmp_path / "src")
    jaxdllm.save_pretrained(first, tmp_path / "out")
    second = jaxdllm.from_pretrained(tmp_path / "out")
    _assert_bitwise_equal(first, second)
    assert second.config == first.config

    cls = transformers.LlamaForCausalLM if kind == "llama" else transformers.Qwen2ForCausalLM
    reloaded = cls.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    for (name, a), (_, b) in zip(sorted(hf.state_dict().items()), sorted(reloaded.state_dict().items())):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    ids = np.random.RandomState(0).randint(0, hf.config.vocab_size, (2, 7))
    np.testing.assert_array_equal(hf_logits(reloaded, ids), hf_logits(hf, ids))


def test_sharded_export_writes_index_that_transformers_reads(tmp_path):
    hf = make_hf_model("llama", "gqa")
    hf.save_pretrained(tmp_path / "src")
    model = jaxdllm.from_pretrained(tmp_path / "src")
    jaxdllm.save_pretrained(model, tmp_path / "out", max_shard_size="20KB")
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and not (tmp_path / "out" / "model.safetensors").exists()
    again = jaxdllm.from_pretrained(tmp_path / "out")
    _assert_bitwise_equal(model, again)
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager")
    for (name, a), (_, b) in zip(sorted(hf.state_dict().items()), sorted(reloaded.state_dict().items())):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)


def test_bfloat16_round_trip(tmp_path):
    hf = make_hf_model("qwen2", "mha")
    hf.save_pretrained(tmp_path / "src")
    half = jaxdllm.from_pretrained(tmp_path / "src", dtype="bfloat16")
    jaxdllm.save_pretrained(half, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    again = jaxdllm.from_pretrained(tmp_path / "out")
    assert again.options.param_dtype == "bfloat16"
    _assert_bitwise_equal(half, again)


def test_orbax_state_round_trip(tmp_path):
    hf = make_hf_model("qwen2", "gqa")
    hf.save_pretrained(tmp_path / "src")
    model = jaxdllm.from_pretrained(tmp_path / "src")
    jaxdllm.save_state(model, tmp_path / "orbax")
    restored = jaxdllm.load_state(tmp_path / "orbax")
    _assert_bitwise_equal(model, restored)
    assert restored.config == model.config
    ids = jnp.asarray(np.random.RandomState(2).randint(0, 128, (1, 6)))
    np.testing.assert_array_equal(np.asarray(forward(model, ids).logits), np.asarray(forward(restored, ids).logits))


def test_orbax_rejects_other_directories(tmp_path):
    with pytest.raises(jaxdllm.CheckpointError, match="not a jaxdllm orbax checkpoint"):
        jaxdllm.load_state(tmp_path)
