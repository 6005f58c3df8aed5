"""Checkpoint tensor names -> `Transformer` parameter paths: `TensorMapping` and the table pieces
the families share (the LLaMA-style decoder, one SwiGLU).

HF/torch linears are `[out, in]`; jaxdllm stores `[in, out]` with heads split out, so a
tensor converts by an optional transpose followed by a reshape (and back the other way).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxdllm.errors import ConfigError
from jaxdllm.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class TensorMapping:
    """One checkpoint tensor (or part of one): its name and shape there, its parameter path and
    shape here.

    `rows=(a, b)`: this parameter is rows `[a, b)` of the checkpoint tensor along `axis` (LLaDA2's
    fused `query_key_value` holds q, k and v on axis 0; DiffusionGemma's `gate_up_proj [E, 2M, D]`
    gate and up on axis 1). `expert=e`: this tensor is expert `e`'s slice of a parameter stacked
    over experts (`shape` is the slice's shape). `transpose` swaps the last two axes (a torch
    `[..., out, in]` linear to jaxdllm's `[..., in, out]`).
    """

    name: str
    path: tuple
    hf_shape: tuple[int, ...]
    shape: tuple[int, ...]
    transpose: bool
    rows: tuple[int, int] | None = None
    expert: int | None = None
    axis: int = 0

    @property
    def part_shape(self) -> tuple[int, ...]:
        """The shape of the checkpoint rows this mapping covers (`hf_shape` unless `rows`)."""
        if self.rows is None:
            return self.hf_shape
        shape = list(self.hf_shape)
        shape[self.axis] = self.rows[1] - self.rows[0]
        return tuple(shape)

    def read(self, handle) -> np.ndarray:
        """The covered part of this tensor from an open safetensors file, or from a `{name: array}`
        of the file's tensors (views of its memory map: the part stays a view, read when used)."""
        where = (slice(None),) * self.axis + (slice(*self.rows),) if self.rows is not None else None
        if isinstance(handle, dict):
            whole = handle[self.name]
            return whole if where is None else whole[where]
        if where is None:
            return handle.get_tensor(self.name)
        return handle.get_slice(self.name)[where]

    def to_jax(self, w: np.ndarray) -> np.ndarray:
        """Checkpoint layout (the covered rows) -> jaxdllm layout (a view where numpy allows)."""
        return (np.swapaxes(w, -1, -2) if self.transpose else w).reshape(self.shape)

    def to_hf(self, w, xp=np):
        """jaxdllm layout -> checkpoint layout (the covered rows), contiguous. `xp`: the array
        module of `w` (`numpy`, or `jax.numpy` for a conversion on the arrays' devices)."""
        if self.transpose:
            swapped = (*self.part_shape[:-2], self.part_shape[-1], self.part_shape[-2])
            w = xp.swapaxes(w.reshape(swapped), -1, -2)
        else:
            w = w.reshape(self.part_shape)
        return np.ascontiguousarray(w) if xp is np else w


@dataclasses.dataclass(frozen=True)
class DecoderNames:
    """The tensor names of a LLaMA-style decoder: whole-model names, then per-layer names under
    `layers + "{i}."` (each without `.weight` / `.bias`); `q_norm` / `k_norm`: the q/k RMSNorms of a
    config with `qk_norm` (Qwen3)."""

    embed: str
    layers: str
    final_norm: str
    lm_head: str
    attn_norm: str
    mlp_norm: str
    q: str
    k: str
    v: str
    o: str
    gate: str
    up: str
    down: str
    q_norm: str | None = None
    k_norm: str | None = None


def decoder_table(c: ModelConfig, names: DecoderNames) -> list[TensorMapping]:
    """Every tensor of a LLaMA-style decoder named by `names`, in file order: embedding; per layer
    the two norms, q/k/v/o (then each one's bias where the config has them), the q/k norms where
    the config has them, gate/up/down; final norm; the LM head unless tied."""
    d, h, kv, hd, m, v = c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim, c.vocab_size
    if c.qk_norm and not (names.q_norm and names.k_norm):
        raise ConfigError(f"{c.model_type!r}: this checkpoint layout has no q/k norm tensors (qk_norm=True)")
    heads = {"q": h, "k": kv, "v": kv, "o": h}
    table = [TensorMapping(names.embed + ".weight", ("embed",), (v, d), (v, d), False)]
    for i in range(c.num_layers):
        lp, at = f"{names.layers}{i}.", ("layers", i)
        for ours in ("attn_norm", "mlp_norm"):
            table.append(TensorMapping(lp + getattr(names, ours) + ".weight", at + (ours, "scale"), (d,), (d,), False))
        for ours in ("q", "k", "v", "o"):
            name, n, path = lp + getattr(names, ours), heads[ours], at + ("attn", ours)
            if ours == "o":
                table.append(TensorMapping(name + ".weight", path + ("kernel",), (d, n * hd), (n, hd, d), True))
                if c.out_bias:
                    table.append(TensorMapping(name + ".bias", path + ("bias",), (d,), (d,), False))
            else:
                table.append(TensorMapping(name + ".weight", path + ("kernel",), (n * hd, d), (d, n, hd), True))
                if c.qkv_bias:
                    table.append(TensorMapping(name + ".bias", path + ("bias",), (n * hd,), (n, hd), False))
        if c.qk_norm:
            table += [TensorMapping(lp + getattr(names, ours) + ".weight", at + ("attn", ours, "scale"), (hd,), (hd,),
                                    False) for ours in ("q_norm", "k_norm")]
        for ours in ("gate", "up", "down"):
            name, path = lp + getattr(names, ours), at + ("mlp", ours)
            out_dim, in_dim = (d, m) if ours == "down" else (m, d)
            table.append(TensorMapping(name + ".weight", path + ("kernel",), (out_dim, in_dim), (in_dim, out_dim),
                                       True))
            if c.mlp_bias:
                table.append(TensorMapping(name + ".bias", path + ("bias",), (out_dim,), (out_dim,), False))
    table.append(TensorMapping(names.final_norm + ".weight", ("final_norm", "scale"), (d,), (d,), False))
    if not c.tie_embeddings:
        table.append(TensorMapping(names.lm_head + ".weight", ("lm_head",), (v, d), (d, v), True))
    return table


# Hugging Face Llama / Qwen2 / Qwen3 names (Dream, SDAR and block-diffusion Qwen2 checkpoints use them too);
# the q/k norms are Qwen3's.
HF_DECODER_NAMES = DecoderNames(
    embed="model.embed_tokens", layers="model.layers.", final_norm="model.norm", lm_head="lm_head",
    attn_norm="input_layernorm", mlp_norm="post_attention_layernorm", q="self_attn.q_proj", k="self_attn.k_proj",
    v="self_attn.v_proj", o="self_attn.o_proj", gate="mlp.gate_proj", up="mlp.up_proj", down="mlp.down_proj",
    q_norm="self_attn.q_norm", k_norm="self_attn.k_norm")


def swiglu(prefix: str, at: tuple, d: int, m: int, expert: int | None = None) -> list[TensorMapping]:
    """`{gate,up,down}_proj.weight` (torch `[out, in]`) of one SwiGLU of width `m`, under `prefix`,
    mapped to `at + (gate|up|down, "kernel")`."""
    return [TensorMapping(prefix + f"{ours}_proj.weight", at + (ours, "kernel"),
                          (d, m) if ours == "down" else (m, d), (m, d) if ours == "down" else (d, m), True,
                          expert=expert) for ours in ("gate", "up", "down")]
