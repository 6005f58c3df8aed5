"""SDAR (JetAstra/SDAR, JetLM checkpoints): block diffusion converted from a causal LM. The weights
and tensor names are the base model's; attention is block-causal (bidirectional inside a block of
`block_size`, causal across blocks, blocks counted from position 0); logits are NOT shifted (a
masked slot reads its own logit, unlike Fast-dLLM v2's `block_diffusion`).

Published checkpoints (`JetLM/SDAR-{1.7B,4B,8B}-Chat`, converted from Qwen3-*-Base): the Qwen3 body
(q/k RMSNorm, no biases), untied embeddings, blocks of 4, mask 151669 (`<|MASK|>`, inside Qwen3's
151,936-row vocabulary), 32,768 positions, BOS / EOS 151643 in config.json; generation_config.json
ends a turn at `<|im_end|>` 151645 too (`eot_token_id`). SDAR-8B-Chat: the Qwen3-8B shape (36 layers,
width 4096, 32 / 8 heads of 128, SwiGLU 12288). SDAR-4B-Chat: width 2560, SwiGLU 9728 (36 layers, 32
/ 8 heads of 128 as Qwen3-4B; untied as the 1.7B and 8B, whose config.json files say so).
SDAR-1.7B-Chat: 28 layers, width 2048, 16 / 8 heads of 128, SwiGLU 6144, untied. The block-size
variants (`-b8` ... `-b64`) differ only in `block_size`. Not here: SDAR-30B-A3B (the Qwen3-MoE
body routes with a softmax over 128 experts, 8 per token, without groups or shared experts; the
MoE layers of `jaxdllm.models.moe` route LLaDA2's way, sigmoid scores with group-limited top-k).

config.json, two ways:
- SDAR's released form: `model_type` "sdar", `architectures` ["SDARForCausalLM"], `auto_map` to its
  remote code, Qwen3's keys (`attention_bias`: biases on q, k, v and o; `head_dim`; ...), plus
  `block_size` (default 4 when absent) and `mask_token_id`; its other keys (`fuse_cross_entropy`,
  `attn_implementation`, `ep_size`, ...) are kept through `ModelConfig.source_config`.
- A conversion of a causal checkpoint by a jaxdllm recipe: the base's own config.json (`model_type`
  "qwen2", "qwen3" or "llama", its `architectures`, its biases and q/k norm) plus SDAR's keys
  `block_size` and `mask_token_id` (both required: a config.json with only `block_size` is not
  taken for SDAR). A Qwen2 / Dream / Llama config.json with `bd_size` is Fast-dLLM v2's
  `block_diffusion` (shifted logits) instead.
A `ModelConfig` with `checkpoint_format` "hf", block-causal attention, unshifted logits and one of
those model_types exports this way (as does any "sdar" config). Tensors: the Hugging Face names
(`jaxdllm.models.families.tensors.HF_DECODER_NAMES`, with the q/k norms on a Qwen3 body).

Decoding: sampler preset "sdar" (blocks of the model's `block_size`, in the published layout of
`jaxdllm.decoding.layout`: absolute blocks, the prompt's last partial block completed with MASK).
"""

from __future__ import annotations

from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families import qwen2_llama, qwen3
from jaxdllm.models.families.config_json import read_hf_decoder, write_hf_decoder
from jaxdllm.models.families.family import Family, model_type_of
from jaxdllm.models.families.qwen2_llama import QWEN_IDS, QWEN_IM_END
from jaxdllm.models.families.tensors import HF_DECODER_NAMES, TensorMapping, decoder_table

MODEL_TYPES = ("sdar",)
ARCHITECTURE = "SDARForCausalLM"
BLOCK_SIZE_KEY = "block_size"  # SDAR's config.json key (Fast-dLLM v2's is `bd_size`)
BLOCK_SIZE = 4  # SDAR's published block size (its config.json says so; the default when absent)
MASK_TOKEN_ID = 151669  # <|MASK|> in Qwen3's vocabulary
# The causal model_types whose config.json, with `block_size` and `mask_token_id`, is an SDAR conversion.
BASE_MODEL_TYPES = qwen2_llama.MODEL_TYPES + qwen3.MODEL_TYPES
_ARCHITECTURES = {**qwen2_llama.ARCHITECTURES, "qwen3": qwen3.ARCHITECTURE, "sdar": ARCHITECTURE}

