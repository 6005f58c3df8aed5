"""A plain PyTorch LLaDA (eager; no cache of its own) that reads a checkpoint directory in LLaDA layout.

It is the model side of the PyTorch baseline: `torch_port.generate(TorchLLaDA(...), ...)`.
The forward is the one of `tests/support/llada_reference.py` written as modules: bidirectional
attention, GQA, fp32 RMSNorm, rotate-half RoPE at positions 0..L-1, SwiGLU MLP.

    model = TorchLLaDA.from_pretrained("/path/to/llada").eval()
    logits = model(ids)                       # ids [B, L] long -> [B, L, V] float32

For Fast-dLLM's prefix and dual caches it also runs the two forwards a cached sampler needs
(`torch_port.generate(..., cache="prefix" | "dual")`):

    logits, kv = model.full(ids)              # the whole canvas, and every layer's K/V
    logits = model.window(ids[:, s:s + w], s, kv)   # positions [s, s + w) only: fresh K/V there,
                                                    # the stored `kv` everywhere else
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

PREFIX = "model.transformer."
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# config values this port implements; any other value is a different architecture
_SUPPORTED = {"block_type": "llama", "layer_norm_type": "rms", "alibi": False, "rope": True,
              "scale_logits": False, "attention_layer_norm": False}


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) computed in fp32, cast back, then scaled by `weight` [d]."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.to(x.dtype) * self.weight


# Per-layer K/V of a whole canvas: one (k, v) pair per layer, each `[B, Hkv, L, hd]`, k after RoPE
# at its canvas position. Stored per K/V head (before the GQA repeat) to keep the cache small.
KV = list[tuple[torch.Tensor, torch.Tensor]]


def rope_tables(length: int, head_dim: int, theta: float, device=None,
                start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin `[L, hd]` (fp32) for rotate-half RoPE at positions start..start+L-1.

    Row i depends only on the position start + i, so a window's table equals the matching rows
    of the full canvas's table.
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    ang = torch.arange(start, start + length, device=device).float()[:, None] * inv_freq[None]
    return torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on x `[B, H, L, hd]`; done in fp32 so bf16 weights lose no angle precision."""
    h = x.float()
    half = h.shape[-1] // 2
    rotated = torch.cat([-h[..., half:], h[..., :half]], -1)
    return (h * cos + rotated * sin).to(x.dtype)


class LLaDABlock(nn.Module):
    """One pre-norm transformer block; attribute names follow the checkpoint's tensor names."""

    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int, eps: float, bias: set[str]):
        super().__init__()
        hd = d // heads
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hd
        self.attn_norm, self.ff_norm = RMSNorm(d, eps), RMSNorm(d, eps)
        # a projection has a bias exactly when the checkpoint stores one
        lin = lambda name, i, o: nn.Linear(i, o, bias=name in bias)
        self.q_proj = lin("q_proj", d, heads * hd)
        self.k_proj = lin("k_proj", d, kv_heads * hd)
        self.v_proj = lin("v_proj", d, kv_heads * hd)
        self.attn_out = lin("attn_out", heads * hd, d)
        self.ff_proj = lin("ff_proj", d, hidden)   # gate (silu)
        self.up_proj = lin("up_proj", d, hidden)
        self.ff_out = lin("ff_out", hidden, d)     # down

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past: Optional[tuple[torch.Tensor, torch.Tensor]] = None, start: int = 0,
                return_kv: bool = False):
        """x `[B, w, d]` -> `[B, w, d]`, or (that, (k, v)) with `return_kv`; bidirectional (no mask).

        x holds canvas positions [start, start + w) and cos, sin `[w, hd]` are their RoPE tables.
        Without `past` the block attends over x alone (the whole canvas: start = 0). With `past`
        = (k, v) `[B, Hkv, L, hd]`, the stored K/V of the whole canvas, x's queries attend to all L
        positions: x's own fresh K/V at [start, start + w) and the stored ones everywhere else.
        The K/V returned are x's fresh ones, `[B, Hkv, w, hd]` (k after RoPE).
        """
        b, length, _ = x.shape
        a = self.attn_norm(x)
        heads = lambda t, n: t.view(b, length, n, self.head_dim).transpose(1, 2)  # [B, n, w, hd]
        q = apply_rope(heads(self.q_proj(a), self.heads), cos, sin)
        k = apply_rope(heads(self.k_proj(a), self.kv_heads), cos, sin)
        v = heads(self.v_proj(a), self.kv_heads)
        fresh = (k, v)
        if past is not None:
            # keys in canvas order, the window's rows replaced (attention does not depend on the
            # order of the keys; keeping it keeps the sums in the same order as a full forward)
            end = start + length
            k = torch.cat([past[0][:, :, :start], k, past[0][:, :, end:]], 2)
            v = torch.cat([past[1][:, :, :start], v, past[1][:, :, end:]], 2)
        if self.kv_heads != self.heads:  # GQA: each K/V head serves a run of consecutive Q heads
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = F.scaled_dot_product_attention(q, k, v)
        x = x + self.attn_out(att.transpose(1, 2).reshape(b, length, -1))
        f = self.ff_norm(x)
        x = x + self.ff_out(F.silu(self.ff_proj(f)) * self.up_proj(f))
        return (x, fresh) if return_kv else x


