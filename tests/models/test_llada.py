"""A checkpoint in LLaDA's own layout loads and matches a torch forward written from the spec."""

import json

import numpy as np
import jax.numpy as jnp
import pytest
from safetensors.numpy import load_file

import jaxdllm
from support.forward import forward
from support.llada_reference import TINY, llada_forward, make_llada_checkpoint
from support.optional import torch


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 2}, {"weight_tying": True}],
                         ids=["mha", "gqa", "tied"])
def test_llada_logits_match_torch_reference(tmp_path, overrides):
    weights = make_llada_checkpoint(tmp_path, **overrides)
    cfg = dict(TINY, **overrides)
    model = jaxdllm.from_pretrained(tmp_path)
    c = model.config
    assert (c.attention, c.checkpoint_format, c.mask_token_id) == ("bidirectional", "llada", 126)
    ids = np.random.RandomState(0).randint(0, cfg["vocab_size"], (2, 17))
    ref = llada_forward(weights, cfg, torch.as_tensor(ids)).numpy()
    np.testing.assert_allclose(np.asarray(forward(model, jnp.asarray(ids)).logits), ref, atol=1e-4, rtol=0)


def test_llada_round_trip_keeps_layout_and_config(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    weights = make_llada_checkpoint(src)
    (src / "modeling_llada.py").write_text("# remote code the original LLaDA loader needs\n")
    model = jaxdllm.from_pretrained(src)
    jaxdllm.save_pretrained(model, dst, copy_files_from=src)
    saved = load_file(str(dst / "model.safetensors"))
    assert sorted(saved) == sorted(weights)
    for name, tensor in weights.items():
        np.testing.assert_array_equal(saved[name], tensor.numpy(), err_msg=name)
    src_cfg, dst_cfg = (json.loads((d / "config.json").read_text()) for d in (src, dst))
    for key, value in src_cfg.items():  # every original key survives, e.g. auto_map
        assert dst_cfg[key] == value, key
    assert (dst / "modeling_llada.py").is_file()


def test_llada_8b_preset_matches_published_shape():
    c = jaxdllm.ModelConfig.preset("llada-8b")
    assert (c.num_layers, c.embed_dim, c.num_heads, c.mlp_dim, c.vocab_size) == (32, 4096, 32, 12288, 126464)
    assert (c.mask_token_id, c.eos_token_id, c.eot_token_id, c.bos_token_id) == (126336, 126081, 126348, 126080)
    assert 7.9e9 < c.num_params < 8.1e9
