"""A test-local torch LLaDA: random weights in LLaDA's checkpoint layout and its forward pass,
written from the published LLaDA modeling code's description (independent of jaxdllm's code)."""

from __future__ import annotations

import json
from pathlib import Path

from support.optional import lazy, torch

safetensors_torch = lazy("safetensors.torch")

TINY = dict(d_model=48, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=96, vocab_size=130,
            embedding_size=130, rope_theta=500000.0, rms_norm_eps=1e-5, mask_token_id=126,
            eos_token_id=127, weight_tying=False, include_bias=False, block_type="llama",
            max_sequence_length=256)


def make_llada_checkpoint(path: Path, head_scale: float = 1.0, **overrides) -> dict[str, torch.Tensor]:
    """Write config.json (LLaDA keys) and model.safetensors (LLaDA names); return the tensors.

    `head_scale` multiplies the LM head: larger values give peaked (confident) predictions, so
    that parallel-decoding policies commit several tokens per step.
    """
    cfg = dict(TINY, **overrides)
    d, h, kvh, hidden, v = (cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"], cfg["mlp_hidden_size"],
                            cfg["embedding_size"])
    hd = d // h
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g) * 0.08
    p = "model.transformer."
    w = {p + "wte.weight": rnd(v, d), p + "ln_f.weight": 1 + rnd(d)}
    for i in range(cfg["n_layers"]):
        b = f"{p}blocks.{i}."
        w.update({b + "attn_norm.weight": 1 + rnd(d), b + "ff_norm.weight": 1 + rnd(d),
                  b + "q_proj.weight": rnd(h * hd, d), b + "k_proj.weight": rnd(kvh * hd, d),
                  b + "v_proj.weight": rnd(kvh * hd, d), b + "attn_out.weight": rnd(d, h * hd),
                  b + "ff_proj.weight": rnd(hidden, d), b + "up_proj.weight": rnd(hidden, d),
                  b + "ff_out.weight": rnd(d, hidden)})
    if not cfg["weight_tying"]:
        w[p + "ff_out.weight"] = rnd(v, d) * head_scale
    path.mkdir(parents=True, exist_ok=True)
    cfg.update(model_type="llada", architectures=["LLaDAModelLM"],
               auto_map={"AutoModel": "modeling_llada.LLaDAModelLM"})
    (path / "config.json").write_text(json.dumps(cfg))
    safetensors_torch.save_file(w, str(path / "model.safetensors"), metadata={"format": "pt"})
    return w


def llada_forward(w: dict[str, torch.Tensor], cfg: dict, ids: torch.Tensor) -> torch.Tensor:
    """Bidirectional LLaDA forward in fp32: logits `[B, L, V]`."""
    p = "model.transformer."
    d, h, kvh = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
    hd, eps = d // h, cfg["rms_norm_eps"]

    def norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def rope(x):  # x [B, H, L, hd], rotate-half convention, positions 0..L-1
        inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)
        ang = torch.arange(x.shape[2]).float()[:, None] * inv[None]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    bsz, length = ids.shape
    x = w[p + "wte.weight"][ids]
    for i in range(cfg["n_layers"]):
        b = f"{p}blocks.{i}."
        a = norm(x, w[b + "attn_norm.weight"])
        q = (a @ w[b + "q_proj.weight"].T).view(bsz, length, h, hd).transpose(1, 2)
        k = (a @ w[b + "k_proj.weight"].T).view(bsz, length, kvh, hd).transpose(1, 2)
        v = (a @ w[b + "v_proj.weight"].T).view(bsz, length, kvh, hd).transpose(1, 2)
        k, v = k.repeat_interleave(h // kvh, 1), v.repeat_interleave(h // kvh, 1)
        att = torch.softmax(rope(q) @ rope(k).transpose(-1, -2) / hd ** 0.5, -1)
        x = x + (att @ v).transpose(1, 2).reshape(bsz, length, d) @ w[b + "attn_out.weight"].T
        f = norm(x, w[b + "ff_norm.weight"])
        gate = torch.nn.functional.silu(f @ w[b + "ff_proj.weight"].T)
        x = x + (gate * (f @ w[b + "up_proj.weight"].T)) @ w[b + "ff_out.weight"].T
    head = w[p + "wte.weight"] if cfg["weight_tying"] else w[p + "ff_out.weight"]
    return norm(x, w[p + "ln_f.weight"]) @ head.T
