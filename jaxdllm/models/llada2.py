"""LLaDA2.0 / LLaDA2.1 (inclusionAI): mixture-of-experts block-diffusion models, as jaxdllm configs.

The family runs on the one `Transformer` (`jaxdllm.models.transformer`) with the MoE layers of
`jaxdllm.models.moe`; this file records the facts the configs and the checkpoint table follow
(from the published `configuration_llada2_moe.py` / `modeling_llada2_moe.py`).

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
layers), `moe_intermediate_size` expert_dim, `num_experts`, `num_experts_per_tok`
experts_per_token, `num_shared_experts`, `n_group` expert_groups, `topk_group` top_groups,
`first_k_dense_replace` first_dense_layers, `routed_scaling_factor` routed_scaling,
`use_qkv_bias` qkv_bias, `use_bias` out_bias (the attention output), `use_qk_norm` qk_norm,
`partial_rotary_factor` rotary_fraction, `rope_theta` / `rope_scaling`, `rms_norm_eps`,
`tie_word_embeddings`, `max_position_embeddings`. Refused with a named error: `norm_head`,
`score_function` other than sigmoid, `num_nextn_predict_layers` > 0. The block size is not in
config.json: 32, the published generation code's (`block_size` in config.json overrides it).

Tensors (`jaxdllm.checkpoint.hf_names`): `model.word_embeddings.weight`; per layer
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
token per step, and every masked token above 0.95), greedy, stop at EOS. `preset("llada2.1")`: the
same commits plus token editing (policy `token_editing`: a committed token of the block whose top-1
now differs, above 0.9, is replaced; a block stays open while edits continue, up to 16 mask-free
steps). Differences from the published `generate`: generation starts on a block boundary (the
prompt is left-padded to whole blocks, the batch decodes one block schedule) where the published
loop starts in the block holding the prompt's end; a row stops as soon as its EOS and everything
before it are decided, where the published loop finishes the EOS's block; MASK is never predicted.
"""

# Hugging Face checkpoint names -> model presets of the same shape.
CHECKPOINTS = {
    "inclusionAI/LLaDA2.0-mini": "llada2-mini",
    "inclusionAI/LLaDA2.1-mini": "llada2-mini",
    "inclusionAI/LLaDA2.0-flash": "llada2-flash",
    "inclusionAI/LLaDA2.1-flash": "llada2-flash",
}
