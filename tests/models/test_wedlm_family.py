"""The WeDLM family reads both released config.json forms (WeDLM-7B: a Qwen2.5 body with q/k/v biases;
WeDLM-8B: a Qwen3 body with q/k norm) into the published shapes, writes them back, and takes its mask
from the checkpoint's tokenizer when config.json says null. (Numerics: the tiny WeDLM checkpoint of
`tests/decoding/test_wedlm_generate.py` decodes as the published procedure over transformers' Qwen3.)"""

import json

import pytest

from jaxdllm.checkpoint.folder import Checkpoint
from jaxdllm.checkpoint.hf_config import config_from_hf, config_to_hf
from jaxdllm.models.config import PRESETS

# The released config.json files' keys (the shape, the flags, the special ids; `layer_types` and
# `auto_map` are kept as they are through source_config).
RELEASED = {
    "wedlm-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, head_dim=128, vocab_size=152064, attention_bias=True, qk_norm=False),
    "wedlm-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, attention_bias=False, qk_norm=True),
}
COMMON = dict(model_type="wedlm", architectures=["WeDLMForCausalLM"], mask_token_id=None, hidden_act="silu",
              max_position_embeddings=16384, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False,
              eos_token_id=151643, pad_token_id=151643, bos_token_id=151643,
              auto_map={"AutoConfig": "configuration_wedlm.WeDLMConfig"})


@pytest.mark.parametrize("preset", sorted(RELEASED))
def test_released_config_json_reads_as_the_preset(preset):
    config = config_from_hf({**COMMON, **RELEASED[preset]})
    want = PRESETS[preset]
    for field in ("embed_dim", "num_layers", "num_heads", "num_kv_heads", "mlp_dim", "vocab_size", "qkv_bias",
                  "out_bias", "qk_norm", "attention", "shift_logits", "max_position", "eos_token_id",
                  "eot_token_id"):
        assert getattr(config, field) == getattr(want, field), field
    written = config_to_hf(config)
    assert (written["model_type"], written["qk_norm"], written["attention_bias"]) == (
        "wedlm", RELEASED[preset]["qk_norm"], RELEASED[preset]["attention_bias"])
    assert written["auto_map"] == COMMON["auto_map"]


def test_mask_from_the_tokenizer_when_config_json_has_none(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**COMMON, **RELEASED["wedlm-8b"]}))
    assert Checkpoint.open(tmp_path).config.mask_token_id is None
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"id": 151666, "content": "<|mask|>"}]}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"mask_token": {"content": "<|mask|>"}}))
    assert Checkpoint.open(tmp_path).config.mask_token_id == 151666
