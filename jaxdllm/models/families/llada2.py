"""LLaDA2.0 / LLaDA2.1 (inclusionAI): mixture-of-experts block-diffusion models, as jaxdllm configs.

The family runs on the one `Transformer` (`jaxdllm.models.transformer`) with the MoE layers of
`jaxdllm.models.moe`; this module holds the facts, presets, config.json reading and writing and
the tensor table (from the published `configuration_llada2_moe.py` / `modeling_llada2_moe.py`).

Published sizes (presets `llada2-mini`, `llada2-flash`):

| checkpoints | total / active parameters | shape |
|---|---|---|
| LLaDA2.0-mini, LLaDA2.1-mini (Ling-mini-2.0 shape) | 16.3B / 1.43B | 20 layers, width 2048, 16 heads / 4 KV heads of 128, dense MLP 5120 in layer 0, 256 routed experts of width 512 + 1 shared, 8 per token, 8 groups / 4 kept |
| LLaDA2.0-flash, LLaDA2.1-flash (Ling-flash-2.0 shape) | 103B / 6.15B | 32 layers, width 4096, 32 heads / 4 KV heads of 128, dense MLP 9216 in layer 0, 256 experts of width 1024 + 1 shared, 8 per token, 8 groups / 4 kept |

Both: vocabulary 157,184, EOS (and pad) 156892, mask 156895, RMSNorm eps 1e-6, RoPE theta 600,000 on
half of each head (`partial_rotary_factor` 0.5), QK-norm, no biases, routed scaling 2.5. Logits are
not shifted: position i predicts token i. Importing a checkpoint reads the shape from its config.json.

config.json keys -> `ModelConfig` fields: `hidden_size` embed_dim, `num_attention_heads` /
`num_key_value_heads` (0 means all heads) / `head_dim`, `intermediate_size` mlp_dim (the dense
layers); the expert settings (`ModelConfig.experts`, an `ExpertConfig`; `num_experts` 0 or absent:
dense): `moe_intermediate_size` expert_dim, `num_experts`, `num_experts_per_tok` experts_per_token,
`num_shared_experts`, `n_group` expert_groups, `topk_group` top_groups, `first_k_dense_replace`
first_dense_layers, `routed_scaling_factor` routed_scaling; `use_qkv_bias` qkv_bias, `use_bias`
out_bias (the attention output), `use_qk_norm` qk_norm, `partial_rotary_factor` rotary_fraction,
`rope_theta` / `rope_scaling`, `rms_norm_eps`, `tie_word_embeddings`, `max_position_embeddings`.
Refused with a named error: `norm_head`, `score_function` other than sigmoid,
`num_nextn_predict_layers` > 0. The block size is not in config.json: 32, the published generation
code's (`block_size` in config.json overrides it).

Tensors (`tensor_table`): `model.word_embeddings.weight`; per layer
`attention.query_key_value.weight` `[(H + 2 KV) hd, D]` (split into q, k, v on import, fused again
on export), `attention.query_layernorm` / `key_layernorm`, `attention.dense`; dense layers
`mlp.{gate,up,down}_proj`; MoE layers `mlp.gate.weight` `[E, D]` (the router),
`mlp.gate.expert_bias` `[E]` (kept in float32), `mlp.experts.{e}.{gate,up,down}_proj` (stacked
into `[E, ...]` kernels on import, unstacked on export), `mlp.shared_experts.{gate,up,down}_proj`;
`model.norm.weight`; `lm_head.weight`.

Routing (`jaxdllm.models.moe.route`): float32 sigmoid scores; selection on scores + expert_bias,
limited to the `topk_group` groups whose two best biased scores sum highest; weights are the
chosen experts' unbiased scores normalised to 1, times 2.5. Ties go to the lower index.

Decoding: `SamplerConfig.preset("llada2")` (2.0): blocks of 32, 32 steps per block (at least one
token per step, and every masked token above 0.95), greedy. `preset("llada2.1")`: the same commits
plus token editing (policy `token_editing`: a committed answer token of the block whose top-1 now
differs, above 0.9, is replaced; a block stays open while edits continue, up to 16 mask-free
steps). Both decode in the published layout (`jaxdllm.decoding.layout`): blocks at absolute
positions, decoding from the block that holds the prompt's end (its prompt tokens never change),
up to the end of the block that holds the last generated position, and a row stops after the block
that holds its EOS (`stop_at_eos="block"`). `tests/decoding/test_published_block_layout.py` checks
tokens and forwards against the published loops, alone and in ragged batches.

Differences kept from the published `generate`, each for a reason:
- MASK is never a prediction (its logit is -inf): the published loop would commit MASK and then
  treat the position as undecided again.
- Probabilities are computed in float32 (the published code: the model's dtype for the softmax).
- LLaDA2.0's mask commits use the `threshold` policy's inclusive rule (p >= 0.95; the published
  loop: p > 0.95), shared with Fast-dLLM's presets; only a probability exactly at the threshold
  differs.
- Several prompts decode in one batch, each row as it would alone (the published loops take one
  prompt; LLaDA2.1's refuses batches).
- `stop_at_eos=True` is available: a row stops as soon as its EOS and everything before it are
  decided, which keeps LLaDA2.0's tokens and saves the rest of the EOS's block (not LLaDA2.1's:
  an edit may still change the block).
"""

