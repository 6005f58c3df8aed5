"""BERT (GenMol's backbone) against transformers' `BertForMaskedLM` on a tiny random checkpoint it wrote
itself: the logits under right padding, the export read back by jaxdllm and transformers, GenMol's
Lightning checkpoint converted with and without its EMA weights, config errors, and a generation through
the one sampler loop."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxdllm
from jaxdllm import CheckpointError, ConfigError, ModelConfig, SamplerConfig
from jaxdllm.attention import MaskSpec
from jaxdllm.checkpoint import config_from_hf
from jaxdllm.models.families import family_of
from jaxdllm.models.families.bert import GENMOL_IDS, BertConfig, BertLM
from jaxdllm.models.families.bert.genmol_checkpoint import convert_genmol_checkpoint, main, write_genmol_lengths
from jaxdllm.molecules.bracket_safe import read_safe_format
from support.forward import forward
from support.optional import torch, transformers

VOCAB, B, L = 40, 3, 10
# tiny BertConfig kwargs, as GenMol's `model:` block holds them
HF_KW = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=24, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, pad_token_id=3)


def _hf_bert(seed: int = 0):
    """A random `BertForMaskedLM` in eval mode, fp32, weights with a larger spread than the initialiser's
    (biases and norms too) so every term matters."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(**HF_KW)
    config._attn_implementation = "eager"
    model = transformers.BertForMaskedLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.15))
    return model


def _batch(seed: int):
    """`(ids [B, L], attention_mask [B, L])`: right padding (row 1: 3 pads, row 2: 6)."""
    ids = np.random.default_rng(seed).integers(5, VOCAB, (B, L))
    mask = np.ones((B, L), np.int64)
    mask[1, -3:] = 0
    mask[2, -6:] = 0
    ids[mask == 0] = HF_KW["pad_token_id"]
    return ids, mask


