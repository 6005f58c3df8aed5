"""Dream (Dream-org): a bidirectional Qwen2 diffusion model with token-shifted logits.

Dream-v0-Base-7B / -Instruct-7B: the Qwen2.5-7B shape (28 layers, width 3584, 28 heads / 4 KV heads
of 128, SwiGLU 18944, vocabulary 152,064 untied, RMSNorm eps 1e-6, RoPE theta 1e6, q/k/v biases),
attention bidirectional. Logits are shifted: the logit at position i-1 predicts token i. Special
ids: mask 151666, EOS / pad / BOS 151643.

config.json: Qwen2's keys with `model_type` "Dream" (`jaxdllm.models.families.config_json`); a
Dream config.json with `bd_size` is a block-diffusion model (`block_diffusion`). Tensors: the Hugging
Face Qwen2 names (`model.embed_tokens`, `model.layers.{i}.self_attn.{q,k,v,o}_proj`,
`mlp.{gate,up,down}_proj`, `input_layernorm`, `post_attention_layernorm`, `model.norm`, `lm_head`).
"""

from __future__ import annotations

from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families.config_json import read_hf_decoder, write_hf_decoder
from jaxdllm.models.families.family import Family
from jaxdllm.models.families.qwen2_llama import QWEN_IDS, QWEN2_7B
from jaxdllm.models.families.tensors import HF_DECODER_NAMES, TensorMapping, decoder_table

MODEL_TYPES = ("dream",)
ARCHITECTURE = "DreamModel"
MASK_TOKEN_ID = 151666

PRESETS = {
    # Dream-v0-Base/Instruct-7B: bidirectional Qwen2 with token-shifted logits.
    "dream-7b": ModelConfig(
        **QWEN2_7B, attention="bidirectional", shift_logits=True, max_position=131072, model_type="Dream",
        mask_token_id=MASK_TOKEN_ID, **QWEN_IDS),
    # Tiny size for tests (random weights, fp32).
    "tiny-dream": ModelConfig(
        vocab_size=256, embed_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
        mlp_dim=128, attention="bidirectional", qkv_bias=True, shift_logits=True,
        rope_theta=1e6, max_position=512, model_type="Dream",
        mask_token_id=255, eos_token_id=254, pad_token_id=254, bos_token_id=254),
}
CHECKPOINTS = {"Dream-org/Dream-v0-Base-7B": "dream-7b", "Dream-org/Dream-v0-Instruct-7B": "dream-7b"}


def config_from_hf(raw: dict, where: str) -> ModelConfig:
    """A `ModelConfig` from a Dream config.json: bidirectional, logits shifted."""
    return read_hf_decoder(raw, where, attention="bidirectional", shift_logits=True)


def config_to_hf(c: ModelConfig, out: dict) -> None:
    """Dream's config.json keys (Qwen2's) into `out`."""
    write_hf_decoder(c, out, ARCHITECTURE)


def tensor_table(c: ModelConfig) -> list[TensorMapping]:
    """Every tensor of a Dream checkpoint (Qwen2 names), in file order."""
    return decoder_table(c, HF_DECODER_NAMES)


FAMILY = Family(name="dream", model_types=MODEL_TYPES, checkpoint_format="hf", presets=PRESETS,
                config_from_hf=config_from_hf, config_to_hf=config_to_hf, tensor_table=tensor_table,
                checkpoints=CHECKPOINTS)
