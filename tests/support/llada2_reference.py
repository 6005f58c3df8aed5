"""A test-local torch LLaDA2 MoE ("llada2_moe"): random weights in its checkpoint layout and its forward
pass, written from the published LLaDA2 modeling code's description (independent of jaxdllm's code).

Precision as in the published code: matmuls in the model dtype; RMSNorm statistics, the router and the
attention softmax in fp32; RoPE cos/sin built in fp32, then cast to the model dtype; each routed expert's
output (model dtype) is upcast to fp32, weighted by the fp32 routing weights, summed over the token's k
experts in fp32 and cast back to the model dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.optional import lazy, torch

safetensors_torch = lazy("safetensors.torch")

TINY = dict(model_type="llada2_moe", architectures=["LLaDA2MoeModelLM"], vocab_size=160,
            hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=16,
            num_shared_experts=1, num_experts_per_tok=4, n_group=4, topk_group=2,
            first_k_dense_replace=1, routed_scaling_factor=2.5, partial_rotary_factor=0.5,
            use_qkv_bias=False, use_bias=False, use_qk_norm=True, rms_norm_eps=1e-6,
            rope_theta=600000.0, max_position_embeddings=512, tie_word_embeddings=False,
            hidden_act="silu", score_function="sigmoid", moe_router_enable_expert_bias=True,
            eos_token_id=156, pad_token_id=156, mask_token_id=159, torch_dtype="float32")


def make_llada2_checkpoint(path: Path, dtype=None, *, seed: int = 0, head_scale: float = 1.0,
                           eos_scale: float = 1.0, **overrides) -> dict[str, torch.Tensor]:
    """Write config.json (LLaDA2 keys, `overrides` applied) and model.safetensors; return the tensors.

    Weights are drawn in fp32 from a generator seeded with `seed` and then cast to `dtype` (default
    `torch.float32`). The router weights are large enough that routing varies between tokens, and
    `expert_bias` is nonzero so that selecting on biased scores differs from selecting on unbiased
    ones for some tokens.
    `head_scale` multiplies the LM head (confident predictions, so thresholds commit several tokens
    per step); `eos_scale` multiplies its EOS row once more (EOS predicted now and then).
    """
    dtype = torch.float32 if dtype is None else dtype
    cfg = dict(TINY, **overrides, torch_dtype=str(dtype).removeprefix("torch."))
    d, h, kv, v, n_exp = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                          cfg["vocab_size"], cfg["num_experts"])
    hd = cfg.get("head_dim") or d // h
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s, scale=0.08: torch.randn(*s, generator=g) * scale

    def swiglu(prefix, width):
        return {prefix + "gate_proj.weight": rnd(width, d), prefix + "up_proj.weight": rnd(width, d),
                prefix + "down_proj.weight": rnd(d, width)}

    w = {"model.word_embeddings.weight": rnd(v, d), "model.norm.weight": 1 + rnd(d)}
    for i in range(cfg["num_hidden_layers"]):
        b = f"model.layers.{i}."
        w.update({b + "input_layernorm.weight": 1 + rnd(d), b + "post_attention_layernorm.weight": 1 + rnd(d),
                  b + "attention.query_key_value.weight": rnd((h + 2 * kv) * hd, d),
                  b + "attention.dense.weight": rnd(d, h * hd)})
        if cfg["use_qkv_bias"]:
            w[b + "attention.query_key_value.bias"] = rnd((h + 2 * kv) * hd)
        if cfg["use_bias"]:
            w[b + "attention.dense.bias"] = rnd(d)
        if cfg["use_qk_norm"]:
            w[b + "attention.query_layernorm.weight"] = 1 + rnd(hd)
            w[b + "attention.key_layernorm.weight"] = 1 + rnd(hd)
        if i < cfg["first_k_dense_replace"]:
            w.update(swiglu(b + "mlp.", cfg["intermediate_size"]))
            continue
        w[b + "mlp.gate.weight"] = rnd(n_exp, d, scale=0.3)
        w[b + "mlp.gate.expert_bias"] = rnd(n_exp, scale=0.05)
        for e in range(n_exp):
            w.update(swiglu(f"{b}mlp.experts.{e}.", cfg["moe_intermediate_size"]))
        if cfg["num_shared_experts"]:  # one SwiGLU as wide as all shared experts together
            w.update(swiglu(b + "mlp.shared_experts.", cfg["moe_intermediate_size"] * cfg["num_shared_experts"]))
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = rnd(v, d) * head_scale
        w["lm_head.weight"][cfg["eos_token_id"]] *= eos_scale
    w = {k: t.to(dtype).contiguous() for k, t in w.items()}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    safetensors_torch.save_file(w, str(path / "model.safetensors"), metadata={"format": "pt"})
    return w


def block_causal_mask(length: int, block: int) -> torch.Tensor:
    """Bool `[L, L]`: query i may attend key j iff j's block is not after i's block."""
    blk = torch.arange(length) // block
    return blk[None, :] <= blk[:, None]


def _rms_norm(x, weight, eps):
    """Statistics in fp32, cast back to the input dtype, then times the weight."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _linear(x, w, name, bias):
    """torch Linear (bias fused into the matmul, as nn.Linear does); weight `[out, in]`."""
    return torch.nn.functional.linear(x, w[name + ".weight"], w[name + ".bias"] if bias else None)


