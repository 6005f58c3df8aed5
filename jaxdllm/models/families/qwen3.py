"""Qwen3 (dense): a causal Hugging Face decoder with q/k RMSNorm (Jacobi decoding, and the base of SDAR).

Qwen3-8B(-Base): 36 layers, width 4096, 32 heads / 8 KV heads of 128, SwiGLU 12288, vocabulary
151,936 untied, RMSNorm eps 1e-6, RoPE theta 1e6, 40,960 positions. Qwen3-4B: 36 layers, width 2560,
32 / 8 heads of 128, SwiGLU 9728, tied embeddings. Qwen3-1.7B: 28 layers, width 2048, 16 / 8 heads of
128, SwiGLU 6144, tied embeddings. (SDAR's reference notes give the 8B shape and the 4B widths; the
4B and 1.7B layer and head counts are those of the published Qwen3 config.json files.) All: no
biases (`attention_bias` false), EOS / pad / BOS 151643 (`<|endoftext|>`); the post-trained models end
a turn with `<|im_end|>` 151645 (their config.json's `eos_token_id`). transformers' `Qwen3ForCausalLM`
is the numerics reference.

Attention differs from Qwen2 in two ways: q and k are RMS-normalised over head_dim, per head, before
RoPE (`self_attn.q_norm` / `k_norm`, `ModelConfig.qk_norm`), and `attention_bias` puts biases on q,
k, v and o together (Qwen2: q/k/v biases always, none on o).

config.json (`jaxdllm.models.families.config_json`): Qwen2's keys (`hidden_size`,
`num_attention_heads`, `num_key_value_heads`, `head_dim`, `num_hidden_layers`, `intermediate_size`,
`vocab_size`, `rms_norm_eps`, `max_position_embeddings`, `tie_word_embeddings`, RoPE in 4.x or 5.x
keys) plus `attention_bias`; `model_type` "qwen3", `architectures` ["Qwen3ForCausalLM"]. Refused:
`use_sliding_window`, `hidden_act` other than silu. A Qwen3 config.json with SDAR's `block_size` and
`mask_token_id` is an SDAR conversion (`sdar`). Tensors: the Hugging Face names
(`jaxdllm.models.families.tensors.HF_DECODER_NAMES`) with `model.layers.{i}.self_attn.{q,k}_norm.weight`
`[head_dim]`.
"""

from __future__ import annotations

from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families.config_json import read_hf_decoder, write_hf_decoder
from jaxdllm.models.families.family import Family
from jaxdllm.models.families.qwen2_llama import QWEN_IDS, QWEN_IM_END
from jaxdllm.models.families.tensors import HF_DECODER_NAMES, TensorMapping, decoder_table

MODEL_TYPES = ("qwen3",)
ARCHITECTURE = "Qwen3ForCausalLM"
VOCAB_SIZE = 151936  # Qwen3's padded vocabulary (SDAR's mask 151669 lies inside it)

# What the published dense sizes share.
QWEN3_SHARED = dict(vocab_size=VOCAB_SIZE, head_dim=128, num_kv_heads=8, qk_norm=True, rope_theta=1e6,
                    norm_eps=1e-6)
QWEN3_8B = dict(QWEN3_SHARED, embed_dim=4096, num_layers=36, num_heads=32, mlp_dim=12288)
QWEN3_4B = dict(QWEN3_SHARED, embed_dim=2560, num_layers=36, num_heads=32, mlp_dim=9728)
QWEN3_1_7B = dict(QWEN3_SHARED, embed_dim=2048, num_layers=28, num_heads=16, mlp_dim=6144)
# A tiny Qwen3 body for tests (random weights, fp32); SDAR's tiny preset shares it.
TINY_QWEN3 = dict(vocab_size=256, embed_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  mlp_dim=128, qk_norm=True, rope_theta=1e6, eos_token_id=254, pad_token_id=254, bos_token_id=254)

PRESETS = {
    # Qwen3-8B(-Base); the post-trained model stops at <|im_end|> (151645).
    "qwen3-8b": ModelConfig(**QWEN3_8B, attention="causal", max_position=40960, model_type="qwen3",
                            eot_token_id=QWEN_IM_END, **QWEN_IDS),
    "qwen3-4b": ModelConfig(**QWEN3_4B, tie_embeddings=True, attention="causal", max_position=40960,
                            model_type="qwen3", eot_token_id=QWEN_IM_END, **QWEN_IDS),
    "qwen3-1.7b": ModelConfig(**QWEN3_1_7B, tie_embeddings=True, attention="causal", max_position=40960,
                              model_type="qwen3", eot_token_id=QWEN_IM_END, **QWEN_IDS),
    # Tiny size for tests (random weights, fp32).
    "tiny-qwen3": ModelConfig(**TINY_QWEN3, attention="causal", max_position=512, model_type="qwen3"),
}
CHECKPOINTS = {"Qwen/Qwen3-8B": "qwen3-8b", "Qwen/Qwen3-8B-Base": "qwen3-8b",
               "Qwen/Qwen3-4B": "qwen3-4b", "Qwen/Qwen3-4B-Base": "qwen3-4b",
               "Qwen/Qwen3-1.7B": "qwen3-1.7b", "Qwen/Qwen3-1.7B-Base": "qwen3-1.7b"}


def config_from_hf(raw: dict, where: str) -> ModelConfig:
    """A `ModelConfig` from a Qwen3 config.json: causal attention, q/k norm, logits not shifted."""
    return read_hf_decoder(raw, where, attention="causal", shift_logits=False)


def config_to_hf(c: ModelConfig, out: dict) -> None:
    """Qwen3 config.json keys into `out`."""
    write_hf_decoder(c, out, ARCHITECTURE)


def tensor_table(c: ModelConfig) -> list[TensorMapping]:
    """Every tensor of a Qwen3 checkpoint (Hugging Face names with the q/k norms), in file order."""
    return decoder_table(c, HF_DECODER_NAMES)


FAMILY = Family(name="qwen3", model_types=MODEL_TYPES, checkpoint_format="hf", presets=PRESETS,
                config_from_hf=config_from_hf, config_to_hf=config_to_hf, tensor_table=tensor_table,
                checkpoints=CHECKPOINTS)
