"""XLNet checkpoints in transformers' layout (`XLNetLMHeadModel`): config.json reading and writing, and
the tensor table.

config.json (`model_type` "xlnet"): `d_model` -> embed_dim, `n_layer`, `n_head` (`d_head` = d_model /
n_head), `d_inner` -> mlp_dim, `ff_activation`, `layer_norm_eps`, `clamp_len`, `vocab_size`, special ids
(xlnet-base-cased: bos 1, eos 2, pad 5). Refused with a named error: `attn_type` "uni" (jaxdllm
builds the causal pattern into `perm_mask` instead), `bi_data` (a pretraining-only split of the
batch), untied embeddings. `mask_token_id` (not a transformers key) is read where present; a
config.json without one and with the published 32,000-entry vocabulary takes its `<mask>` id 6, and
`jaxdllm_max_position` (jaxdllm's own key: XLNet has no position table, and transformers refuses
`max_position_embeddings`) bounds the prompt and answer jaxdllm lays out (default 512, ASSD's rows). Keys jaxdllm does not model
(`mem_len`, `summary_*`, ...) are written back as read.

Tensors: `transformer.word_embedding.weight [V, D]`, `transformer.mask_emb [1, 1, D]`; per layer
`transformer.layer.{i}.rel_attn.{q,k,v,o,r} [D, n_head, d_head]` (kept in that layout),
`rel_attn.{r_r_bias,r_s_bias,r_w_bias} [n_head, d_head]`, `rel_attn.seg_embed [2, n_head, d_head]`,
`rel_attn.layer_norm.{weight,bias}`, `ff.layer_1.{weight [d_inner, D], bias}`, `ff.layer_2.{weight
[D, d_inner], bias}`, `ff.layer_norm.{weight,bias}`; `lm_loss.bias [V]`. The head's weight is the
word embedding (a file that stores `lm_loss.weight` anyway has it skipped).
"""

from __future__ import annotations

from jaxdllm.errors import CheckpointError
from jaxdllm.models.families.config_json import first_id, require
from jaxdllm.models.families.tensors import TensorMapping
from jaxdllm.models.families.xlnet.xlnet_config import ACTIVATIONS, MASK_ID, VOCAB_SIZE, XLNetConfig

MODEL_TYPES = ("xlnet",)
IGNORED = ("lm_loss.weight",)
DEFAULT_MAX_POSITION = 512
MAX_POSITION_KEY = "jaxdllm_max_position"


