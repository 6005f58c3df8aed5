"""Qwen2 and Llama: causal Hugging Face decoders (Jacobi decoding, Jacobi Forcing, and the base of
Dream and block-diffusion models).

Qwen2.5-7B(-Instruct): 28 layers, width 3584, 28 heads / 4 KV heads of 128, SwiGLU 18944,
vocabulary 152,064 untied, RMSNorm eps 1e-6, RoPE theta 1e6, q/k/v biases (no others). EOS / pad /
BOS 151643; the Instruct model ends a turn with `<|im_end|>` 151645. Meta-Llama-3-8B: 32 layers,
width 4096, 32 heads / 8 KV heads of 128, SwiGLU 14336, vocabulary 128,256, RMSNorm eps 1e-5, RoPE
theta 500,000, no biases; BOS 128000, EOS 128001, end of turn 128009. transformers'
`Qwen2ForCausalLM` / `LlamaForCausalLM` are the numerics reference.

config.json (`jaxdllm.models.families.config_json`): `hidden_size`, `num_attention_heads`,
`num_key_value_heads`, `head_dim`, `num_hidden_layers`, `intermediate_size`, `vocab_size`,
`rms_norm_eps`, `max_position_embeddings`, `tie_word_embeddings`, RoPE (4.x or 5.x keys, scaling
`llama3` or `linear`); Llama adds `attention_bias` (q/k/v and o) and `mlp_bias`. Refused:
`use_sliding_window`, `hidden_act` other than silu. A config.json with `bd_size` is a
block-diffusion model (`block_diffusion`). Tensors: the Hugging Face names
(`jaxdllm.models.families.tensors.HF_DECODER_NAMES`).
"""

from __future__ import annotations

from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families.config_json import read_hf_decoder, write_hf_decoder
from jaxdllm.models.families.family import Family
from jaxdllm.models.families.tensors import HF_DECODER_NAMES, TensorMapping, decoder_table

MODEL_TYPES = ("qwen2", "llama")
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}

# The Qwen2.5-7B shape, which Dream-7B and Fast-dLLM v2 7B share.
QWEN2_7B = dict(vocab_size=152064, embed_dim=3584, num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
                mlp_dim=18944, qkv_bias=True, rope_theta=1e6, norm_eps=1e-6)
QWEN_IDS = dict(eos_token_id=151643, pad_token_id=151643, bos_token_id=151643)
QWEN_IM_END = 151645  # <|im_end|>: where the Instruct models end a turn

PRESETS = {
    # Qwen2.5-7B(-Instruct); the Instruct model stops at <|im_end|> (151645).
    "qwen2.5-7b": ModelConfig(**QWEN2_7B, attention="causal", max_position=32768, model_type="qwen2",
                              eot_token_id=QWEN_IM_END, **QWEN_IDS),
    # Meta-Llama-3-8B shape.
    "llama-3-8b": ModelConfig(
        vocab_size=128256, embed_dim=4096, num_layers=32, num_heads=32, num_kv_heads=8,
        head_dim=128, mlp_dim=14336, attention="causal", rope_theta=500000.0, norm_eps=1e-5,
        max_position=8192, model_type="llama",
        bos_token_id=128000, eos_token_id=128001, eot_token_id=128009),
    # Tiny sizes for tests (random weights, fp32).
    "tiny-qwen2": ModelConfig(
        vocab_size=256, embed_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
        mlp_dim=128, attention="causal", qkv_bias=True, rope_theta=1e6, max_position=512,
        model_type="qwen2", eos_token_id=254, pad_token_id=254, bos_token_id=254),
    "tiny-llama": ModelConfig(
        vocab_size=256, embed_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
        mlp_dim=128, attention="causal", rope_theta=500000.0, norm_eps=1e-5, max_position=512,
        model_type="llama", bos_token_id=253, eos_token_id=254),
}
CHECKPOINTS = {"Qwen/Qwen2.5-7B": "qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b",
               "meta-llama/Meta-Llama-3-8B": "llama-3-8b"}


def config_from_hf(raw: dict, where: str) -> ModelConfig:
    """A `ModelConfig` from a Qwen2 or Llama config.json: causal attention."""
    return read_hf_decoder(raw, where, attention="causal", shift_logits=False)


def config_to_hf(c: ModelConfig, out: dict) -> None:
    """Qwen2 / Llama config.json keys into `out`."""
    write_hf_decoder(c, out, ARCHITECTURES[c.model_type.lower()])


def tensor_table(c: ModelConfig) -> list[TensorMapping]:
    """Every tensor of a Qwen2 / Llama checkpoint, in file order."""
    return decoder_table(c, HF_DECODER_NAMES)


FAMILY = Family(name="qwen2_llama", model_types=MODEL_TYPES, checkpoint_format="hf", presets=PRESETS,
                config_from_hf=config_from_hf, config_to_hf=config_to_hf, tensor_table=tensor_table,
                checkpoints=CHECKPOINTS)
