"""Qwen3 and SDAR checkpoints: a random tiny transformers `Qwen3ForCausalLM` saved with
`save_pretrained` loads here with transformers' logits (causal, and block-causal for SDAR), exports
back losslessly, and each way an SDAR checkpoint is written down (SDAR's own config.json, a
Qwen2 / Qwen3 config.json with `block_size` and `mask_token_id`) reads as the `sdar` family.

The SDAR reference: transformers' Qwen3 (eager attention) fed a 4-D additive float mask,
`attention_mask [B, 1, L, L]` (0 where a query sees a key, the float32 minimum elsewhere), built
here from SDAR's rule: bidirectional inside blocks of `block_size` counted from position 0, causal
across blocks; padding keys hidden.
"""

import json
import shutil

import numpy as np
import jax.numpy as jnp
import pytest
from flax import nnx

import jaxdllm
from jaxdllm import ModelConfig, Transformer
from jaxdllm.checkpoint import config_from_hf, config_to_hf
from jaxdllm.models.families import family_for_hf, family_of
from support.forward import forward
from support.hf_models import hf_logits
from support.optional import torch, transformers

TOL = 1e-4
SHAPE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
             num_hidden_layers=2, vocab_size=97, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=1e6)
BLOCK, MASK = 4, 96


def _qwen3(seed=0, **extra):
    """A random `Qwen3ForCausalLM` in fp32, eager attention; every parameter randomised (norms and the
    q/k norms included: their default init is trivial)."""
    config = transformers.Qwen3Config(**{**SHAPE, **extra})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2 if p.ndim == 1 else 0.08)
    return model


def _edit_config(path, **changes):
    raw = json.loads((path / "config.json").read_text())
    raw.update(changes)
    (path / "config.json").write_text(json.dumps(raw))
    return raw


def _flat_params(model):
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _assert_same_params(a, b):
    fa, fb = _flat_params(a), _flat_params(b)
    assert fa.keys() == fb.keys()
    for p in fa:
        np.testing.assert_array_equal(fa[p], fb[p], err_msg=str(p))


def _ids(batch, length, seed=0):
    return np.random.RandomState(seed).randint(0, SHAPE["vocab_size"] - 1, (batch, length))  # never the mask id


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One tiny Qwen3 checkpoint (no biases, untied: the published form) and the same weights as an
    SDAR checkpoint (SDAR's config.json keys)."""
    hf = _qwen3()
    qwen3 = tmp_path_factory.mktemp("qwen3")
    hf.save_pretrained(qwen3)
    sdar = tmp_path_factory.mktemp("sdar")
    shutil.copytree(qwen3, sdar, dirs_exist_ok=True)
    _edit_config(sdar, model_type="sdar", architectures=["SDARForCausalLM"], block_size=BLOCK, mask_token_id=MASK,
                 auto_map={"AutoConfig": "configuration_sdar.SDARConfig",
                           "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
                 fuse_cross_entropy=True)
    return hf, qwen3, sdar


def test_qwen3_logits_match_transformers_on_a_left_padded_batch(saved):
    hf, path, _ = saved
    ours = jaxdllm.from_pretrained(path)
    c = ours.config
    assert family_of(c).name == "qwen3" and (c.attention, c.shift_logits, c.qk_norm) == ("causal", False, True)
    assert (c.qkv_bias, c.out_bias, c.head_dim, c.tie_embeddings) == (False, False, 16, False)
    ids = _ids(3, 11, seed=1)
    pad = np.array([0, 3, 6])
    mask = (np.arange(11)[None] >= pad[:, None]).astype(np.int64)
    positions = np.clip(np.arange(11)[None] - pad[:, None], 0, None)
    ref = hf_logits(hf, ids, attention_mask=torch.as_tensor(mask), position_ids=torch.as_tensor(positions))
    spec = jaxdllm.MaskSpec.from_padding(jnp.asarray(mask), kind="causal")
    got = np.asarray(forward(ours, jnp.asarray(ids), positions=jnp.asarray(positions), attention=spec).logits)
    real = mask.astype(bool)
    np.testing.assert_allclose(got[real], ref[real], atol=TOL, rtol=0)


def test_qwen3_exports_losslessly_and_transformers_reloads_it(saved, tmp_path):
    hf, path, _ = saved
    first = jaxdllm.from_pretrained(path)
    jaxdllm.save_pretrained(first, tmp_path)
    second = jaxdllm.from_pretrained(tmp_path)
    _assert_same_params(first, second)
    assert second.config == first.config
    source, out = (json.loads((p / "config.json").read_text()) for p in (path, tmp_path))
    assert set(source) <= set(out)
    for key in ("model_type", "architectures", "attention_bias", "head_dim", "num_key_value_heads",
                "tie_word_embeddings", "vocab_size", "rms_norm_eps"):
        assert out[key] == source[key], key
    reloaded = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    theirs = hf.state_dict()
    for name, value in reloaded.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), theirs[name].numpy(), err_msg=name)