def _swiglu(x, w, prefix):
    gate = torch.nn.functional.silu(x @ w[prefix + "gate_proj.weight"].T)
    return (gate * (x @ w[prefix + "up_proj.weight"].T)) @ w[prefix + "down_proj.weight"].T


def _rope(x, cfg, rope_dim):
    """Rotate-half RoPE on the first `rope_dim` dims of each head of x `[B, H, L, hd]`."""
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, rope_dim, 2).float() / rope_dim)
    ang = torch.arange(x.shape[2]).float()[:, None] * inv[None]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    rot, rest = x[..., :rope_dim], x[..., rope_dim:]
    x1, x2 = rot[..., : rope_dim // 2], rot[..., rope_dim // 2:]
    return torch.cat([rot * cos + torch.cat([-x2, x1], -1) * sin, rest], -1)


def _route(x, w, prefix, cfg):
    """Group-limited top-k sigmoid router on x `[T, D]`: (topk_idx [T, k], fp32 weights [T, k])."""
    t, k, n_group = x.shape[0], cfg["num_experts_per_tok"], cfg["n_group"]
    scores = torch.sigmoid(x.float() @ w[prefix + "gate.weight"].float().T)
    biased = scores + w[prefix + "gate.expert_bias"].float()
    group_scores = biased.view(t, n_group, -1).topk(2, dim=-1)[0].sum(-1)
    groups = torch.topk(group_scores, k=cfg["topk_group"], dim=-1, sorted=False)[1]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    keep = keep[:, :, None].expand(t, n_group, biased.shape[1] // n_group).reshape(t, -1)
    idx = torch.topk(biased.masked_fill(~keep, float("-inf")), k=k, dim=-1)[1]
    weight = scores.gather(1, idx)
    weight = weight / (weight.sum(-1, keepdim=True) + 1e-20) if k > 1 else weight
    return idx, weight * cfg["routed_scaling_factor"]


def _moe(x, w, prefix, cfg):
    """Routed experts plus shared experts on x `[B, L, D]`; also returns the routing."""
    flat = x.reshape(-1, x.shape[-1])
    idx, weight = _route(flat, w, prefix, cfg)
    y = torch.zeros(*idx.shape, flat.shape[-1])  # fp32 [T, k, D]
    for e in range(cfg["num_experts"]):
        hit = idx == e  # a token picks expert e at most once, so hit.any(-1) rows match y[hit] rows
        y[hit] = _swiglu(flat[hit.any(-1)], w, f"{prefix}experts.{e}.").float()
    out = (y * weight[..., None]).sum(1).to(x.dtype).view_as(x)
    if cfg["num_shared_experts"]:
        out = out + _swiglu(x, w, prefix + "shared_experts.")
    return out, idx, weight


def llada2_forward(w: dict[str, torch.Tensor], cfg: dict, ids: torch.Tensor, mask: torch.Tensor | None = None,
                   dtype=None) -> tuple[torch.Tensor, list[dict]]:
    """LLaDA2 MoE forward with every weight cast to `dtype` (default `torch.float32`).

    `mask`: optional bool `[B, L, L]` (or `[L, L]`), True = may attend; default all-visible.
    Returns fp32 logits `[B, L, V]` (unshifted) and, per MoE layer in order,
    `{"layer": i, "experts": LongTensor [B*L, k], "weights": fp32 [B*L, k]}` where the weights are
    the final ones (normalised, times routed_scaling_factor) and experts are sorted by biased score.
    """
    dtype = torch.float32 if dtype is None else dtype
    w = {k: t.to(dtype) for k, t in w.items()}
    h, kv, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rms_norm_eps"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // h
    rope_dim = int(hd * cfg.get("partial_rotary_factor", 1.0))
    bsz, length = ids.shape
    visible = torch.ones(length, length, dtype=torch.bool) if mask is None else mask.to(torch.bool)
    visible = visible.expand(bsz, length, length)[:, None]
    additive = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)

    x, routing = w["model.word_embeddings.weight"][ids], []
    for i in range(cfg["num_hidden_layers"]):
        b = f"model.layers.{i}."
        a = _rms_norm(x, w[b + "input_layernorm.weight"], eps)
        qkv = _linear(a, w, b + "attention.query_key_value", cfg["use_qkv_bias"])
        q, k, v = qkv.view(bsz, length, h + 2 * kv, hd).transpose(1, 2).split([h, kv, kv], dim=1)
        if cfg["use_qk_norm"]:
            q = _rms_norm(q, w[b + "attention.query_layernorm.weight"], eps)
            k = _rms_norm(k, w[b + "attention.key_layernorm.weight"], eps)
        q, k = _rope(q, cfg, rope_dim), _rope(k, cfg, rope_dim)
        k, v = k.repeat_interleave(h // kv, 1), v.repeat_interleave(h // kv, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) * hd ** -0.5 + additive, -1, dtype=torch.float32).to(dtype)
        o = (att @ v).transpose(1, 2).reshape(bsz, length, h * hd)
        x = x + _linear(o, w, b + "attention.dense", cfg["use_bias"])
        f = _rms_norm(x, w[b + "post_attention_layernorm.weight"], eps)
        if i < cfg["first_k_dense_replace"]:
            x = x + _swiglu(f, w, b + "mlp.")
        else:
            out, idx, weight = _moe(f, w, b + "mlp.", cfg)
            x = x + out
            routing.append({"layer": i, "experts": idx, "weights": weight})
    head = w["model.word_embeddings.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return (_rms_norm(x, w["model.norm.weight"], eps) @ head.T).float(), routing


def published_generate(w: dict[str, torch.Tensor], cfg: dict, prompt, gen_length: int, block: int,
                       threshold: float = 0.95, editing_threshold: float | None = None,
                       max_post_steps: int = 16, stats: dict | None = None) -> tuple[list[int], int]:
    """The published LLaDA2.0 `generate` (or, with `editing_threshold`, LLaDA2.1's), batch 1, greedy,
    written from its description (architectures.md, LLaDA2.0 / 2.1 decoding).

    Blocks of `block` sit at absolute positions; the canvas is the prompt plus MASK up to the end of
    the block that holds position `P + gen_length - 1`. Decoding starts in the block that holds the
    prompt's end (its prompt tokens are never changed) and runs each block over the prefix up to the
    block's end (block-causal, no cache). A step commits every masked position whose top-1
    probability exceeds `threshold`, else the most probable one; LLaDA2.1 also replaces a committed
    answer token whose new top-1 differs with probability above `editing_threshold`, and a block
    ends at the first step without a mask that edits nothing, or before mask-free forward number
    `max_post_steps + 1`. After each block, the loop stops if the answer so far holds EOS.

    One rule is jaxdllm's, not the published code's: MASK is never a prediction (its logit is -inf).
    Returns `(answer, forwards)`: the answer cut after its first EOS (inclusive, within
    `gen_length` tokens), and the number of forwards. `stats`, if given, receives `"edits"`: the
    committed tokens LLaDA2.1 replaced.
    """
    mask_id, eos_id = cfg["mask_token_id"], cfg["eos_token_id"]
    p_len = len(prompt)
    num_blocks = -(-(p_len + gen_length) // block)
    x = torch.full((1, num_blocks * block), mask_id, dtype=torch.long)
    x[0, :p_len] = torch.as_tensor(list(prompt))
    forwards = 0
    for blk in range(p_len // block, num_blocks):
        start, end = blk * block, (blk + 1) * block
        answer = torch.arange(start, end) >= p_len  # the block's positions after the prompt
        post = 0
        while True:
            old = x[:, start:end].clone()
            masked = old == mask_id
            if editing_threshold is None and not masked.any():
                break
            if editing_threshold is not None:
                post += int(not masked.any())
                if post > max_post_steps:
                    break
            forwards += 1
            logits = llada2_forward(w, cfg, x[:, :end], mask=block_causal_mask(end, block))[0][:, start:end].double()
            logits[..., mask_id] = -float("inf")
            probs = logits.softmax(-1)
            p, tokens = probs.max(-1)
            commit = masked & (p > threshold)
            if masked.any() and not commit.any():
                commit[0, torch.where(masked, p, -1.0)[0].argmax()] = True
            edit = torch.zeros_like(commit)
            if editing_threshold is not None:
                edit = ~masked & answer[None] & (p > editing_threshold) & (tokens != old)
                if stats is not None:
                    stats["edits"] = stats.get("edits", 0) + int(edit.sum())
            x[:, start:end] = torch.where(commit | edit, tokens, old)
            if editing_threshold is not None and not masked.any() and not edit.any():
                break
        if (x[0, p_len:end] == eos_id).any():
            break
    out = x[0, p_len:p_len + gen_length].tolist()
    return (out[:out.index(eos_id) + 1] if eos_id in out else out), forwards
