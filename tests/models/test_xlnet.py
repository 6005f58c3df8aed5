"""XLNet (the any-order model of ASSD) against transformers' `XLNetLMHeadModel` on a tiny random checkpoint
it wrote itself: the query stream under permutation masks from an order (with a visible block, with
padding, with a row whose first target sees nothing), the segment term, the content stream; the export
read back by jaxdllm and by transformers; config errors."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxdllm
from jaxdllm import CheckpointError, ConfigError, ModelConfig
from jaxdllm.checkpoint import config_from_hf
from jaxdllm.models.families.xlnet import XLNetConfig, XLNetLM
from support.forward import call
from support.hf_models import make_hf_xlnet
from support.optional import torch, transformers

VOCAB, B, L = 64, 3, 12


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(transformers model, jaxdllm model, checkpoint folder): 2 layers of width 32, 4 heads, weights drawn
    with a larger spread than the initialiser's so every term (relative, segment, biases) matters."""
    path = tmp_path_factory.mktemp("xlnet")
    model = make_hf_xlnet(path, VOCAB)
    return model, jaxdllm.from_pretrained(path), path


def _order_masks(seed: int, visible: tuple[int, ...], pad: tuple[int, ...]):
    """Per row: `perm_mask [B, L, L]` from an order sigma = [visible ascending | the rest ascending] where
    row b's first `visible[b]` columns are the prompt (its visible x visible block cleared, as ASSD does), and
    its last `pad[b]` columns padding (blocked for every query); targets: the masked columns, K per row."""
    rng = np.random.default_rng(seed)
    perm = np.zeros((B, L, L), bool)
    k = min(L - v - p for v, p in zip(visible, pad))
    targets = np.zeros((B, k), np.int32)
    for b, (v, p) in enumerate(zip(visible, pad)):
        real = L - p
        masked = np.sort(rng.choice(np.arange(v, real), real - v, replace=False))  # every non-prompt column
        rank = np.empty(L, np.int64)
        rank[np.r_[np.arange(v), masked, np.arange(real, L)]] = np.arange(L)
        perm[b] = rank[:, None] <= rank[None, :]
        perm[b, :v, :v] = False
        perm[b, :, real:] = True
        targets[b] = np.sort(rng.choice(masked, k, replace=False))
    return perm, targets


def _torch_logits(model, ids, perm, targets, **kw):
    mapping = np.zeros((*targets.shape, L), np.float32)
    for b, row in enumerate(targets):
        mapping[b, np.arange(len(row)), row] = 1.0
    with torch.no_grad():
        return model(torch.tensor(ids), perm_mask=torch.tensor(perm, dtype=torch.float32),
                     target_mapping=torch.tensor(mapping), **kw).logits.numpy()


def _ids(seed):
    return np.random.default_rng(seed).integers(0, VOCAB, (B, L))


def test_two_stream_equals_transformers_under_order_masks(pair):
    theirs, ours, _ = pair
    ids = _ids(1)
    # row 0: a prompt of 4; row 1: no prompt (its first target sees no key: uniform attention, as there);
    # row 2: a prompt of 2 and 3 padded columns
    perm, targets = _order_masks(2, visible=(4, 0, 2), pad=(0, 0, 3))
    want = _torch_logits(theirs, ids, perm, targets)
    got = jax.jit(ours.two_stream)(jnp.asarray(ids, jnp.int32), jnp.asarray(perm), jnp.asarray(targets))
    assert got.shape == (B, targets.shape[1], VOCAB) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)
    # the call the trainer makes gives the same logits
    out = call(ours, jnp.asarray(ids, jnp.int32), perm_mask=jnp.asarray(perm), target_positions=jnp.asarray(targets))
    np.testing.assert_allclose(np.asarray(out.logits), want, atol=1e-4, rtol=1e-4)


def test_segment_term_and_content_stream_equal_transformers(pair):
    theirs, ours, path = pair
    ids = _ids(3)
    perm, targets = _order_masks(4, visible=(3, 5, 1), pad=(0, 2, 0))
    types = np.random.default_rng(5).integers(0, 2, (B, L))
    want = _torch_logits(theirs, ids, perm, targets, token_type_ids=torch.tensor(types))
    got = call(ours, jnp.asarray(ids, jnp.int32), jnp.asarray(perm), jnp.asarray(targets),
               token_type_ids=jnp.asarray(types, jnp.int32), method="two_stream")
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)
    # no target_mapping: transformers returns the content stream at every position (here: scanned layers)
    with torch.no_grad():
        content = theirs(torch.tensor(ids), perm_mask=torch.tensor(perm, dtype=torch.float32)).logits.numpy()
    scanned = jaxdllm.from_pretrained(path, scan_layers=True)
    out = call(scanned, jnp.asarray(ids, jnp.int32), perm_mask=jnp.asarray(perm)).logits
    np.testing.assert_allclose(np.asarray(out), content, atol=1e-4, rtol=1e-4)


def test_export_reads_back_in_jaxdllm_and_transformers(pair, tmp_path):
    theirs, ours, _ = pair
    assert isinstance(ours, XLNetLM) and isinstance(ours.config, XLNetConfig)
    jaxdllm.save_pretrained(ours, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == "xlnet" and (raw["d_model"], raw["n_layer"], raw["d_head"]) == (32, 2, 8)
    again = jaxdllm.from_pretrained(tmp_path)
    back = transformers.XLNetLMHeadModel.from_pretrained(tmp_path).eval()
    ids = _ids(6)
    perm, targets = _order_masks(7, visible=(2, 6, 0), pad=(1, 0, 0))
    want = _torch_logits(theirs, ids, perm, targets)
    np.testing.assert_allclose(_torch_logits(back, ids, perm, targets), want, atol=1e-5)
    got = call(again, jnp.asarray(ids, jnp.int32), jnp.asarray(perm), jnp.asarray(targets), method="two_stream")
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)


def test_presets_and_config_errors():
    base = ModelConfig.preset("therealgabeguo/ASARM")
    assert (base.num_layers, base.embed_dim, base.num_heads, base.mlp_dim, base.vocab_size) == (12, 768, 12, 3072,
                                                                                              32000)
    assert base.mask_token_id == 6 and 100e6 < base.num_params < 130e6
    with pytest.raises(ConfigError, match=r"num_heads \(4\) x head_dim \(10\) must equal embed_dim \(32\)"):
        ModelConfig.preset("tiny-xlnet", embed_dim=32, head_dim=10)
    raw = {"model_type": "xlnet", "vocab_size": 32000, "d_model": 32, "n_layer": 1, "n_head": 4, "d_inner": 64}
    assert config_from_hf(raw).mask_token_id == 6  # the published tokenizer's <mask> when config.json names none
    with pytest.raises(CheckpointError, match="attn_type='uni' is not supported"):
        config_from_hf({**raw, "attn_type": "uni"})
    model = XLNetLM(ModelConfig.preset("tiny-xlnet"), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="no K/V cache"):
        model.init_cache(1, 8)
