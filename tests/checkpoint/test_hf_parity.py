"""Logits parity with transformers' LlamaForCausalLM / Qwen2ForCausalLM on random tiny models."""

import numpy as np
import jax.numpy as jnp
import pytest

import jaxdllm
from support.forward import forward
from support.hf_models import SHAPES, hf_logits, make_hf_model
from support.optional import torch

TOL = 1e-4
CASES = [(kind, shape) for kind in ("llama", "qwen2") for shape in SHAPES]


@pytest.fixture(scope="module", params=CASES, ids=[f"{k}-{s}" for k, s in CASES])
def saved(request, tmp_path_factory):
    kind, shape = request.param
    model = make_hf_model(kind, shape)
    path = tmp_path_factory.mktemp(f"{kind}_{shape}")
    model.save_pretrained(path)
    return model, path


def _ids(model, batch=2, length=13, seed=0):
    return np.random.RandomState(seed).randint(0, model.config.vocab_size, (batch, length))


def test_causal_logits_match(saved):
    hf, path = saved
    ours = jaxdllm.from_pretrained(path)
    assert ours.config.attention == "causal"
    ids = _ids(hf)
    np.testing.assert_allclose(np.asarray(forward(ours, jnp.asarray(ids)).logits), hf_logits(hf, ids), atol=TOL, rtol=0)


def test_bidirectional_logits_match_all_visible_4d_mask(saved):
    hf, path = saved
    ours = jaxdllm.from_pretrained(path, attention="bidirectional")
    ids = _ids(hf)
    all_visible = torch.zeros(ids.shape[0], 1, ids.shape[1], ids.shape[1])  # additive: 0 = visible
    ref = hf_logits(hf, ids, attention_mask=all_visible)
    assert np.abs(ref - hf_logits(hf, ids)).max() > 1e-2  # the mask really changes the reference
    np.testing.assert_allclose(np.asarray(forward(ours, jnp.asarray(ids)).logits), ref, atol=TOL, rtol=0)


def test_left_padded_batch_matches(saved):
    """Padding via segment ids + explicit positions equals HF's 2D attention mask."""
    hf, path = saved
    ours = jaxdllm.from_pretrained(path)
    ids = _ids(hf, batch=3, length=9, seed=1)
    pad = np.array([0, 3, 5])
    mask = (np.arange(9)[None] >= pad[:, None]).astype(np.int64)
    positions = np.clip(np.arange(9)[None] - pad[:, None], 0, None)
    ref = hf_logits(hf, ids, attention_mask=torch.as_tensor(mask), position_ids=torch.as_tensor(positions))
    spec = jaxdllm.MaskSpec.from_padding(jnp.asarray(mask), kind="causal")
    got = np.asarray(forward(ours, jnp.asarray(ids), positions=jnp.asarray(positions), attention=spec).logits)
    real = mask.astype(bool)
    np.testing.assert_allclose(got[real], ref[real], atol=TOL, rtol=0)
    assert np.isfinite(got).all()


def test_tied_embeddings_and_bf16(tmp_path):
    hf = make_hf_model("qwen2", "gqa", tie=True)
    hf.save_pretrained(tmp_path)
    ours = jaxdllm.from_pretrained(tmp_path)
    assert ours.config.tie_embeddings and ours.lm_head is None
    ids = _ids(hf)
    np.testing.assert_allclose(np.asarray(forward(ours, jnp.asarray(ids)).logits), hf_logits(hf, ids), atol=TOL, rtol=0)
    half = jaxdllm.from_pretrained(tmp_path, dtype="bfloat16")
    assert half.embed[...].dtype == jnp.bfloat16
    got = np.asarray(forward(half, jnp.asarray(ids)).logits)
    assert got.dtype == np.float32 and np.abs(got - hf_logits(hf, ids)).max() < 0.1
    mixed = jaxdllm.from_pretrained(tmp_path, compute_dtype="bfloat16")
    assert (mixed.embed[...].dtype, mixed.options.dtype) == (jnp.float32, "bfloat16")
    assert np.abs(np.asarray(forward(mixed, jnp.asarray(ids)).logits) - hf_logits(hf, ids)).max() < 0.1