class TorchLLaDA(nn.Module):
    """LLaDA mask predictor: `forward(ids [B, L]) -> logits [B, L, V] float32`.

    `full` and `window` are the K/V-cache forwards (`torch_port.KVModel`); the caller keeps the K/V.
    """

    def __init__(self, config: dict, bias: set[str] = frozenset()):
        super().__init__()
        c = config
        for key, ok in _SUPPORTED.items():
            if key in c and c[key] != ok:
                raise ValueError(f"LLaDA config {key}={c[key]!r} is not supported (need {ok!r})")
        d, heads = c["d_model"], c["n_heads"]
        kv_heads = c.get("n_kv_heads") or heads
        if d % heads or heads % kv_heads:
            raise ValueError(f"d_model {d}, n_heads {heads}, n_kv_heads {kv_heads} do not divide")
        vocab = int(c.get("embedding_size") or c["vocab_size"])
        eps = float(c.get("rms_norm_eps", 1e-5))
        self.config = dict(c)
        self.head_dim, self.rope_theta = d // heads, float(c.get("rope_theta", 10000.0))
        self.weight_tying = bool(c.get("weight_tying", False))
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LLaDABlock(d, heads, kv_heads, c["mlp_hidden_size"], eps, bias)
                                    for _ in range(c["n_layers"]))
        self.ln_f = RMSNorm(d, eps)
        self.ff_out = None if self.weight_tying else nn.Linear(d, vocab, bias="lm_head" in bias)

    @classmethod
    def from_pretrained(cls, path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> "TorchLLaDA":
        """Load `config.json` and `model.safetensors` (or a sharded index) from directory `path`.

        Weights are cast to `dtype` and placed on `device` (read straight there, so an 8B model
        needs no host copy of its own); a missing or unexpected tensor raises (strict loading).
        The modules are built without storage (meta device) and take the loaded tensors as they are.
        """
        path = Path(path)
        config = json.loads((path / "config.json").read_text())
        weights = {k[len(PREFIX):] if k.startswith(PREFIX) else k: v.to(dtype)
                   for k, v in _read_safetensors(path, device).items()}
        bias = {k.split(".")[-2] for k in weights if k.startswith("blocks.") and k.endswith(".bias")}
        if "ff_out.bias" in weights:
            bias.add("lm_head")
        with torch.device("meta"):
            model = cls(config, bias)
        model.load_state_dict(weights, strict=True, assign=True)
        return model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids `[B, L]` long -> logits `[B, L, V]` float32 (bidirectional, RoPE positions 0..L-1)."""
        return self._run(ids)[0]

    def full(self, ids: torch.Tensor) -> tuple[torch.Tensor, KV]:
        """The whole canvas ids `[B, L]` -> (logits `[B, L, V]` float32, every layer's K/V).

        The logits equal `forward(ids)` (same operations); the K/V (`KV`: per layer (k, v)
        `[B, Hkv, L, hd]`, k after RoPE at positions 0..L-1) are what `window` reads.
        """
        return self._run(ids, return_kv=True)

    def window(self, ids: torch.Tensor, start: int, kv: KV, logits_len: Optional[int] = None) -> torch.Tensor:
        """Canvas positions [start, start + w) only: ids `[B, w]` -> logits `[B, n, V]` float32.

        RoPE at the absolute positions start..start+w-1. In every layer the window's queries
        attend to the window's fresh K/V and to the stored `kv` (from `full` on a canvas of L
        positions) at every other position, as the stored K/V stand (stale where the canvas has
        changed since). `kv` is not modified. Logits for the first n = `logits_len` (default w)
        positions of the window only, which spares the LM head the rest.
        """
        length = kv[0][0].shape[2]
        if start < 0 or start + ids.shape[1] > length:
            raise ValueError(f"window [{start}, {start + ids.shape[1]}) is outside the cached canvas of {length}")
        return self._run(ids, start, kv, logits_len=logits_len)[0]

    def _run(self, ids: torch.Tensor, start: int = 0, kv: Optional[KV] = None, return_kv: bool = False,
             logits_len: Optional[int] = None) -> tuple[torch.Tensor, Optional[KV]]:
        """ids `[B, w]` at positions [start, start + w) -> (logits `[B, n, V]` float32, fresh K/V or None)."""
        x = self.wte(ids)
        cos, sin = rope_tables(ids.shape[1], self.head_dim, self.rope_theta, ids.device, start)
        fresh: KV = []
        for i, block in enumerate(self.blocks):
            past = None if kv is None else kv[i]
            if return_kv:
                x, layer_kv = block(x, cos, sin, past, start, return_kv=True)
                fresh.append(layer_kv)
            else:
                x = block(x, cos, sin, past, start)
        if logits_len is not None:
            x = x[:, :logits_len]  # norm and head are per position
        x = self.ln_f(x)
        logits = x @ self.wte.weight.T if self.ff_out is None else self.ff_out(x)
        return logits.float(), (fresh if return_kv else None)


def _read_safetensors(path: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory, on `device`: one `model.safetensors` or the shards of an index."""
    from safetensors.torch import load_file

    device = str(device)
    if (path / INDEX_FILE).exists():
        weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
        out: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            out.update(load_file(str(path / shard), device=device))
        return out
    if (path / SINGLE_FILE).exists():
        return load_file(str(path / SINGLE_FILE), device=device)
    raise FileNotFoundError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE}")
