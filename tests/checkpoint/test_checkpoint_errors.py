"""Every bad checkpoint input raises an error that names the tensor or the file."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import jaxdllm
from jaxdllm import CheckpointError
from support.hf_models import make_hf_model


@pytest.fixture
def ckpt(tmp_path):
    make_hf_model("llama", "mha").save_pretrained(tmp_path)
    return tmp_path


def _edit_config(path, **changes):
    raw = json.loads((path / "config.json").read_text())
    raw.update(changes)
    (path / "config.json").write_text(json.dumps(raw))


def _rewrite(path, edit):
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_missing_tensor_is_named(ckpt):
    _rewrite(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensors \['model.layers.1.mlp.up_proj.weight'\]"):
        jaxdllm.from_pretrained(ckpt)


def test_unexpected_tensor_is_named(ckpt):
    _rewrite(ckpt, lambda t: t.update({"model.layers.0.extra.weight": np.zeros(3, np.float32)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensors \['model.layers.0.extra.weight'\]"):
        jaxdllm.from_pretrained(ckpt)


def test_misshaped_tensor_is_named(ckpt):
    _rewrite(ckpt, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": np.zeros((5, 32), np.float32)}))
    with pytest.raises(CheckpointError, match=r"model.layers.0.self_attn.k_proj.weight .* shape \[5, 32\], expected \[32, 32\]"):
        jaxdllm.from_pretrained(ckpt)


def test_unknown_architecture(ckpt):
    _edit_config(ckpt, model_type="gpt2")
    with pytest.raises(CheckpointError, match=r"config.json: unknown architecture model_type='gpt2'"):
        jaxdllm.from_pretrained(ckpt)


def test_unreadable_safetensors_file(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CheckpointError, match=r"cannot read safetensors file .*model.safetensors"):
        jaxdllm.from_pretrained(ckpt)


def test_unreadable_config(ckpt):
    (ckpt / "config.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match=r"cannot read .*config.json"):
        jaxdllm.from_pretrained(ckpt)


def test_missing_config_and_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match=r"config.json is missing"):
        jaxdllm.from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"does not exist"):
        jaxdllm.from_pretrained(tmp_path / "nope")


def test_no_weights(ckpt):
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"no model.safetensors.*pytorch_model.bin is not read"):
        jaxdllm.from_pretrained(ckpt)


def test_index_names_missing_shard(ckpt):
    model = jaxdllm.from_pretrained(ckpt)
    out = ckpt / "sharded"
    jaxdllm.save_pretrained(model, out, max_shard_size="10KB")
    victim = sorted(out.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=rf"lists {victim.name}, which is missing"):
        jaxdllm.from_pretrained(out)


def test_unsupported_variants_are_refused(ckpt):
    _edit_config(ckpt, hidden_act="gelu")
    with pytest.raises(CheckpointError, match="hidden_act='gelu' is not supported"):
        jaxdllm.from_pretrained(ckpt)


def test_overrides_that_change_shapes_are_caught(ckpt):
    with pytest.raises(ValueError, match=r"cannot override \['num_heads', 'tie_embeddings'\]"):
        jaxdllm.from_pretrained(ckpt, tie_embeddings=True, num_heads=2)
