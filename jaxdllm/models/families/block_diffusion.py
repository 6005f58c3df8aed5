"""Block diffusion on a Qwen2 base (Fast-dLLM v2 style): Qwen2 weights and names, block-causal
attention (bidirectional inside a block, causal across blocks), token-shifted logits.

Fast-dLLM v2 7B (Efficient-Large-Model, retrofitted on Qwen2.5-7B-Instruct): the Qwen2.5-7B shape,
blocks of 32 (its sampler decodes sub-blocks of 8), mask 151665, stop at `<|im_end|>` 151645, pad /
BOS 151643.

config.json: a Qwen2 (or Dream, or Llama) config.json whose `bd_size` key holds the block size;
every other key as that base family reads it. A `ModelConfig` with `checkpoint_format` "hf",
block-causal attention and shifted logits exports this way (unshifted: SDAR's layout, `sdar`, whose
config.json key is `block_size`). Tensors: the Hugging Face Qwen2 / Llama names.

Decoding (every block-causal model, BD3-LM's and LLaDA2's too): the published layout of
`jaxdllm.decoding.layout`. Blocks sit at absolute positions from the start of each row; the block
that holds the prompt's end is completed with MASK and decoded first (its prompt tokens stay), and
decoding blocks smaller than the model's (Fast-dLLM v2's sub-blocks of 8: `block_length=8`,
`cache="block"`) run in order inside it, those wholly inside the prompt skipped. One difference is
kept: Fast-dLLM v2's `batch_sample` takes each block's first token from the argmax of the forward
that writes the previous block into its cache; here the block's own steps decide it, from the
same logit (a block's last position sees nothing after it), under the step's commit rule, so every
decided token comes from a counted forward.
"""

from __future__ import annotations

from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families import dream, qwen2_llama
from jaxdllm.models.families.config_json import read_hf_decoder, write_hf_decoder
from jaxdllm.models.families.family import Family, model_type_of
from jaxdllm.models.families.qwen2_llama import QWEN2_7B, QWEN_IDS, QWEN_IM_END
from jaxdllm.models.families.tensors import HF_DECODER_NAMES, TensorMapping, decoder_table

BLOCK_SIZE_KEY = "bd_size"  # config.json key of the block size
BASE_MODEL_TYPES = qwen2_llama.MODEL_TYPES + dream.MODEL_TYPES  # the config.jsons a block size turns into this family
_ARCHITECTURES = {**qwen2_llama.ARCHITECTURES, "dream": dream.ARCHITECTURE}

PRESETS = {
    # Fast-dLLM v2: block diffusion retrofitted on Qwen2.5-7B-Instruct.
    "fast-dllm-v2-7b": ModelConfig(
        **QWEN2_7B, attention="block_causal", block_size=32, shift_logits=True, max_position=32768,
        model_type="qwen2", mask_token_id=151665, eos_token_id=QWEN_IM_END, eot_token_id=QWEN_IM_END,
        pad_token_id=QWEN_IDS["pad_token_id"], bos_token_id=QWEN_IDS["bos_token_id"]),
    # Tiny size for tests (random weights, fp32).
    "tiny-block-diffusion": ModelConfig(
        vocab_size=256, embed_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
        mlp_dim=128, attention="block_causal", block_size=8, qkv_bias=True, shift_logits=True,
        rope_theta=1e6, max_position=512, model_type="qwen2",
        mask_token_id=255, eos_token_id=254, pad_token_id=254, bos_token_id=254),
}
CHECKPOINTS = {"Efficient-Large-Model/Fast_dLLM_v2_7B": "fast-dllm-v2-7b"}


def reads(raw: dict) -> bool:
    """A Qwen2 / Dream / Llama config.json with a block size."""
    return model_type_of(raw) in BASE_MODEL_TYPES and bool(raw.get(BLOCK_SIZE_KEY))


def holds(c: ModelConfig) -> bool:
    """A block-causal model with shifted logits and Hugging Face names on one of the base model types
    (unshifted: `sdar`)."""
    return (c.checkpoint_format == "hf" and c.attention == "block_causal" and c.shift_logits
            and c.model_type.lower() in BASE_MODEL_TYPES)


def config_from_hf(raw: dict, where: str) -> ModelConfig:
    """A `ModelConfig` from a block-diffusion config.json: block-causal, logits shifted."""
    return read_hf_decoder(raw, where, attention="block_causal", shift_logits=True, block_size=raw[BLOCK_SIZE_KEY])


def config_to_hf(c: ModelConfig, out: dict) -> None:
    """The base model's config.json keys plus the block size into `out`."""
    write_hf_decoder(c, out, _ARCHITECTURES[c.model_type.lower()], **{BLOCK_SIZE_KEY: c.block_size})


def tensor_table(c: ModelConfig) -> list[TensorMapping]:
    """Every tensor of a block-diffusion checkpoint (its base's Hugging Face names), in file order."""
    return decoder_table(c, HF_DECODER_NAMES)


FAMILY = Family(name="block_diffusion", model_types=(), checkpoint_format="hf", presets=PRESETS,
                config_from_hf=config_from_hf, config_to_hf=config_to_hf, tensor_table=tensor_table,
                checkpoints=CHECKPOINTS, reads=reads, holds=holds)
