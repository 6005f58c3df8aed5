"""config.json pieces the families share: ids, dtypes, RoPE keys, required keys, and the keys of a
Hugging Face LLaMA-style decoder (Qwen2, Llama, Qwen3, Dream, SDAR and block-diffusion Qwen2 checkpoints).

Both transformers 4.x keys (`rope_theta`, `rope_scaling`, `torch_dtype`) and 5.x keys
(`rope_parameters`, `dtype`) are read; on export the keys of the source config are kept.
"""

from __future__ import annotations

from jaxdllm.errors import CheckpointError, ConfigError
from jaxdllm.models.config import AttentionMode, ModelConfig, RopeScaling
from jaxdllm.models.families.family import model_type_of

SPECIAL_ID_KEYS = ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id")
# Decoder model_types whose `attention_bias` puts biases on q, k, v and o (the others, Qwen2 and Dream:
# q/k/v biases always, none on o), and those with q/k RMSNorm over head_dim (`q_norm` / `k_norm`).
ATTENTION_BIAS_TYPES = ("llama", "qwen3", "sdar")
QK_NORM_TYPES = ("qwen3", "sdar")
# model_types whose config.json states both flags itself (WeDLM: `qk_norm`, and `attention_bias` = q/k/v
# biases only, on a Qwen2.5 or a Qwen3 body).
FLAGGED_TYPES = ("wedlm",)
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16",
                 "torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def first_id(value) -> int | None:
    """A token id from config.json, where a list (several EOS ids) gives its first."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def checkpoint_dtype(raw: dict) -> str:
    """The stored parameter dtype (`dtype` or `torch_dtype`; float32 when absent or unknown): the
    default `param_dtype` of a model loaded from it (`RunOptions`)."""
    name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    return _TORCH_DTYPES.get(str(name), "float32")


def require(raw: dict, keys: tuple[str, ...], where: str) -> None:
    """A `CheckpointError` naming the keys of `keys` that `raw` lacks."""
    missing = [k for k in keys if k not in raw]
    if missing:
        raise CheckpointError(f"{where}: config.json lacks required keys {missing}")


def require_silu(raw: dict, where: str) -> None:
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{where}: hidden_act={raw['hidden_act']!r} is not supported (need silu)")


def read_rope(raw: dict) -> tuple[float, RopeScaling | None]:
    """`(rope_theta, rope_scaling)` from 4.x or 5.x keys; an unsupported scaling type is an error."""
    params = raw.get("rope_parameters") or {}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    scaling = raw.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    if not scaling:
        return theta, None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return theta, None
    if kind not in ("llama3", "linear"):
        raise ConfigError(f"rope scaling type {kind!r} is not supported (supported: llama3, linear)")
    return theta, RopeScaling(
        type=kind, factor=float(scaling["factor"]),
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position=int(scaling.get("original_max_position_embeddings", 8192)))


def write_rope(c: ModelConfig, out: dict) -> None:
    """RoPE keys in the source's style: transformers 5.x `rope_parameters` or 4.x `rope_theta` /
    `rope_scaling`."""
    scaling = None
    if c.rope_scaling is not None:
        s = c.rope_scaling
        scaling = {"rope_type": s.type, "factor": s.factor}
        if s.type == "llama3":
            scaling.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor,
                           original_max_position_embeddings=s.original_max_position)
    if "rope_parameters" in out:
        out["rope_parameters"] = {"rope_theta": c.rope_theta, **(scaling or {"rope_type": "default"})}
    else:
        out["rope_theta"] = c.rope_theta
        if scaling is not None:
            out["rope_scaling"] = scaling


def read_hf_decoder(raw: dict, where: str, *, attention: AttentionMode, shift_logits: bool,
                    block_size: int | None = None) -> ModelConfig:
    """A `ModelConfig` from the config.json of a Hugging Face LLaMA-style decoder (`model_type`
    qwen2, dream, llama, qwen3 or sdar); the family decides the attention and whether logits are shifted.
    Qwen2 and Dream have q/k/v biases and no others; Llama's are its `attention_bias` (q/k/v and o) /
    `mlp_bias`; Qwen3's (and SDAR's) its `attention_bias` (q/k/v and o), with q/k RMSNorm; WeDLM's its
    `attention_bias` (q/k/v) and `qk_norm`."""
    require(raw, ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size"),
            where)
    if raw.get("use_sliding_window"):
        raise CheckpointError(f"{where}: sliding-window attention (use_sliding_window) is not supported")
    require_silu(raw, where)
    theta, scaling = read_rope(raw)
    heads = raw["num_attention_heads"]
    kind = model_type_of(raw)
    own_bias = kind in ATTENTION_BIAS_TYPES
    attention_bias = bool(raw.get("attention_bias", False))
    flagged = kind in FLAGGED_TYPES
    return ModelConfig(
        vocab_size=raw["vocab_size"], embed_dim=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"], num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        mlp_dim=raw["intermediate_size"], attention=attention, block_size=block_size,
        qkv_bias=attention_bias if own_bias or flagged else True, out_bias=attention_bias if own_bias else False,
        mlp_bias=bool(raw.get("mlp_bias", False)) if kind == "llama" else False,
        qk_norm=bool(raw.get("qk_norm", not attention_bias)) if flagged else kind in QK_NORM_TYPES,
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)), shift_logits=shift_logits,
        rope_theta=theta, rope_scaling=scaling, norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position=int(raw.get("max_position_embeddings", 4096)),
        mask_token_id=raw.get("mask_token_id"), eos_token_id=first_id(raw.get("eos_token_id")),
        pad_token_id=first_id(raw.get("pad_token_id")), bos_token_id=first_id(raw.get("bos_token_id")),
        checkpoint_format="hf", model_type=raw.get("model_type", model_type_of(raw)), source_config=raw)


def write_hf_decoder(c: ModelConfig, out: dict, architecture: str, **extra) -> None:
    """The config.json keys of a Hugging Face LLaMA-style decoder into `out`; `extra` keys (a
    family's own) follow the shape keys; `architecture` is written when the source had none or was
    another model type (a model adapted to another family, e.g. a Qwen2 model trained into Dream).
    A config whose biases or q/k norm its model_type cannot write down is a `ConfigError`."""
    kind = c.model_type.lower()
    if kind in FLAGGED_TYPES:
        if c.out_bias:
            raise ConfigError(f"model_type {c.model_type!r}: attention_bias puts biases on q, k and v only; "
                              "got out_bias=True")
    elif c.qk_norm != (kind in QK_NORM_TYPES):
        raise ConfigError(f"model_type {c.model_type!r} {'has no' if c.qk_norm else 'needs'} q/k RMSNorm "
                          f"(qk_norm={c.qk_norm}); q/k norm is written by model_type {' or '.join(QK_NORM_TYPES)}")
    if kind in QK_NORM_TYPES and c.qkv_bias != c.out_bias:
        raise ConfigError(f"model_type {c.model_type!r}: attention_bias puts biases on q, k, v and o together; "
                          f"got qkv_bias={c.qkv_bias}, out_bias={c.out_bias}")
    if out.get("model_type") not in (None, c.model_type):
        out.pop("architectures", None)
        out.pop("auto_map", None)
    out.update(model_type=c.model_type, hidden_size=c.embed_dim, num_attention_heads=c.num_heads,
               num_key_value_heads=c.num_kv_heads, num_hidden_layers=c.num_layers,
               intermediate_size=c.mlp_dim, vocab_size=c.vocab_size, head_dim=c.head_dim,
               hidden_act="silu", rms_norm_eps=c.norm_eps, tie_word_embeddings=c.tie_embeddings,
               max_position_embeddings=c.max_position)
    if c.model_type == "llama":
        out.update(attention_bias=c.qkv_bias, mlp_bias=c.mlp_bias)
    elif kind in ATTENTION_BIAS_TYPES:
        out.update(attention_bias=c.qkv_bias)
    elif kind in FLAGGED_TYPES:
        out.update(attention_bias=c.qkv_bias, qk_norm=c.qk_norm)
    out.update(extra)
    write_rope(c, out)
    out.setdefault("architectures", [architecture])