def test_qwen3_attention_bias_puts_biases_on_q_k_v_and_o(tmp_path):
    hf = _qwen3(seed=1, attention_bias=True, tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    ours = jaxdllm.from_pretrained(tmp_path)
    c = ours.config
    assert (c.qkv_bias, c.out_bias, c.tie_embeddings) == (True, True, True)
    ids = _ids(2, 9, seed=2)
    np.testing.assert_allclose(np.asarray(forward(ours, jnp.asarray(ids)).logits), hf_logits(hf, ids), atol=TOL, rtol=0)


def _block_causal_additive(real: np.ndarray, block: int):
    """`[B, 1, L, L]` float32: 0 where a query sees a key (its block and the blocks before it, keys
    that are real tokens), the float32 minimum elsewhere."""
    blk = np.arange(real.shape[1]) // block
    visible = (blk[None, :] <= blk[:, None])[None] & real[:, None, :].astype(bool)
    return torch.where(torch.as_tensor(visible), 0.0, torch.finfo(torch.float32).min)[:, None]


def test_sdar_checkpoint_loads_block_causal_unshifted_with_transformers_logits(saved):
    hf, _, path = saved
    ours = jaxdllm.from_pretrained(path)
    c = ours.config
    assert family_of(c).name == "sdar" and family_of(c).default_preset(c) == "sdar"
    assert (c.attention, c.block_size, c.shift_logits, c.mask_token_id, c.qk_norm) == \
        ("block_causal", BLOCK, False, MASK, True)
    ids = _ids(2, 10, seed=3)
    ids[:, 5:7] = MASK
    real = np.ones_like(ids)
    real[1, 7:] = 0  # the second row is right-padded: blocks stay counted from position 0
    additive = _block_causal_additive(real, BLOCK)
    ref = hf_logits(hf, ids, attention_mask=additive)
    causal = hf_logits(hf, ids)
    assert np.abs(ref - causal)[:, :7].max() > 1e-2  # the block-causal mask really changes the reference
    spec = jaxdllm.MaskSpec.from_padding(jnp.asarray(real), kind="block_causal", block_size=BLOCK)
    got = np.asarray(forward(ours, jnp.asarray(ids), attention=spec).logits)
    np.testing.assert_allclose(got[real.astype(bool)], ref[real.astype(bool)], atol=TOL, rtol=0)
    # the default mask of the loaded model is SDAR's (whole rows, no padding)
    np.testing.assert_allclose(np.asarray(forward(ours, jnp.asarray(ids[:1])).logits), ref[:1], atol=TOL, rtol=0)


def test_sdar_exports_its_own_config_json(saved, tmp_path):
    _, _, path = saved
    first = jaxdllm.from_pretrained(path)
    jaxdllm.save_pretrained(first, tmp_path)
    source, out = (json.loads((p / "config.json").read_text()) for p in (path, tmp_path))
    assert set(source) <= set(out)
    for key in ("model_type", "architectures", "auto_map", "fuse_cross_entropy", "block_size", "mask_token_id",
                "attention_bias", "head_dim"):
        assert out[key] == source[key], key
    assert "bd_size" not in out
    second = jaxdllm.from_pretrained(tmp_path)
    assert second.config == first.config
    _assert_same_params(first, second)


def test_a_qwen2_conversion_reads_as_sdar_and_exports_the_same_keys(tmp_path):
    """A Qwen2 causal checkpoint trained into SDAR by a jaxdllm recipe: Qwen2's config.json (its
    model_type, architectures, q/k/v biases) plus `block_size` and `mask_token_id`."""
    causal = Transformer(ModelConfig.preset("tiny-qwen2"), rngs=nnx.Rngs(0))
    jaxdllm.save_pretrained(causal, tmp_path / "src")
    raw = _edit_config(tmp_path / "src", block_size=8, mask_token_id=253)
    assert family_for_hf(raw).name == "sdar"
    model = jaxdllm.from_pretrained(tmp_path / "src")
    c = model.config
    assert (c.model_type, c.attention, c.block_size, c.shift_logits, c.mask_token_id) == \
        ("qwen2", "block_causal", 8, False, 253)
    assert (c.qkv_bias, c.out_bias, c.qk_norm) == (True, False, False)
    jaxdllm.save_pretrained(model, tmp_path / "out")
    out = json.loads((tmp_path / "out" / "config.json").read_text())
    assert out == raw
    again = jaxdllm.from_pretrained(tmp_path / "out")
    assert again.config == c
    _assert_same_params(model, again)
    # the recipe's model, as a config: a block-causal unshifted Qwen2 writes the same keys
    trained = ModelConfig.preset("tiny-qwen2", attention="block_causal", block_size=8, mask_token_id=253)
    assert family_of(trained).name == "sdar"
    written = config_to_hf(trained)
    assert written["model_type"] == "qwen2" and written["architectures"] == ["Qwen2ForCausalLM"]
    assert (written["block_size"], written["mask_token_id"]) == (8, 253) and "bd_size" not in written
    assert config_from_hf(written) == trained


def test_the_block_size_keys_are_unambiguous():
    base = config_to_hf(ModelConfig.preset("tiny-qwen3"))
    assert family_for_hf(base).name == "qwen3"
    # a block size without SDAR's mask id (e.g. a drafter's config.json) stays a causal Qwen3
    assert family_for_hf({**base, "block_size": 16}).name == "qwen3"
    assert family_for_hf({**base, "block_size": 4, "mask_token_id": 255}).name == "sdar"
    qwen2 = config_to_hf(ModelConfig.preset("tiny-qwen2"))
    shifted = {**qwen2, "bd_size": 8, "mask_token_id": 255}
    assert family_for_hf(shifted).name == "block_diffusion" and config_from_hf(shifted).shift_logits
    assert family_for_hf({**qwen2, "block_size": 8, "mask_token_id": 255}).name == "sdar"
    # SDAR's released config.json without block_size: SDAR's published blocks of 4
    sdar = config_to_hf(ModelConfig.preset("tiny-sdar"))
    sdar.pop("block_size")
    assert config_from_hf(sdar).block_size == 4
    # which family exports a block-causal config: shifted -> block_diffusion, unshifted -> sdar
    tiny = ModelConfig.preset("tiny-qwen2", attention="block_causal", block_size=8)
    assert family_of(tiny).name == "sdar" and family_of(tiny.replace(shift_logits=True)).name == "block_diffusion"


def _qwen3_params(c) -> int:
    """A Qwen3 body's parameters, written out: embedding (and head unless tied), per layer two norms,
    q/k/v/o, the q/k norms and the SwiGLU, the final norm."""
    d, hd = c.embed_dim, c.head_dim
    layer = 2 * d + d * (c.num_heads + 2 * c.num_kv_heads) * hd + c.num_heads * hd * d + 2 * hd + 3 * d * c.mlp_dim
    return c.vocab_size * d * (1 if c.tie_embeddings else 2) + c.num_layers * layer + d


def test_published_presets():
    q, s = ModelConfig.preset("Qwen/Qwen3-8B"), ModelConfig.preset("JetLM/SDAR-8B-Chat")
    assert (q.embed_dim, q.num_layers, q.num_heads, q.num_kv_heads, q.head_dim, q.mlp_dim, q.vocab_size) == \
        (4096, 36, 32, 8, 128, 12288, 151936)
    assert q.qk_norm and not (q.qkv_bias or q.out_bias or q.tie_embeddings) and q.max_position == 40960
    assert q.num_params == _qwen3_params(q) and round(q.num_params / 1e9, 1) == 8.2  # Qwen3-8B: 8.2B parameters
    # the published totals: Qwen3-4B 4.0B, Qwen3-1.7B 1.7B (both tied)
    assert [round(_qwen3_params(ModelConfig.preset(n)) / 1e9, 1) for n in ("qwen3-4b", "qwen3-1.7b")] == [4.0, 1.7]
    assert s.replace(attention="causal", block_size=None, mask_token_id=None, max_position=40960,
                     model_type="qwen3") == q
    assert (s.block_size, s.mask_token_id, s.eos_token_id, s.eot_token_id, s.shift_logits) == \
        (4, 151669, 151643, 151645, False)
    # SDAR's released config.json (8B) reads as its preset (the end of turn from Qwen3's vocabulary)
    released = {"architectures": ["SDARForCausalLM"], "model_type": "sdar", "attention_bias": False,
                "bos_token_id": 151643, "eos_token_id": 151643, "block_size": 4, "mask_token_id": 151669,
                "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
                "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 36,
                "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
                "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "use_sliding_window": False, "vocab_size": 151936, "fuse_cross_entropy": True}
    assert config_from_hf(released) == s.replace(pad_token_id=None)