from __future__ import annotations

from jaxdllm.errors import CheckpointError
from jaxdllm.models.config import ExpertConfig, ModelConfig
from jaxdllm.models.families.config_json import (SPECIAL_ID_KEYS, first_id, read_rope, require,
                                                 require_silu, write_rope)
from jaxdllm.models.families.family import Family
from jaxdllm.models.families.tensors import TensorMapping, swiglu

MODEL_TYPES = ("llada2_moe",)
VOCAB_SIZE = 157184
SPECIAL_IDS = dict(mask_token_id=156895, eos_token_id=156892, pad_token_id=156892)
# The published generation code decodes in blocks of 32; config.json does not say.
BLOCK_SIZE = 32
ATTENTION_KEY = "jaxdllm_attention"  # config.json key for an LLaDA2-layout model that is not block-causal

# What the published sizes share.
_SHARED = dict(vocab_size=VOCAB_SIZE, num_kv_heads=4, head_dim=128, attention="block_causal", block_size=BLOCK_SIZE,
               rope_theta=600000.0, norm_eps=1e-6, max_position=32768,
               checkpoint_format="llada2", model_type="llada2_moe", qk_norm=True, rotary_fraction=0.5, **SPECIAL_IDS)
# ... and their routing; only the experts' width differs.
_EXPERTS = dict(num_experts=256, experts_per_token=8, num_shared_experts=1, expert_groups=8, top_groups=4,
                first_dense_layers=1, routed_scaling=2.5)

PRESETS = {
    # LLaDA2.0-mini / LLaDA2.1-mini (the Ling-mini-2.0 shape): 16B parameters, ~1.4B active per token.
    "llada2-mini": ModelConfig(embed_dim=2048, num_layers=20, num_heads=16, mlp_dim=5120,
                               experts=ExpertConfig(expert_dim=512, **_EXPERTS), **_SHARED),
    # LLaDA2.0-flash / LLaDA2.1-flash (the Ling-flash-2.0 shape): 100B parameters, ~6.1B active. For
    # planning: importing a checkpoint reads the shape from its config.json.
    "llada2-flash": ModelConfig(embed_dim=4096, num_layers=32, num_heads=32, mlp_dim=9216,
                                experts=ExpertConfig(expert_dim=1024, **_EXPERTS), **_SHARED),
    # Tiny size for tests (random weights, fp32).
    "tiny-llada2": ModelConfig(
        vocab_size=256, embed_dim=64, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
        mlp_dim=128, attention="block_causal", block_size=8, rope_theta=600000.0, max_position=512,
        checkpoint_format="llada2", model_type="llada2_moe", qk_norm=True, rotary_fraction=0.5,
        experts=ExpertConfig(num_experts=16, experts_per_token=4, expert_dim=32, num_shared_experts=1,
                             expert_groups=4, top_groups=2, first_dense_layers=1, routed_scaling=2.5),
        mask_token_id=255, eos_token_id=254, pad_token_id=254),
}
# Hugging Face checkpoint names -> the presets of their shape.
CHECKPOINTS = {
    "inclusionAI/LLaDA2.0-mini": "llada2-mini",
    "inclusionAI/LLaDA2.1-mini": "llada2-mini",
    "inclusionAI/LLaDA2.0-flash": "llada2-flash",
    "inclusionAI/LLaDA2.1-flash": "llada2-flash",
}


