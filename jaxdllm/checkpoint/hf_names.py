"""The table from checkpoint tensor names to `Transformer` parameter paths, with layouts.

HF/torch linears are `[out, in]`; jaxdllm stores `[in, out]` with heads split out, so a
tensor converts by an optional transpose followed by a reshape (and back the other way).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxdllm.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class TensorMapping:
    """One checkpoint tensor: its name and shape there, its parameter path and shape here."""

    name: str
    path: tuple
    hf_shape: tuple[int, ...]
    shape: tuple[int, ...]
    transpose: bool

    def to_jax(self, w: np.ndarray) -> np.ndarray:
        """Checkpoint layout -> jaxdllm layout (a view where numpy allows)."""
        return (w.T if self.transpose else w).reshape(self.shape)

    def to_hf(self, w: np.ndarray) -> np.ndarray:
        """jaxdllm layout -> checkpoint layout, contiguous."""
        if self.transpose:
            return np.ascontiguousarray(w.reshape(self.hf_shape[::-1]).T)
        return np.ascontiguousarray(w.reshape(self.hf_shape))


# Per-layer names: (ours, hf, llada). Ours: path under ('layers', i).
_ATTN = (("q", "self_attn.q_proj", "q_proj"), ("k", "self_attn.k_proj", "k_proj"),
         ("v", "self_attn.v_proj", "v_proj"), ("o", "self_attn.o_proj", "attn_out"))
_MLP = (("gate", "mlp.gate_proj", "ff_proj"), ("up", "mlp.up_proj", "up_proj"),
        ("down", "mlp.down_proj", "ff_out"))
_NORMS = (("attn_norm", "input_layernorm", "attn_norm"),
          ("mlp_norm", "post_attention_layernorm", "ff_norm"))


def tensor_table(config: ModelConfig) -> list[TensorMapping]:
    """Every tensor a checkpoint of `config` holds, in file order."""
    c = config
    llada = c.checkpoint_format == "llada"
    d, h, kv, hd, m, v = c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim, c.vocab_size
    prefix = "model.transformer." if llada else "model."
    layer_prefix = prefix + ("blocks." if llada else "layers.")
    heads = {"q": h, "k": kv, "v": kv, "o": h}
    table = [TensorMapping(prefix + ("wte.weight" if llada else "embed_tokens.weight"),
                           ("embed",), (v, d), (v, d), False)]
    for i in range(c.num_layers):
        lp = f"{layer_prefix}{i}."
        for ours, hf, ll in _NORMS:
            table.append(TensorMapping(lp + (ll if llada else hf) + ".weight",
                                       ("layers", i, ours, "scale"), (d,), (d,), False))
        for ours, hf, ll in _ATTN:
            name = lp + (ll if llada else hf)
            n = heads[ours]
            path = ("layers", i, "attn", ours)
            if ours == "o":
                table.append(TensorMapping(name + ".weight", path + ("kernel",), (d, n * hd), (n, hd, d), True))
                if c.out_bias:
                    table.append(TensorMapping(name + ".bias", path + ("bias",), (d,), (d,), False))
            else:
                table.append(TensorMapping(name + ".weight", path + ("kernel",), (n * hd, d), (d, n, hd), True))
                if c.qkv_bias:
                    table.append(TensorMapping(name + ".bias", path + ("bias",), (n * hd,), (n, hd), False))
        for ours, hf, ll in _MLP:
            name = lp + (ll if llada else hf)
            path = ("layers", i, "mlp", ours)
            out_dim, in_dim = (d, m) if ours == "down" else (m, d)
            table.append(TensorMapping(name + ".weight", path + ("kernel",), (out_dim, in_dim), (in_dim, out_dim), True))
            if c.mlp_bias:
                table.append(TensorMapping(name + ".bias", path + ("bias",), (out_dim,), (out_dim,), False))
    table.append(TensorMapping(prefix + ("ln_f.weight" if llada else "norm.weight"),
                               ("final_norm", "scale"), (d,), (d,), False))
    if not c.tie_embeddings:
        table.append(TensorMapping(prefix + "ff_out.weight" if llada else "lm_head.weight",
                                   ("lm_head",), (v, d), (d, v), True))
    return table


def param_location(mapping: TensorMapping, config: ModelConfig) -> tuple[tuple, int | None]:
    """`(parameter path, layer index)` of a tensor: with `scan_layers` every layer's tensor is slice
    `index` of one stacked parameter (path without the index); otherwise the index is None."""
    path = mapping.path
    if config.scan_layers and path[0] == "layers":
        return ("layers",) + path[2:], path[1]
    return path, None


def is_ignorable(name: str, config: ModelConfig) -> bool:
    """Tensors some checkpoints carry that hold no parameter: RoPE buffers, a tied LM head."""
    if name.endswith("rotary_emb.inv_freq"):
        return True
    return config.tie_embeddings and name in ("lm_head.weight", "model.transformer.ff_out.weight")
