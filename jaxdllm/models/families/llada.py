"""LLaDA (GSAI-ML): a bidirectional LLaMA-style masked-diffusion model with OLMo-derived names.

LLaDA-8B-Base / -Instruct: 32 layers, width 4096, 32 heads (no GQA) of 128, SwiGLU 12288, vocabulary
126,464 (untied), RMSNorm eps 1e-5, RoPE theta 500,000, no biases. Special ids: mask 126336, EOS and
pad 126081, end of turn 126348, BOS 126080; its config.json omits them, so import fills them in for
a checkpoint with LLaDA-8B's vocabulary.

config.json keys (OLMo style) -> `ModelConfig` fields: `d_model` embed_dim, `n_heads` /
`n_kv_heads`, `n_layers`, `mlp_hidden_size` mlp_dim, `embedding_size` (else `vocab_size`)
vocab_size, `rope_theta`, `rms_norm_eps`, `max_sequence_length` max_position, `weight_tying`
tie_embeddings, `include_bias` (every linear) / `include_qkv_bias`. Refused with a named error:
`block_type` other than llama, `layer_norm_type` other than rms, `alibi`, `rope` off,
`scale_logits`, `attention_layer_norm`. A config.json without `model_type` but with `d_model` is
read as LLaDA.

Tensors (prefix `model.transformer.`, torch `[out, in]`): `wte.weight`; per block i
`blocks.{i}.attn_norm`, `ff_norm`, `q_proj`, `k_proj`, `v_proj`, `attn_out`, `ff_proj` (gate),
`up_proj`, `ff_out` (down); `ln_f.weight`; `ff_out.weight` (the LM head: `ff_out` names both the
per-block down projection and the head).
"""

from __future__ import annotations

from jaxdllm.errors import CheckpointError
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families.config_json import SPECIAL_ID_KEYS, first_id, require
from jaxdllm.models.families.family import Family, model_type_of
from jaxdllm.models.families.tensors import DecoderNames, TensorMapping, decoder_table

MODEL_TYPES = ("llada",)
# LLaDA-8B's tokenizer: its config.json omits these, so checkpoint import reads them from here.
VOCAB_SIZE = 126464
SPECIAL_IDS = dict(mask_token_id=126336, eos_token_id=126081, eot_token_id=126348,
                   pad_token_id=126081, bos_token_id=126080)

PRESETS = {
    # LLaDA-8B-Base / -Instruct (GSAI-ML/LLaDA-8B-*).
    "llada-8b": ModelConfig(
        vocab_size=VOCAB_SIZE, embed_dim=4096, num_layers=32, num_heads=32, num_kv_heads=32,
        head_dim=128, mlp_dim=12288, attention="bidirectional", rope_theta=500000.0,
        norm_eps=1e-5, max_position=4096,
        checkpoint_format="llada", model_type="llada", **SPECIAL_IDS),
    # Tiny size for tests (random weights, fp32).
    "tiny-llada": ModelConfig(
        vocab_size=256, embed_dim=64, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16,
        mlp_dim=128, attention="bidirectional", rope_theta=500000.0, norm_eps=1e-5,
        max_position=512, checkpoint_format="llada", model_type="llada",
        mask_token_id=255, eos_token_id=254, eot_token_id=253, pad_token_id=254, bos_token_id=252),
}
CHECKPOINTS = {"GSAI-ML/LLaDA-8B-Base": "llada-8b", "GSAI-ML/LLaDA-8B-Instruct": "llada-8b"}

NAMES = DecoderNames(
    embed="model.transformer.wte", layers="model.transformer.blocks.", final_norm="model.transformer.ln_f",
    lm_head="model.transformer.ff_out", attn_norm="attn_norm", mlp_norm="ff_norm", q="q_proj", k="k_proj",
    v="v_proj", o="attn_out", gate="ff_proj", up="up_proj", down="ff_out")
# OLMo options this model does not implement, with the value it needs.
_REQUIRED = {"block_type": "llama", "layer_norm_type": "rms", "alibi": False, "rope": True,
             "scale_logits": False, "attention_layer_norm": False}


def reads(raw: dict) -> bool:
    """LLaDA's model_type, or none at all with OLMo's `d_model` (older exports)."""
    model_type = model_type_of(raw)
    return model_type in MODEL_TYPES or (not model_type and "d_model" in raw)


def config_from_hf(raw: dict, where: str) -> ModelConfig:
    """A `ModelConfig` from a LLaDA config.json (OLMo keys)."""
    require(raw, ("d_model", "n_heads", "n_layers", "mlp_hidden_size", "vocab_size"), where)
    for key, ok in _REQUIRED.items():
        if key in raw and raw[key] != ok:
            raise CheckpointError(f"{where}: LLaDA config {key}={raw[key]!r} is not supported (need {ok!r})")
    vocab = int(raw.get("embedding_size") or raw["vocab_size"])
    ids = dict(SPECIAL_IDS) if vocab == VOCAB_SIZE else {}
    for key in (*SPECIAL_ID_KEYS, "eot_token_id"):
        if raw.get(key) is not None:
            ids[key] = first_id(raw[key])
    bias = bool(raw.get("include_bias", False))
    return ModelConfig(
        vocab_size=vocab, embed_dim=raw["d_model"], num_layers=raw["n_layers"],
        num_heads=raw["n_heads"], num_kv_heads=raw.get("n_kv_heads") or raw["n_heads"],
        head_dim=raw["d_model"] // raw["n_heads"], mlp_dim=raw["mlp_hidden_size"],
        attention="bidirectional", qkv_bias=bias or bool(raw.get("include_qkv_bias", False)),
        out_bias=bias, mlp_bias=bias, tie_embeddings=bool(raw.get("weight_tying", False)),
        rope_theta=float(raw.get("rope_theta", 10000.0)), norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        max_position=int(raw.get("max_sequence_length", 4096)),
        checkpoint_format="llada", model_type="llada", source_config=raw, **ids)


def config_to_hf(c: ModelConfig, out: dict) -> None:
    """LLaDA's config.json keys into `out`; `vocab_size` (the tokenizer's) is kept from the source."""
    out.update(model_type="llada", d_model=c.embed_dim, n_heads=c.num_heads,
               n_kv_heads=c.num_kv_heads, n_layers=c.num_layers, mlp_hidden_size=c.mlp_dim,
               vocab_size=out.get("vocab_size", c.vocab_size), embedding_size=c.vocab_size,
               rope_theta=c.rope_theta, rms_norm_eps=c.norm_eps, weight_tying=c.tie_embeddings,
               include_bias=c.out_bias, block_type="llama", max_sequence_length=c.max_position)
    if c.qkv_bias and not c.out_bias:
        out["include_qkv_bias"] = True
    out.setdefault("architectures", ["LLaDAModelLM"])


def tensor_table(c: ModelConfig) -> list[TensorMapping]:
    """Every tensor of a LLaDA checkpoint, in file order."""
    return decoder_table(c, NAMES)


FAMILY = Family(name="llada", model_types=MODEL_TYPES, checkpoint_format="llada", presets=PRESETS,
                config_from_hf=config_from_hf, config_to_hf=config_to_hf, tensor_table=tensor_table,
                checkpoints=CHECKPOINTS, reads=reads, holds=lambda c: c.checkpoint_format == "llada")
