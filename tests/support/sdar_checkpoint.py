"""Tiny random SDAR and WeDLM checkpoints. SDAR: a transformers `Qwen3ForCausalLM` saved with `save_pretrained`, its
config.json edited to SDAR's (`model_type` "sdar", `SDARForCausalLM`, `block_size`, `mask_token_id`,
`fuse_cross_entropy`, a top-level `rope_theta` as its transformers 4.x config class reads it), as
SDAR's released checkpoints are Qwen3 weights under SDAR's config.

The weights are random (fp32), with three changes that make decoding tests meaningful:
- the LM head is scaled by `head_scale` (confident predictions: thresholds and entropy bounds commit
  several tokens in some steps), its EOS row once more by `eos_scale` (EOS predicted now and then);
- MASK is never predicted (its probability is 0 in fp32, as a trained model's): coordinate 0 of the
  residual stream is a constant (every embedding's coordinate 0 is 0.1; no layer reads or writes it),
  and MASK's head row reads only that coordinate, times -200. The published loop keeps MASK in its
  softmax while jaxdllm removes it; on this model both give the same confidences and entropies.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.optional import torch, transformers

SHAPE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
             num_hidden_layers=2, vocab_size=97, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=1e6)
BLOCK, MASK, EOS = 4, 96, 95
PROMPT_VOCAB = 90  # prompts use ids below this (never EOS or MASK)


def random_qwen3(*, seed: int = 0, head_scale: float = 1.0, eos_scale: float = 1.0, weight_std: float = 0.08):
    """The random transformers `Qwen3ForCausalLM` of the module notes (eager attention, eval mode)."""
    config = transformers.Qwen3Config(**SHAPE, tie_word_embeddings=False, eos_token_id=EOS, bos_token_id=EOS,
                                      pad_token_id=EOS)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2 if p.ndim == 1 else weight_std)
        head = model.lm_head.weight
        head.mul_(head_scale)
        head[EOS] *= eos_scale
        model.model.embed_tokens.weight[:, 0] = 0.1
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                         layer.mlp.gate_proj, layer.mlp.up_proj):
                proj.weight[:, 0] = 0.0
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        model.model.norm.weight[0] = 1.0
        head[:, 0] = 0.0
        head[MASK] = 0.0
        head[MASK, 0] = -200.0
    return model


def make_sdar_checkpoint(path: Path, **weights):
    """Write the checkpoint under `path`; return the transformers model (eager attention, eval mode).
    `weights`: `random_qwen3`'s settings."""
    model = random_qwen3(**weights)
    model.save_pretrained(path)
    raw = json.loads((path / "config.json").read_text())
    raw.update(model_type="sdar", architectures=["SDARForCausalLM"], block_size=BLOCK, mask_token_id=MASK,
               fuse_cross_entropy=True, rope_theta=SHAPE["rope_theta"],  # the released key (transformers 4.x)
               auto_map={"AutoConfig": "configuration_sdar.SDARConfig",
                         "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"})
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    return model


def make_wedlm_checkpoint(path: Path, **weights):
    """The same random Qwen3 weights under WeDLM's released config.json (`model_type` "wedlm",
    `WeDLMForCausalLM`, `qk_norm` true, `attention_bias` false, `mask_token_id` null), with a
    `tokenizer_config.json` naming the mask token `<|mask|>` (id MASK), as WeDLM-8B's tokenizer is read
    for its mask. Returns the transformers model."""
    model = random_qwen3(**weights)
    model.save_pretrained(path)
    raw = json.loads((path / "config.json").read_text())
    raw.update(model_type="wedlm", architectures=["WeDLMForCausalLM"], qk_norm=True, attention_bias=False,
               mask_token_id=None, layer_types=["full_attention"] * SHAPE["num_hidden_layers"],
               auto_map={"AutoConfig": "configuration_wedlm.WeDLMConfig",
                         "AutoModelForCausalLM": "modeling_wedlm.WeDLMForCausalLM"})
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"mask_token": "<|mask|>", "added_tokens_decoder": {str(MASK): {"content": "<|mask|>", "special": True}}}))
    return model