def _torch_logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def _our_logits(model, ids, mask):
    attention = MaskSpec.from_padding(jnp.asarray(mask, jnp.int32))
    return np.asarray(jax.jit(lambda i, a: model(i, attention=a).logits)(jnp.asarray(ids, jnp.int32), attention))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(transformers model, jaxdllm model, checkpoint folder)."""
    path = tmp_path_factory.mktemp("bert")
    model = _hf_bert()
    model.save_pretrained(path, safe_serialization=True)
    return model, jaxdllm.from_pretrained(path), path


def test_logits_equal_transformers_under_padding(pair):
    theirs, ours, _ = pair
    assert isinstance(ours, BertLM) and isinstance(ours.config, BertConfig)
    ids, mask = _batch(1)
    want = _torch_logits(theirs, ids, mask)
    got = _our_logits(ours, ids, mask)
    assert got.shape == (B, L, VOCAB) and got.dtype == np.float32
    real = mask.astype(bool)
    np.testing.assert_allclose(got[real], want[real], atol=1e-5, rtol=1e-5)
    # no mask, default positions; then explicit positions (the sampler's logical ones) shift the table rows
    full = np.random.default_rng(2).integers(0, VOCAB, (B, L))
    np.testing.assert_allclose(np.asarray(forward(ours, jnp.asarray(full, jnp.int32)).logits),
                               _torch_logits(theirs, full, np.ones_like(full)), atol=1e-5, rtol=1e-5)
    pos = np.broadcast_to(np.arange(L) + 5, (B, L))
    with torch.no_grad():
        shifted = theirs(input_ids=torch.tensor(full), position_ids=torch.tensor(pos)).logits.numpy()
    moved = forward(ours, jnp.asarray(full, jnp.int32), jnp.asarray(pos, jnp.int32)).logits
    np.testing.assert_allclose(np.asarray(moved),
                               shifted, atol=1e-5, rtol=1e-5)


def test_scanned_layers_give_the_same_logits(pair):
    theirs, _, path = pair
    ids, mask = _batch(3)
    got = _our_logits(jaxdllm.from_pretrained(path, scan_layers=True), ids, mask)
    real = mask.astype(bool)
    np.testing.assert_allclose(got[real], _torch_logits(theirs, ids, mask)[real], atol=1e-5, rtol=1e-5)


def test_export_reads_back_in_jaxdllm_and_transformers(pair, tmp_path):
    theirs, ours, _ = pair
    jaxdllm.save_pretrained(ours, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == "bert" and raw["architectures"] == ["BertForMaskedLM"]
    assert (raw["hidden_size"], raw["num_hidden_layers"], raw["max_position_embeddings"]) == (32, 2, 24)
    back = transformers.BertForMaskedLM.from_pretrained(tmp_path).eval()
    want = theirs.state_dict()
    for name, tensor in back.state_dict().items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=0, msg=name)
    ids, mask = _batch(4)
    real = mask.astype(bool)
    np.testing.assert_allclose(_our_logits(jaxdllm.from_pretrained(tmp_path), ids, mask)[real],
                               _torch_logits(theirs, ids, mask)[real], atol=1e-5, rtol=1e-5)


class ConfigNode:
    """A stand-in for OmegaConf's `DictConfig` (what GenMol's checkpoint pickles): keys and item access,
    not a dict."""

    def __init__(self, values: dict):
        self._values = values

    def keys(self):
        return self._values.keys()

    def __getitem__(self, key):
        return self._values[key]


def _lightning_checkpoint(path, model, **training):
    """What GenMol's trainer saves for `model` as its backbone: `state_dict` under `backbone.` (with the
    position_ids buffer), the config's `model:` block and `training:` block (`training` adds to it; V2 sets
    `use_bracket_safe`), an EMA whose shadow params are the parameters perturbed, in `parameters()` order.
    Returns the shadow params."""
    state = {"backbone." + k: v.clone() for k, v in model.state_dict().items()}
    state["backbone.bert.embeddings.position_ids"] = torch.arange(HF_KW["max_position_embeddings"])[None]
    gen = torch.Generator().manual_seed(7)
    shadow = [p.detach().clone() + 0.05 * torch.randn(p.shape, generator=gen) for p in model.parameters()]
    config = ConfigNode({"model": ConfigNode(dict(HF_KW)), "training": ConfigNode({"ema": 0.9999, **training})})
    torch.save({"state_dict": state, "epoch": 0, "global_step": 10, "optimizer_states": [],
                "hyper_parameters": {"config": config},
                "ema": {"decay": 0.9999, "num_updates": 10, "shadow_params": shadow}}, path)
    return shadow


def test_genmol_lightning_checkpoint_converts_with_and_without_ema(tmp_path):
    trained = _hf_bert(seed=1)
    shadow = _lightning_checkpoint(tmp_path / "model.ckpt", trained)
    ema = _hf_bert(seed=1)
    with torch.no_grad():
        for p, s in zip(ema.parameters(), shadow):
            p.copy_(s)
    ids, mask = _batch(5)
    real = mask.astype(bool)
    for use_ema, reference in ((True, ema), (False, trained)):
        out = convert_genmol_checkpoint(tmp_path / "model.ckpt", tmp_path / f"out-{use_ema}", use_ema=use_ema)
        raw = json.loads((out / "config.json").read_text())
        assert raw["genmol_checkpoint"]["ema"] is use_ema
        assert read_safe_format(out) == "safe"  # V1 writes plain SAFE
        model = jaxdllm.from_pretrained(out)
        assert (model.config.mask_token_id, model.config.bos_token_id, model.config.eos_token_id,
                model.config.pad_token_id) == (4, 1, 2, 3)
        np.testing.assert_allclose(_our_logits(model, ids, mask)[real], _torch_logits(reference, ids, mask)[real],
                                   atol=1e-5, rtol=1e-5)
    # the EMA weights differ from the trained ones (the two conversions are not the same model)
    assert not np.allclose(_torch_logits(ema, ids, mask), _torch_logits(trained, ids, mask), atol=1e-3)


@pytest.fixture(scope="module")
def genmol_v2_folder(tmp_path_factory):
    """A GenMol V2-style checkpoint (`training.use_bracket_safe: true`) with its len.pk, converted."""
    import pickle

    tmp = tmp_path_factory.mktemp("genmol-v2")
    _lightning_checkpoint(tmp / "model_v2.ckpt", _hf_bert(seed=3), use_bracket_safe=True)
    (tmp / "len.pk").write_bytes(pickle.dumps([10, 12, 12, 9]))  # GenMol's lengths count [CLS] and [SEP]
    return convert_genmol_checkpoint(tmp / "model_v2.ckpt", tmp / "v2", lengths_pk=tmp / "len.pk")


def test_a_genmol_v2_checkpoint_converts_with_its_format_and_lengths(genmol_v2_folder):
    """V2 samples `<k>` attachments: the folder records it; len.pk becomes lengths.json without [CLS]/[SEP]."""
    assert read_safe_format(genmol_v2_folder) == "bracket"
    table = json.loads((genmol_v2_folder / "lengths.json").read_text())
    assert table == {"token_lengths": {"7": 1, "8": 1, "10": 2}}


def test_a_converted_v2_model_designs_in_bracket_safe(genmol_v2_folder):
    """A designer loaded from the folder writes its prompts and reads its samples as V2 does, and puts
    GenMol's number of masks on a canvas."""
    pytest.importorskip("rdkit")
    pytest.importorskip("safe")
    from jaxdllm.molecules.design import Designer
    from jaxdllm.molecules.safe_tokenizer import build_safe_tokenizer, save_safe_tokenizer

    save_safe_tokenizer(build_safe_tokenizer(["c1<1>ccc(Cl)cc1.C<1>"]), genmol_v2_folder)
    designer = Designer.load(genmol_v2_folder)
    # a de novo canvas of a drawn length 12 holds 10 masks between [CLS] and [SEP], as GenMol's _insert_mask puts them
    assert set(designer._lengths("", "denovo", 40, np.random.default_rng(0), 0)) == {7, 8, 10}
    assert designer.safe_format == "bracket" and designer._fragment_prompt("[*]c1ccc(Cl)cc1") == "c1<1>ccc(Cl)cc1."
    assert designer.decode("c1<1>ccc(Cl)cc1.C<1>") == "Cc1ccc(Cl)cc1"