def config_from_hf(raw: dict, where: str) -> XLNetConfig:
    """An `XLNetConfig` from transformers' XLNet config.json; absent keys take `XLNetConfig`'s
    (transformers') defaults."""
    require(raw, ("vocab_size", "d_model", "n_layer", "n_head", "d_inner"), where)
    d, n = raw["d_model"], raw["n_head"]
    if d % n:
        raise CheckpointError(f"{where}: d_model ({d}) is not a multiple of n_head ({n})")
    if raw.get("d_head", d // n) != d // n:
        raise CheckpointError(f"{where}: d_head ({raw['d_head']}) must be d_model / n_head = {d // n}")
    if raw.get("attn_type", "bi") != "bi":
        raise CheckpointError(f"{where}: attn_type={raw['attn_type']!r} is not supported; jaxdllm runs XLNet with "
                              "attn_type 'bi' and puts any causal order into perm_mask")
    if raw.get("bi_data"):
        raise CheckpointError(f"{where}: bi_data=true (XLNet pretraining's forward/backward batch split) is not "
                              "supported; set it to false")
    if raw.get("tie_word_embeddings") is False:
        raise CheckpointError(f"{where}: untied embeddings are not supported (XLNet's head is its word embedding)")
    if raw.get("ff_activation", "gelu") not in ACTIVATIONS:
        raise CheckpointError(f"{where}: ff_activation={raw['ff_activation']!r} is not supported; use one of "
                              f"{ACTIVATIONS}")
    vocab = raw["vocab_size"]
    mask = raw.get("mask_token_id")
    if mask is None and vocab == VOCAB_SIZE:  # the published tokenizer's <mask>
        mask = MASK_ID
    clamp = raw.get("clamp_len", -1)
    return XLNetConfig(
        vocab_size=vocab, embed_dim=d, num_layers=raw["n_layer"], num_heads=n, num_kv_heads=n, head_dim=d // n,
        mlp_dim=raw["d_inner"], norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
        ff_activation=raw.get("ff_activation", "gelu"), clamp_len=-1 if clamp is None or clamp < 0 else int(clamp),
        max_position=int(raw.get(MAX_POSITION_KEY, DEFAULT_MAX_POSITION)),
        mask_token_id=mask, eos_token_id=first_id(raw.get("eos_token_id")),
        pad_token_id=first_id(raw.get("pad_token_id")), bos_token_id=first_id(raw.get("bos_token_id")),
        source_config=raw)


def config_to_hf(c: XLNetConfig, out: dict) -> None:
    """XLNet's config.json keys into `out` (which holds the source's other keys)."""
    out.update(model_type="xlnet", vocab_size=c.vocab_size, d_model=c.embed_dim, n_layer=c.num_layers,
               n_head=c.num_heads, d_head=c.head_dim, d_inner=c.mlp_dim, ff_activation=c.ff_activation,
               layer_norm_eps=c.norm_eps, clamp_len=c.clamp_len, attn_type="bi", bi_data=False,
               tie_word_embeddings=True, **{MAX_POSITION_KEY: c.max_position})
    out.setdefault("architectures", ["XLNetLMHeadModel"])


def tensor_table(c: XLNetConfig) -> list[TensorMapping]:
    """Every tensor of an `XLNetLMHeadModel` checkpoint, in transformers' file order (sorted names)."""
    d, n, hd, m, v = c.embed_dim, c.num_heads, c.head_dim, c.mlp_dim, c.vocab_size
    table = [TensorMapping("lm_loss.bias", ("lm_bias",), (v,), (v,), False)]
    for i in range(c.num_layers):
        lp, at = f"transformer.layer.{i}.", ("layers", i)
        ff, attn = at + ("ff",), at + ("attn",)
        table += [
            TensorMapping(lp + "ff.layer_1.bias", ff + ("layer_1", "bias"), (m,), (m,), False),
            TensorMapping(lp + "ff.layer_1.weight", ff + ("layer_1", "kernel"), (m, d), (d, m), True),
            TensorMapping(lp + "ff.layer_2.bias", ff + ("layer_2", "bias"), (d,), (d,), False),
            TensorMapping(lp + "ff.layer_2.weight", ff + ("layer_2", "kernel"), (d, m), (m, d), True),
            TensorMapping(lp + "ff.layer_norm.bias", ff + ("norm", "bias"), (d,), (d,), False),
            TensorMapping(lp + "ff.layer_norm.weight", ff + ("norm", "scale"), (d,), (d,), False)]
        for name in ("k", "layer_norm", "o", "q", "r", "r_r_bias", "r_s_bias", "r_w_bias", "seg_embed", "v"):
            if name == "layer_norm":
                table += [TensorMapping(lp + "rel_attn.layer_norm.bias", attn + ("norm", "bias"), (d,), (d,), False),
                          TensorMapping(lp + "rel_attn.layer_norm.weight", attn + ("norm", "scale"), (d,), (d,),
                                        False)]
            elif name in ("k", "o", "q", "r", "v"):
                table.append(TensorMapping(lp + f"rel_attn.{name}", attn + (name, "kernel"), (d, n, hd), (d, n, hd),
                                           False))
            else:
                shape = (2, n, hd) if name == "seg_embed" else (n, hd)
                table.append(TensorMapping(lp + f"rel_attn.{name}", attn + (name,), shape, shape, False))
    table += [TensorMapping("transformer.mask_emb", ("mask_emb",), (1, 1, d), (d,), False),
              TensorMapping("transformer.word_embedding.weight", ("embed",), (v, d), (v, d), False)]
    return table
