"""BERT checkpoints in transformers' layout (`BertForMaskedLM`): config.json reading and writing, and
the tensor table.

config.json (`model_type` "bert"): `hidden_size` -> embed_dim, `num_hidden_layers`,
`num_attention_heads` (head_dim = hidden_size / heads), `intermediate_size` -> mlp_dim, `hidden_act`,
`max_position_embeddings` -> max_position, `type_vocab_size`, `layer_norm_eps`, `vocab_size`, special
ids. Refused with a named error: a decoder (`is_decoder`, `add_cross_attention`), relative position
embeddings (`position_embedding_type` other than "absolute"), untied embeddings, an unsupported
`hidden_act`. `mask_token_id` (not a transformers key) is read where present; a config.json without one
and with GenMol's SAFE vocabulary (1880 entries, V2 1882) takes GenMol's ids ([MASK] 4, [CLS] 1 as bos,
[SEP] 2 as eos, [PAD] 3), each unless the file names it. Keys jaxdllm does not model (dropouts,
`initializer_range`, ...) are written back as read.

Tensors (torch linears `[out, in]`, stored here `[in, out]` with heads split out):
`bert.embeddings.{word_embeddings [V, D], position_embeddings [P, D], token_type_embeddings [T, D]}.weight`,
`bert.embeddings.LayerNorm.{weight,bias}`; per layer `bert.encoder.layer.{i}.attention.self.{query,key,value}`,
`attention.output.dense`, `attention.output.LayerNorm`, `intermediate.dense`, `output.dense`,
`output.LayerNorm` (each `.weight` and `.bias`); `cls.predictions.transform.dense`,
`cls.predictions.transform.LayerNorm`, `cls.predictions.bias [V]`. Skipped on import: the decoder
(`cls.predictions.decoder.weight` is the word embedding, `.bias` is `cls.predictions.bias`), the
position/type id buffers, and a pretraining checkpoint's pooler and next-sentence head.
"""

from __future__ import annotations

import math

from jaxdllm.errors import CheckpointError
from jaxdllm.models.families.bert.bert_config import ACTIVATIONS, GENMOL_IDS, GENMOL_VOCAB_SIZES, BertConfig
from jaxdllm.models.families.config_json import first_id, require
from jaxdllm.models.families.tensors import TensorMapping

MODEL_TYPES = ("bert",)
IGNORED = ("cls.predictions.decoder.", "bert.embeddings.position_ids", "bert.embeddings.token_type_ids",
           "bert.pooler.", "cls.seq_relationship.")


def config_from_hf(raw: dict, where: str) -> BertConfig:
    """A `BertConfig` from transformers' BERT config.json; absent keys take transformers' defaults."""
    require(raw, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"),
            where)
    d, n = raw["hidden_size"], raw["num_attention_heads"]
    if d % n:
        raise CheckpointError(f"{where}: hidden_size ({d}) is not a multiple of num_attention_heads ({n})")
    if raw.get("is_decoder") or raw.get("add_cross_attention"):
        raise CheckpointError(f"{where}: a BERT decoder (is_decoder / add_cross_attention) is not supported; "
                              "jaxdllm runs BERT as a bidirectional masked LM")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{where}: position_embedding_type={raw['position_embedding_type']!r} is not "
                              "supported; jaxdllm's BERT has absolute position embeddings")
    if raw.get("tie_word_embeddings") is False:
        raise CheckpointError(f"{where}: untied embeddings are not supported (BERT's MLM decoder is its word "
                              "embedding)")
    act = raw.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{where}: hidden_act={act!r} is not supported; use one of {ACTIVATIONS}")
    vocab = raw["vocab_size"]
    ids = {key: first_id(raw.get(key)) for key in ("mask_token_id", "bos_token_id", "eos_token_id", "pad_token_id")}
    if ids["mask_token_id"] is None and vocab in GENMOL_VOCAB_SIZES:  # GenMol's SAFE tokenizer
        ids = {key: GENMOL_IDS[key] if value is None else value for key, value in ids.items()}
    return BertConfig(
        vocab_size=vocab, embed_dim=d, num_layers=raw["num_hidden_layers"], num_heads=n, num_kv_heads=n,
        head_dim=d // n, mlp_dim=raw["intermediate_size"], norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
        max_position=int(raw.get("max_position_embeddings", 512)), type_vocab_size=int(raw.get("type_vocab_size", 2)),
        hidden_act=act, source_config=raw, **ids)


