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
    """One checkpoint tensor (or part of one): its name and shape there, its parameter path and
    shape here.

    `rows=(a, b)`: this parameter is rows `[a, b)` of the checkpoint tensor (LLaDA2's fused
    `query_key_value` holds q, k and v). `expert=e`: this tensor is expert `e`'s slice of a
    parameter stacked over experts (`shape` is the slice's shape).
    """

    name: str
    path: tuple
    hf_shape: tuple[int, ...]
    shape: tuple[int, ...]
    transpose: bool
    rows: tuple[int, int] | None = None
    expert: int | None = None

    @property
    def part_shape(self) -> tuple[int, ...]:
        """The shape of the checkpoint rows this mapping covers (`hf_shape` unless `rows`)."""
        if self.rows is None:
            return self.hf_shape
        return (self.rows[1] - self.rows[0], *self.hf_shape[1:])

    def to_jax(self, w: np.ndarray) -> np.ndarray:
        """Checkpoint layout (the covered rows) -> jaxdllm layout (a view where numpy allows)."""
        return (w.T if self.transpose else w).reshape(self.shape)

    def to_hf(self, w: np.ndarray) -> np.ndarray:
        """jaxdllm layout -> checkpoint layout (the covered rows), contiguous."""
        if self.transpose:
            return np.ascontiguousarray(w.reshape(self.part_shape[::-1]).T)
        return np.ascontiguousarray(w.reshape(self.part_shape))


# Per-layer names: (ours, hf, llada). Ours: path under ('layers', i).
_ATTN = (("q", "self_attn.q_proj", "q_proj"), ("k", "self_attn.k_proj", "k_proj"),
         ("v", "self_attn.v_proj", "v_proj"), ("o", "self_attn.o_proj", "attn_out"))
_MLP = (("gate", "mlp.gate_proj", "ff_proj"), ("up", "mlp.up_proj", "up_proj"),
        ("down", "mlp.down_proj", "ff_out"))
_NORMS = (("attn_norm", "input_layernorm", "attn_norm"),
          ("mlp_norm", "post_attention_layernorm", "ff_norm"))


def tensor_table(config: ModelConfig) -> list[TensorMapping]:
    """Every tensor a checkpoint of `config` holds, in file order (a fused tensor once per part)."""
    c = config
    if c.checkpoint_format == "llada2":
        return _llada2_table(c)
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


def _llada2_table(c: ModelConfig) -> list[TensorMapping]:
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
            table += _swiglu(lp + "mlp.", at + ("mlp",), d, c.mlp_dim)
            continue
        e, m = c.num_experts, c.expert_dim
        table += [TensorMapping(lp + "mlp.gate.weight", at + ("mlp", "router"), (e, d), (d, e), True),
                  TensorMapping(lp + "mlp.gate.expert_bias", at + ("mlp", "expert_bias"), (e,), (e,), False)]
        for x in range(e):
            table += _swiglu(lp + f"mlp.experts.{x}.", at + ("mlp",), d, m, expert=x)
        if c.num_shared_experts:
            table += _swiglu(lp + "mlp.shared_experts.", at + ("mlp", "shared"), d, m * c.num_shared_experts)
    table.append(TensorMapping("model.norm.weight", ("final_norm", "scale"), (d,), (d,), False))
    if not c.tie_embeddings:
        table.append(TensorMapping("lm_head.weight", ("lm_head",), (v, d), (d, v), True))
    return table


def _swiglu(prefix: str, at: tuple, d: int, m: int, expert: int | None = None) -> list[TensorMapping]:
    """`{gate,up,down}_proj.weight` (torch `[out, in]`) of one SwiGLU of width `m`."""
    return [TensorMapping(prefix + f"{ours}_proj.weight", at + (ours, "kernel"),
                          (d, m) if ours == "down" else (m, d), (m, d) if ours == "down" else (d, m), True,
                          expert=expert) for ours in ("gate", "up", "down")]


def param_location(mapping: TensorMapping, scan_layers: bool) -> tuple[tuple, tuple[int, ...]]:
    """`(parameter path, index)` of a tensor: the tensor is slice `index` of the parameter's leading
    axes, `()` for a whole parameter. With `scan_layers` (the model's run option) a layer's tensor
    is slice `(layer,)` of one stacked parameter (path without the layer); a routed expert's tensor
    adds `(expert,)`."""
    path, index = mapping.path, ()
    if scan_layers and path[0] == "layers":
        path, index = ("layers",) + path[2:], (path[1],)
    if mapping.expert is not None:
        index += (mapping.expert,)
    return path, index


def is_ignorable(name: str, config: ModelConfig) -> bool:
    """Tensors some checkpoints carry that hold no parameter: RoPE buffers, a tied LM head."""
    if name.endswith("rotary_emb.inv_freq"):
        return True
    return config.tie_embeddings and name in ("lm_head.weight", "model.transformer.ff_out.weight")