def config_from_hf(raw: dict, where: str) -> ModelConfig:
    """LLaDA2.0 / 2.1 (`configuration_llada2_moe.py`); defaults are that file's for absent keys."""
    require(raw, ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"), where)
    require_silu(raw, where)
    if raw.get("norm_head"):
        raise CheckpointError(f"{where}: norm_head=true (a normalised LM head) is not supported")
    if raw.get("score_function", "sigmoid") != "sigmoid":
        raise CheckpointError(f"{where}: router score_function={raw['score_function']!r} is not supported "
                              "(LLaDA2 routes with sigmoid scores)")
    if raw.get("num_nextn_predict_layers"):
        raise CheckpointError(f"{where}: multi-token-prediction layers (num_nextn_predict_layers="
                              f"{raw['num_nextn_predict_layers']}) are not supported")
    theta, scaling = read_rope(raw)
    heads = raw["num_attention_heads"]
    ids = dict(SPECIAL_IDS) if raw["vocab_size"] == VOCAB_SIZE else {}
    for key in SPECIAL_ID_KEYS:
        if raw.get(key) is not None:
            ids[key] = first_id(raw[key])
    experts = None
    if raw.get("num_experts"):
        require(raw, ("moe_intermediate_size", "num_experts_per_tok"), where)
        experts = ExpertConfig(
            num_experts=raw["num_experts"], experts_per_token=raw["num_experts_per_tok"],
            expert_dim=raw["moe_intermediate_size"], num_shared_experts=raw.get("num_shared_experts") or 0,
            expert_groups=raw.get("n_group") or 1, top_groups=raw.get("topk_group") or 1,
            first_dense_layers=raw.get("first_k_dense_replace", 0),
            routed_scaling=float(raw.get("routed_scaling_factor", 1.0)))
    return ModelConfig(
        vocab_size=raw["vocab_size"], embed_dim=raw["hidden_size"], num_layers=raw["num_hidden_layers"],
        num_heads=heads, num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        mlp_dim=raw.get("intermediate_size") or raw.get("moe_intermediate_size") or raw["hidden_size"] * 4,
        attention=raw.get(ATTENTION_KEY, "block_causal"), block_size=int(raw.get("block_size") or BLOCK_SIZE),
        qkv_bias=bool(raw.get("use_qkv_bias", False)), out_bias=bool(raw.get("use_bias", True)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)), rope_theta=theta, rope_scaling=scaling,
        norm_eps=float(raw.get("rms_norm_eps", 1e-5)), max_position=int(raw.get("max_position_embeddings", 16384)),
        qk_norm=bool(raw.get("use_qk_norm", True)),
        rotary_fraction=float(raw.get("partial_rotary_factor", 0.5)), checkpoint_format="llada2",
        model_type="llada2_moe", experts=experts, source_config=raw, **ids)


def config_to_hf(c: ModelConfig, out: dict) -> None:
    """LLaDA2's config.json keys into `out`: the block size only where it is not the published 32,
    the attention only where it is not block-causal."""
    out.update(model_type="llada2_moe", hidden_size=c.embed_dim, num_attention_heads=c.num_heads,
               num_key_value_heads=c.num_kv_heads, num_hidden_layers=c.num_layers, intermediate_size=c.mlp_dim,
               vocab_size=c.vocab_size, head_dim=c.head_dim, hidden_act="silu", rms_norm_eps=c.norm_eps,
               tie_word_embeddings=c.tie_embeddings, max_position_embeddings=c.max_position,
               use_qkv_bias=c.qkv_bias, use_bias=c.out_bias, use_qk_norm=c.qk_norm,
               partial_rotary_factor=c.rotary_fraction)
    e = c.experts
    if e is not None:
        out.update(num_experts=e.num_experts, num_experts_per_tok=e.experts_per_token,
                   moe_intermediate_size=e.expert_dim, num_shared_experts=e.num_shared_experts,
                   n_group=e.expert_groups, topk_group=e.top_groups, first_k_dense_replace=e.first_dense_layers,
                   routed_scaling_factor=e.routed_scaling)
    if c.block_size != BLOCK_SIZE or "block_size" in out:
        out["block_size"] = c.block_size
    if c.attention != "block_causal":  # a model trained otherwise (LLaDA2 checkpoints are block-causal)
        out[ATTENTION_KEY] = c.attention
    else:
        out.pop(ATTENTION_KEY, None)
    out.setdefault("architectures", ["LLaDA2MoeModelLM"])
    write_rope(c, out)