_SDAR = dict(attention="block_causal", block_size=BLOCK_SIZE, shift_logits=False, max_position=32768,
             model_type="sdar", mask_token_id=MASK_TOKEN_ID, eot_token_id=QWEN_IM_END, **QWEN_IDS)

PRESETS = {
    # SDAR-8B-Chat (from Qwen3-8B-Base).
    "sdar-8b": ModelConfig(**qwen3.QWEN3_8B, **_SDAR),
    # SDAR-4B-Chat (from Qwen3-4B-Base; untied, as SDAR's 1.7B and 8B).
    "sdar-4b": ModelConfig(**qwen3.QWEN3_4B, **_SDAR),
    # SDAR-1.7B-Chat (from Qwen3-1.7B-Base; untied, unlike Qwen3-1.7B).
    "sdar-1.7b": ModelConfig(**qwen3.QWEN3_1_7B, **_SDAR),
    # Tiny size for tests (random weights, fp32): a tiny Qwen3 body, blocks of 4.
    "tiny-sdar": ModelConfig(**qwen3.TINY_QWEN3, attention="block_causal", block_size=4, max_position=512,
                             model_type="sdar", mask_token_id=255),
}
CHECKPOINTS = {"JetLM/SDAR-8B-Chat": "sdar-8b", "JetLM/SDAR-4B-Chat": "sdar-4b", "JetLM/SDAR-1.7B-Chat": "sdar-1.7b"}


def reads(raw: dict) -> bool:
    """SDAR's own config.json, or a Qwen2 / Qwen3 / Llama config.json with SDAR's `block_size` and
    `mask_token_id` (and no `bd_size`: that is `block_diffusion`'s)."""
    kind = model_type_of(raw)
    if kind in MODEL_TYPES:
        return True
    return (kind in BASE_MODEL_TYPES and bool(raw.get(BLOCK_SIZE_KEY)) and raw.get("mask_token_id") is not None
            and not raw.get("bd_size"))


def holds(c: ModelConfig) -> bool:
    """An "sdar" config, or a block-causal model with unshifted logits and Hugging Face names on one of
    the base model types (a shifted one is `block_diffusion`'s)."""
    if c.checkpoint_format != "hf":
        return False
    kind = c.model_type.lower()
    return kind in MODEL_TYPES or (kind in BASE_MODEL_TYPES and c.attention == "block_causal" and not c.shift_logits)


def config_from_hf(raw: dict, where: str) -> ModelConfig:
    """A `ModelConfig` from an SDAR config.json: block-causal, logits not shifted; the released form
    defaults the block size (4), and on Qwen3's vocabulary the mask (151669) and the end of turn (151645)."""
    block = int(raw.get(BLOCK_SIZE_KEY) or BLOCK_SIZE)
    c = read_hf_decoder(raw, where, attention="block_causal", shift_logits=False, block_size=block)
    if model_type_of(raw) in MODEL_TYPES and c.vocab_size == qwen3.VOCAB_SIZE:
        c = c.replace(mask_token_id=MASK_TOKEN_ID if c.mask_token_id is None else c.mask_token_id,
                      eot_token_id=QWEN_IM_END)
    return c


def config_to_hf(c: ModelConfig, out: dict) -> None:
    """The config.json keys of the model's body (Qwen3's for "sdar", else its base's) plus
    `block_size` into `out` (`mask_token_id` goes with the other special ids)."""
    out.pop("bd_size", None)  # a shifted block-diffusion source turned into SDAR
    write_hf_decoder(c, out, _ARCHITECTURES[c.model_type.lower()], **{BLOCK_SIZE_KEY: c.block_size})


def tensor_table(c: ModelConfig) -> list[TensorMapping]:
    """Every tensor of an SDAR checkpoint (its body's Hugging Face names), in file order."""
    return decoder_table(c, HF_DECODER_NAMES)


FAMILY = Family(name="sdar", model_types=MODEL_TYPES, checkpoint_format="hf", presets=PRESETS,
                config_from_hf=config_from_hf, config_to_hf=config_to_hf, tensor_table=tensor_table,
                checkpoints=CHECKPOINTS, reads=reads, holds=holds, preset=lambda c: "sdar")