def test_llama_attention_and_mlp_bias(tmp_path):
    hf = make_hf_model("llama", "gqa", attention_bias=True, mlp_bias=True)
    hf.save_pretrained(tmp_path)
    ours = jaxdllm.from_pretrained(tmp_path)
    assert ours.config.qkv_bias and ours.config.out_bias and ours.config.mlp_bias
    ids = _ids(hf)
    np.testing.assert_allclose(np.asarray(forward(ours, jnp.asarray(ids)).logits), hf_logits(hf, ids), atol=TOL, rtol=0)


def test_llama3_rope_scaling(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    hf = make_hf_model("llama", "mha", rope_scaling=scaling)
    hf.save_pretrained(tmp_path)
    ours = jaxdllm.from_pretrained(tmp_path)
    assert ours.config.rope_scaling is not None and ours.config.rope_scaling.type == "llama3"
    ids = _ids(hf, length=40)
    np.testing.assert_allclose(np.asarray(forward(ours, jnp.asarray(ids)).logits), hf_logits(hf, ids), atol=TOL, rtol=0)


def test_dream_config_is_bidirectional_shifted_qwen2(tmp_path):
    hf = make_hf_model("qwen2", "gqa")
    hf.save_pretrained(tmp_path)
    import json
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.update(model_type="Dream", mask_token_id=127, architectures=["DreamModel"])
    (tmp_path / "config.json").write_text(json.dumps(raw))
    ours = jaxdllm.from_pretrained(tmp_path)
    c = ours.config
    assert (c.attention, c.shift_logits, c.qkv_bias, c.mask_token_id) == ("bidirectional", True, True, 127)
    ids = _ids(hf)
    L = ids.shape[1]
    ref = hf_logits(hf, ids, attention_mask=torch.zeros(ids.shape[0], 1, L, L))
    logits = forward(ours, jnp.asarray(ids)).logits
    np.testing.assert_allclose(np.asarray(logits), ref, atol=TOL, rtol=0)
    aligned = np.asarray(jaxdllm.align_logits(logits, c))
    np.testing.assert_array_equal(aligned[:, 1:], np.asarray(logits)[:, :-1])


@pytest.mark.parametrize("kind", ["block_causal", "block_diffusion", "jacobi_forcing"])
def test_structured_masks_match_transformers_with_the_same_dense_mask(saved, kind):
    """The whole model under each structured layout equals transformers fed the dense mask
    (built from the published per-element rules) and the same position ids."""
    from support.mask_rules import brute_force

    hf, path = saved
    ours = jaxdllm.from_pretrained(path)
    block, prefix, n = 3, 4, 12
    if kind == "block_causal":
        length, positions = 12, np.arange(12)
    elif kind == "block_diffusion":  # [x_t ; x_0], both halves at positions 0..n-1
        length, positions = 2 * n, np.concatenate([np.arange(n), np.arange(n)])
    else:  # prompt ++ [noisy_j | clean_j]*, both streams of block j at P + j*block + [0, block)
        blocks = 3
        length = prefix + 2 * block * blocks
        positions = np.concatenate([np.arange(prefix)] + [prefix + j * block + np.arange(block)
                                                          for j in range(blocks) for _ in range(2)])
    ids = _ids(hf, batch=2, length=length, seed=3)
    visible = brute_force(kind, length, length, block=block, prefix=prefix)
    additive = torch.where(torch.as_tensor(visible), 0.0, torch.finfo(torch.float32).min)[None, None]
    ref = hf_logits(hf, ids, attention_mask=additive.expand(2, 1, length, length),
                    position_ids=torch.as_tensor(np.broadcast_to(positions, ids.shape).copy()))
    spec = jaxdllm.MaskSpec(kind=kind, block_size=block, prefix_len=prefix)
    got = forward(ours, jnp.asarray(ids), positions=jnp.asarray(np.broadcast_to(positions, ids.shape)),
                  attention=spec).logits
    np.testing.assert_allclose(np.asarray(got), ref, atol=TOL, rtol=0)
