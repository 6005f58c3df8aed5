"""config.json <-> `ModelConfig` for LLaDA (OLMo-style keys), Qwen2, Dream, Llama and LLaDA2 (MoE)
checkpoints.

Both transformers 4.x keys (`rope_theta`, `rope_scaling`, `torch_dtype`) and 5.x keys
(`rope_parameters`, `dtype`) are read; on export the keys of the source config are kept.
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxdllm.errors import CheckpointError, ConfigError
from jaxdllm.models.config import LLADA_SPECIAL_IDS, LLADA_VOCAB_SIZE, ModelConfig, RopeScaling

SUPPORTED_MODEL_TYPES = ("llada", "qwen2", "dream", "llama", "llada2_moe")
# LLaDA2's published generation code decodes in blocks of 32; its config.json does not say.
LLADA2_BLOCK_SIZE = 32
_LLADA2_VOCAB = 157184
ATTENTION_KEY = "jaxdllm_attention"  # config.json key for an LLaDA2-layout model that is not block-causal
_LLADA2_IDS = dict(mask_token_id=156895, eos_token_id=156892, pad_token_id=156892)
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16",
                 "torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def require_checkpoint_folder(directory: str | Path, what: str = "checkpoint directory") -> Path:
    """`directory` if it is an existing folder; else a `CheckpointError` naming `what` (e.g.
    "[model] init_from") and the shipped checkpoints that would load by name."""
    directory = Path(directory)
    if directory.is_file():
        raise CheckpointError(f"{what} {directory} is a file; a checkpoint is a folder holding config.json and "
                              "*.safetensors")
    if not directory.is_dir():
        from jaxdllm.shipped import shipped_hint

        raise CheckpointError(f"{what} {directory} does not exist ({shipped_hint()})")
    return directory


def read_config_json(directory: Path) -> dict:
    """The parsed `directory/config.json`; errors name the file."""
    file = require_checkpoint_folder(directory) / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{file} is missing: a Hugging Face checkpoint directory needs config.json")
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {file}: {e}") from e


def _first_id(value) -> int | None:
    if isinstance(value, list):
        return value[0] if value else None
    return value


def checkpoint_dtype(raw: dict) -> str:
    """The dtype a parsed config.json says its weights are stored in (`dtype` / `torch_dtype`;
    float32 when absent): the default `param_dtype` of a model loaded from it."""
    name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    return _TORCH_DTYPES.get(str(name), "float32")


def _rope(raw: dict) -> tuple[float, RopeScaling | None]:
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


def _require(raw: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in raw]
    if missing:
        raise CheckpointError(f"{where}: config.json lacks required keys {missing}")


def _llada_config(raw: dict, where: str) -> ModelConfig:
    _require(raw, ("d_model", "n_heads", "n_layers", "mlp_hidden_size", "vocab_size"), where)
    unsupported = {"block_type": "llama", "layer_norm_type": "rms", "alibi": False, "rope": True,
                   "scale_logits": False, "attention_layer_norm": False}
    for key, ok in unsupported.items():
        if key in raw and raw[key] != ok:
            raise CheckpointError(f"{where}: LLaDA config {key}={raw[key]!r} is not supported (need {ok!r})")
    vocab = int(raw.get("embedding_size") or raw["vocab_size"])
    ids = dict(LLADA_SPECIAL_IDS) if vocab == LLADA_VOCAB_SIZE else {}
    for key in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id", "eot_token_id"):
        if raw.get(key) is not None:
            ids[key] = _first_id(raw[key])
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


def _hf_config(raw: dict, model_type: str, where: str) -> ModelConfig:
    _require(raw, ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                   "vocab_size"), where)
    if raw.get("use_sliding_window"):
        raise CheckpointError(f"{where}: sliding-window attention (use_sliding_window) is not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{where}: hidden_act={raw['hidden_act']!r} is not supported (need silu)")
    theta, scaling = _rope(raw)
    heads = raw["num_attention_heads"]
    is_llama = model_type == "llama"
    attention_bias = bool(raw.get("attention_bias", False))
    block = raw.get("bd_size")  # Fast-dLLM v2 style block-diffusion Qwen2
    if block:
        attention = "block_causal"
    else:
        attention = "bidirectional" if model_type == "dream" else "causal"
    return ModelConfig(
        vocab_size=raw["vocab_size"], embed_dim=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"], num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        mlp_dim=raw["intermediate_size"], attention=attention, block_size=block or None,
        qkv_bias=attention_bias if is_llama else True, out_bias=attention_bias if is_llama else False,
        mlp_bias=bool(raw.get("mlp_bias", False)) if is_llama else False,
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        shift_logits=model_type == "dream" or bool(block),
        rope_theta=theta, rope_scaling=scaling, norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position=int(raw.get("max_position_embeddings", 4096)),
        mask_token_id=raw.get("mask_token_id"), eos_token_id=_first_id(raw.get("eos_token_id")),
        pad_token_id=_first_id(raw.get("pad_token_id")), bos_token_id=_first_id(raw.get("bos_token_id")),
        checkpoint_format="hf", model_type=raw.get("model_type", model_type), source_config=raw)


def _llada2_config(raw: dict, where: str) -> ModelConfig:
    """LLaDA2.0 / 2.1 (`configuration_llada2_moe.py`); defaults are that file's for absent keys."""
    _require(raw, ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"), where)
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{where}: hidden_act={raw['hidden_act']!r} is not supported (need silu)")
    if raw.get("norm_head"):
        raise CheckpointError(f"{where}: norm_head=true (a normalised LM head) is not supported")
    if raw.get("score_function", "sigmoid") != "sigmoid":
        raise CheckpointError(f"{where}: router score_function={raw['score_function']!r} is not supported "
                              "(LLaDA2 routes with sigmoid scores)")
    if raw.get("num_nextn_predict_layers"):
        raise CheckpointError(f"{where}: multi-token-prediction layers (num_nextn_predict_layers="
                              f"{raw['num_nextn_predict_layers']}) are not supported")
    theta, scaling = _rope(raw)
    heads = raw["num_attention_heads"]
    ids = dict(_LLADA2_IDS) if raw["vocab_size"] == _LLADA2_VOCAB else {}
    for key in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"):
        if raw.get(key) is not None:
            ids[key] = _first_id(raw[key])
    experts = raw.get("num_experts") or 0
    moe = {}
    if experts:
        _require(raw, ("moe_intermediate_size", "num_experts_per_tok"), where)
        moe = dict(num_experts=experts, experts_per_token=raw["num_experts_per_tok"],
                   expert_dim=raw["moe_intermediate_size"], num_shared_experts=raw.get("num_shared_experts") or 0,
                   expert_groups=raw.get("n_group") or 1, top_groups=raw.get("topk_group") or 1,
                   first_dense_layers=raw.get("first_k_dense_replace", 0),
                   routed_scaling=float(raw.get("routed_scaling_factor", 1.0)))
    return ModelConfig(
        vocab_size=raw["vocab_size"], embed_dim=raw["hidden_size"], num_layers=raw["num_hidden_layers"],
        num_heads=heads, num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        mlp_dim=raw.get("intermediate_size") or raw.get("moe_intermediate_size") or raw["hidden_size"] * 4,
        attention=raw.get(ATTENTION_KEY, "block_causal"), block_size=int(raw.get("block_size") or LLADA2_BLOCK_SIZE),
        qkv_bias=bool(raw.get("use_qkv_bias", False)), out_bias=bool(raw.get("use_bias", True)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)), rope_theta=theta, rope_scaling=scaling,
        norm_eps=float(raw.get("rms_norm_eps", 1e-5)), max_position=int(raw.get("max_position_embeddings", 16384)),
        qk_norm=bool(raw.get("use_qk_norm", True)),
        rotary_fraction=float(raw.get("partial_rotary_factor", 0.5)), checkpoint_format="llada2",
        model_type="llada2_moe", source_config=raw, **moe, **ids)