def tensor_table(c: ModelConfig) -> list[TensorMapping]:
    """LLaDA2 (`modeling_llada2_moe.py`) names: fused qkv, QK-norm, per-expert SwiGLU tensors."""
    d, h, kv, hd, v = c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size
    table = [TensorMapping("model.word_embeddings.weight", ("embed",), (v, d), (v, d), False)]
    fused = (h + 2 * kv) * hd
    parts = (("q", 0, h), ("k", h, kv), ("v", h + kv, kv))  # (ours, first head, heads) in the fused rows
    for i in range(c.num_layers):
        lp, at = f"model.layers.{i}.", ("layers", i)
        table += [TensorMapping(lp + "input_layernorm.weight", at + ("attn_norm", "scale"), (d,), (d,), False),
                  TensorMapping(lp + "post_attention_layernorm.weight", at + ("mlp_norm", "scale"), (d,), (d,), False)]
        # A fused tensor's parts are consecutive in the table: an export writes them into one file.
        table += [TensorMapping(lp + "attention.query_key_value.weight", at + ("attn", ours, "kernel"),
                                (fused, d), (d, n, hd), True, rows=(first * hd, (first + n) * hd))
                  for ours, first, n in parts]
        if c.qkv_bias:
            table += [TensorMapping(lp + "attention.query_key_value.bias", at + ("attn", ours, "bias"),
                                    (fused,), (n, hd), False, rows=(first * hd, (first + n) * hd))
                      for ours, first, n in parts]
        if c.qk_norm:
            table += [TensorMapping(lp + f"attention.{hf}_layernorm.weight", at + ("attn", ours, "scale"),
                                    (hd,), (hd,), False) for hf, ours in (("query", "q_norm"), ("key", "k_norm"))]
        table.append(TensorMapping(lp + "attention.dense.weight", at + ("attn", "o", "kernel"), (d, h * hd),
                                   (h, hd, d), True))
        if c.out_bias:
            table.append(TensorMapping(lp + "attention.dense.bias", at + ("attn", "o", "bias"), (d,), (d,), False))
        if not c.is_moe_layer(i):
            table += swiglu(lp + "mlp.", at + ("mlp",), d, c.mlp_dim)
            continue
        e, m = c.experts.num_experts, c.experts.expert_dim
        table += [TensorMapping(lp + "mlp.gate.weight", at + ("mlp", "router"), (e, d), (d, e), True),
                  TensorMapping(lp + "mlp.gate.expert_bias", at + ("mlp", "expert_bias"), (e,), (e,), False)]
        for x in range(e):
            table += swiglu(lp + f"mlp.experts.{x}.", at + ("mlp",), d, m, expert=x)
        if c.experts.num_shared_experts:
            table += swiglu(lp + "mlp.shared_experts.", at + ("mlp", "shared"), d, m * c.experts.num_shared_experts)
    table.append(TensorMapping("model.norm.weight", ("final_norm", "scale"), (d,), (d,), False))
    if not c.tie_embeddings:
        table.append(TensorMapping("lm_head.weight", ("lm_head",), (v, d), (d, v), True))
    return table


FAMILY = Family(name="llada2", model_types=MODEL_TYPES, checkpoint_format="llada2", presets=PRESETS,
                config_from_hf=config_from_hf, config_to_hf=config_to_hf, tensor_table=tensor_table,
                checkpoints=CHECKPOINTS, holds=lambda c: c.checkpoint_format == "llada2")