def config_to_hf(c: BertConfig, out: dict) -> None:
    """BERT's config.json keys into `out` (which holds the source's other keys)."""
    out.update(model_type="bert", vocab_size=c.vocab_size, hidden_size=c.embed_dim, num_hidden_layers=c.num_layers,
               num_attention_heads=c.num_heads, intermediate_size=c.mlp_dim, hidden_act=c.hidden_act,
               max_position_embeddings=c.max_position, type_vocab_size=c.type_vocab_size,
               layer_norm_eps=c.norm_eps, position_embedding_type="absolute", tie_word_embeddings=True)
    out.setdefault("architectures", ["BertForMaskedLM"])


def _linear(name: str, path: tuple, out_shape: tuple, in_dim: int, kernel_shape: tuple) -> list[TensorMapping]:
    """A torch `nn.Linear`'s `.weight [out, in]` and `.bias [out]` -> `path + (kernel, bias)`."""
    out_size = math.prod(out_shape)
    return [TensorMapping(name + ".weight", path + ("kernel",), (out_size, in_dim), kernel_shape, True),
            TensorMapping(name + ".bias", path + ("bias",), (out_size,), out_shape, False)]


def _norm(name: str, path: tuple, d: int) -> list[TensorMapping]:
    return [TensorMapping(name + ".weight", path + ("scale",), (d,), (d,), False),
            TensorMapping(name + ".bias", path + ("bias",), (d,), (d,), False)]


def tensor_table(c: BertConfig) -> list[TensorMapping]:
    """Every tensor of a `BertForMaskedLM` checkpoint jaxdllm reads, in file order (sorted names)."""
    d, n, hd, m, v = c.embed_dim, c.num_heads, c.head_dim, c.mlp_dim, c.vocab_size
    e = "bert.embeddings."
    table = [TensorMapping(e + "word_embeddings.weight", ("embed",), (v, d), (v, d), False),
             TensorMapping(e + "position_embeddings.weight", ("position_embed",), (c.max_position, d),
                           (c.max_position, d), False),
             TensorMapping(e + "token_type_embeddings.weight", ("type_embed",), (c.type_vocab_size, d),
                           (c.type_vocab_size, d), False),
             *_norm(e + "LayerNorm", ("embed_norm",), d)]
    for i in range(c.num_layers):
        lp, at = f"bert.encoder.layer.{i}.", ("layers", i)
        for hf, ours in (("query", "q"), ("key", "k"), ("value", "v")):
            table += _linear(lp + f"attention.self.{hf}", at + ("attn", ours), (n, hd), d, (d, n, hd))
        table += _linear(lp + "attention.output.dense", at + ("attn", "o"), (d,), n * hd, (n, hd, d))
        table += _norm(lp + "attention.output.LayerNorm", at + ("attn_norm",), d)
        table += _linear(lp + "intermediate.dense", at + ("mlp", "up"), (m,), d, (d, m))
        table += _linear(lp + "output.dense", at + ("mlp", "down"), (d,), m, (m, d))
        table += _norm(lp + "output.LayerNorm", at + ("mlp_norm",), d)
    table += [TensorMapping("cls.predictions.bias", ("lm_bias",), (v,), (v,), False),
              *_linear("cls.predictions.transform.dense", ("head_dense",), (d,), d, (d, d)),
              *_norm("cls.predictions.transform.LayerNorm", ("head_norm",), d)]
    return sorted(table, key=lambda t: t.name)