def _llada2_to_hf(c: ModelConfig, out: dict) -> None:
    out.update(model_type="llada2_moe", hidden_size=c.embed_dim, num_attention_heads=c.num_heads,
               num_key_value_heads=c.num_kv_heads, num_hidden_layers=c.num_layers, intermediate_size=c.mlp_dim,
               vocab_size=c.vocab_size, head_dim=c.head_dim, hidden_act="silu", rms_norm_eps=c.norm_eps,
               tie_word_embeddings=c.tie_embeddings, max_position_embeddings=c.max_position,
               use_qkv_bias=c.qkv_bias, use_bias=c.out_bias, use_qk_norm=c.qk_norm,
               partial_rotary_factor=c.rotary_fraction)
    if c.num_experts:
        out.update(num_experts=c.num_experts, num_experts_per_tok=c.experts_per_token,
                   moe_intermediate_size=c.expert_dim, num_shared_experts=c.num_shared_experts,
                   n_group=c.expert_groups, topk_group=c.top_groups, first_k_dense_replace=c.first_dense_layers,
                   routed_scaling_factor=c.routed_scaling)
    if c.block_size != LLADA2_BLOCK_SIZE or "block_size" in out:
        out["block_size"] = c.block_size
    if c.attention != "block_causal":  # a model trained otherwise (LLaDA2 checkpoints are block-causal)
        out[ATTENTION_KEY] = c.attention
    else:
        out.pop(ATTENTION_KEY, None)
    out.setdefault("architectures", ["LLaDA2MoeModelLM"])