def test_genmol_converter_errors_and_command(tmp_path):
    model = _hf_bert(seed=2)
    _lightning_checkpoint(tmp_path / "model.ckpt", model)
    ckpt = torch.load(tmp_path / "model.ckpt", weights_only=False)
    ckpt["ema"]["shadow_params"] = ckpt["ema"]["shadow_params"][:-1]
    torch.save(ckpt, tmp_path / "short.ckpt")
    with pytest.raises(CheckpointError, match=r"shadow_params holds 41 tensors but the backbone has 42 parameters"):
        convert_genmol_checkpoint(tmp_path / "short.ckpt", tmp_path / "x")
    del ckpt["ema"]
    torch.save(ckpt, tmp_path / "noema.ckpt")
    with pytest.raises(CheckpointError, match="no EMA weights"):
        convert_genmol_checkpoint(tmp_path / "noema.ckpt", tmp_path / "x")
    with pytest.raises(CheckpointError, match="does not exist"):
        convert_genmol_checkpoint(tmp_path / "absent.ckpt", tmp_path / "x")
    (tmp_path / "bad.pk").write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match="not GenMol's len.pk"):
        write_genmol_lengths(tmp_path / "bad.pk", tmp_path / "x")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    assert main([str(tmp_path / "noema.ckpt"), str(tmp_path / "cli"), "--no-ema", "--tokenizer",
                 str(tmp_path / "tok")]) == 0
    assert (tmp_path / "cli" / "tokenizer.json").is_file() and (tmp_path / "cli" / "model.safetensors").is_file()


