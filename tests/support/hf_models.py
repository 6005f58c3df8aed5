"""Tiny random transformers models saved in HF layout: the independent numerics reference."""

from __future__ import annotations

from support.optional import torch, transformers

SHAPES = {
    # name: (hidden, heads, kv_heads, head_dim or None, intermediate, layers, vocab)
    "mha": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, intermediate_size=64,
                num_hidden_layers=2, vocab_size=97),
    "gqa": dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=2, intermediate_size=80,
                num_hidden_layers=3, vocab_size=128),
    "odd_heads": dict(hidden_size=30, num_attention_heads=3, num_key_value_heads=1, intermediate_size=50,
                      num_hidden_layers=2, vocab_size=61),
    "wide_head": dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=24,
                      intermediate_size=40, num_hidden_layers=2, vocab_size=64),
}


def make_hf_model(kind: str, shape: str, *, tie: bool = False, seed: int = 0, **extra) -> transformers.PreTrainedModel:
    """A random `LlamaForCausalLM` / `Qwen2ForCausalLM` in fp32, eager attention, eval mode; the
    same weights for the same arguments (`seed`), whatever ran before."""
    kw = dict(SHAPES[shape], tie_word_embeddings=tie, max_position_embeddings=256,
              rms_norm_eps=1e-5, **extra)
    if kind == "llama":
        config = transformers.LlamaConfig(rope_theta=500000.0, **kw)
        cls = transformers.LlamaForCausalLM
    elif kind == "qwen2":
        config = transformers.Qwen2Config(rope_theta=1e6, **kw)
        cls = transformers.Qwen2ForCausalLM
    else:
        raise ValueError(kind)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():  # default init leaves biases and norms trivial; randomise everything
        for p in model.parameters():
            p.normal_(0.0, 0.2 if p.ndim == 1 else 0.08)
    return model


def hf_logits(model, ids, attention_mask=None, position_ids=None):
    import numpy as np
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(np.asarray(ids)), attention_mask=attention_mask,
                    position_ids=position_ids)
    return out.logits.float().numpy()


def make_hf_xlnet(path, vocab_size: int, *, seed: int = 0):
    """A random `XLNetLMHeadModel` (2 layers of width 32, 4 heads, no dropout) saved under `path` with
    safetensors; weights drawn with a larger spread than the initialiser's (std 0.3) so every term
    (relative, segment, biases) matters. Returns the model in eval mode."""
    torch.manual_seed(seed)
    config = transformers.XLNetConfig(vocab_size=vocab_size, d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0)
    model = transformers.XLNetLMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    model.save_pretrained(path, safe_serialization=True)
    return model