def config_from_hf(raw: dict, where: str = "config.json") -> ModelConfig:
    """A `ModelConfig` from a parsed config.json; `where` names the file in errors."""
    model_type = str(raw.get("model_type", "")).lower()
    if model_type == "llada" or (not model_type and "d_model" in raw):
        return _llada_config(raw, where)
    if model_type in ("qwen2", "dream", "llama"):
        return _hf_config(raw, model_type, where)
    if model_type == "llada2_moe":
        return _llada2_config(raw, where)
    raise CheckpointError(
        f"{where}: unknown architecture model_type={raw.get('model_type')!r}; "
        f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}")


def _write_rope(c: ModelConfig, out: dict) -> None:
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


def config_to_hf(config: ModelConfig, dtype: str | None = None) -> dict:
    """config.json contents for `config`, keeping the keys of its source config; `dtype`: the
    weights' storage dtype written as `torch_dtype` (or `dtype`, where the source used that key);
    default: the source's, else float32."""
    c = config
    out = dict(c.source_config or {})
    dtype_key = "dtype" if "dtype" in out else "torch_dtype"
    if c.checkpoint_format == "llada":
        out.update(model_type="llada", d_model=c.embed_dim, n_heads=c.num_heads,
                   n_kv_heads=c.num_kv_heads, n_layers=c.num_layers, mlp_hidden_size=c.mlp_dim,
                   vocab_size=out.get("vocab_size", c.vocab_size), embedding_size=c.vocab_size,
                   rope_theta=c.rope_theta, rms_norm_eps=c.norm_eps, weight_tying=c.tie_embeddings,
                   include_bias=c.out_bias, block_type="llama", max_sequence_length=c.max_position)
        if c.qkv_bias and not c.out_bias:
            out["include_qkv_bias"] = True
        out.setdefault("architectures", ["LLaDAModelLM"])
    elif c.checkpoint_format == "llada2":
        _llada2_to_hf(c, out)
        _write_rope(c, out)
    else:
        out.update(model_type=c.model_type, hidden_size=c.embed_dim, num_attention_heads=c.num_heads,
                   num_key_value_heads=c.num_kv_heads, num_hidden_layers=c.num_layers,
                   intermediate_size=c.mlp_dim, vocab_size=c.vocab_size, head_dim=c.head_dim,
                   hidden_act="silu", rms_norm_eps=c.norm_eps, tie_word_embeddings=c.tie_embeddings,
                   max_position_embeddings=c.max_position)
        if c.model_type == "llama":
            out.update(attention_bias=c.qkv_bias, mlp_bias=c.mlp_bias)
        if c.attention == "block_causal":
            out["bd_size"] = c.block_size
        _write_rope(c, out)
        out.setdefault("architectures", [{"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
                                         .get(c.model_type, "DreamModel")])
    for key in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"):
        value = getattr(c, key)
        if value is not None and _first_id(out.get(key)) != value:
            out[key] = value
    out[dtype_key] = dtype or checkpoint_dtype(out)
    return out