def test_presets_and_config_errors():
    genmol = ModelConfig.preset("nvidia/NV-GenMol-89M-v1")
    assert genmol == ModelConfig.preset("genmol-89m") and isinstance(genmol, BertConfig)
    assert (genmol.num_layers, genmol.embed_dim, genmol.num_heads, genmol.mlp_dim, genmol.max_position,
            genmol.vocab_size) == (12, 768, 12, 3072, 256, 1880)
    assert {k: getattr(genmol, k) for k in GENMOL_IDS} == GENMOL_IDS
    assert 87.2e6 < genmol.num_params < 87.4e6  # the tied decoder counted once (GenMol's "89M" counts it twice)
    assert family_of(genmol).scores_likelihood  # a masked diffusion model: masked forwards score it
    with pytest.raises(ConfigError, match=r"num_heads \(4\) x head_dim \(16\) must equal embed_dim \(256\)"):
        ModelConfig.preset("tiny-bert", head_dim=16)
    with pytest.raises(ConfigError, match="hidden_act 'tanh' is not supported"):
        ModelConfig.preset("tiny-bert", hidden_act="tanh")
    with pytest.raises(ConfigError, match="attention must be 'bidirectional'"):
        ModelConfig.preset("tiny-bert", attention="causal")
    with pytest.raises(ConfigError, match="tie_embeddings must be True"):
        ModelConfig.preset("tiny-bert", tie_embeddings=False)
    with pytest.raises(ConfigError, match="type_vocab_size must be a positive integer"):
        ModelConfig.preset("tiny-bert", type_vocab_size=0)
    raw = {"model_type": "bert", "vocab_size": 1880, "hidden_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 4, "intermediate_size": 64, "pad_token_id": 3}
    assert {k: getattr(config_from_hf(raw), k) for k in GENMOL_IDS} == GENMOL_IDS  # GenMol's vocabulary
    assert config_from_hf({**raw, "vocab_size": 30522, "pad_token_id": 0}).mask_token_id is None
    with pytest.raises(CheckpointError, match="position_embedding_type='relative_key' is not supported"):
        config_from_hf({**raw, "position_embedding_type": "relative_key"})
    with pytest.raises(CheckpointError, match="is_decoder"):
        config_from_hf({**raw, "is_decoder": True})
    with pytest.raises(CheckpointError, match="hidden_size \\(32\\) is not a multiple of num_attention_heads"):
        config_from_hf({**raw, "num_attention_heads": 5})


def test_a_random_bert_generates_in_the_sampler_loop():
    config = ModelConfig.preset("tiny-bert", num_layers=1, embed_dim=64, head_dim=16, mlp_dim=128)
    model = BertLM(config, rngs=nnx.Rngs(0))
    ids = jnp.asarray([[1, 30, 31, 32], [1, 40, 41, 42]], jnp.int32)
    sampler = SamplerConfig.preset("llada", gen_length=16, block_length=8, steps=8)
    out = jaxdllm.generate(model, ids, sampler)
    assert out.generated.shape == (2, 16)
    assert not (np.asarray(out.tokens) == config.mask_token_id).any()
    # the shared forward's cache and logits_slice: the same logits
    full = forward(model, out.tokens).logits
    cached = forward(model, out.tokens, cache=model.init_cache(2, out.tokens.shape[1]))
    np.testing.assert_allclose(np.asarray(cached.logits), np.asarray(full), atol=1e-6)
    sliced = jax.jit(lambda t: model(t, logits_slice=(3, 4)).logits)(out.tokens)
    np.testing.assert_allclose(np.asarray(sliced), np.asarray(full[:, 3:7]),
                               atol=1e-6)
