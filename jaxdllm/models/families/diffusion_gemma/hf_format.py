"""DiffusionGemma's checkpoints in transformers' layout (`models/diffusion_gemma/`, the published
reference): config.json reading and writing, and the tensor table.

config.json: the top level holds `model_type` "diffusion_gemma", `canvas_length` (-> `block_size`)
and `text_config` (the text model's keys, `hidden_size` etc.; the full layers' shape in
`per_layer_config` or `global_head_dim` / `num_global_key_value_heads`). A vision config is kept as
read; text-only models written here get a tiny one (transformers always builds a vision tower).

Tensors: text weights once, under `model.decoder.*`, plus the encoder's own layer scalars
`model.encoder.language_model.layers.{i}.layer_scalar`; the experts as `[E, 2M, D]` gate-up and
`[E, D, M]` down tensors; the head tied. Vision tensors (`VISION_PREFIXES`: `model.encoder.vision_tower.*`,
`model.encoder.embed_vision.*`) are skipped on import (text only).
"""

from __future__ import annotations

from jaxdllm.errors import CheckpointError
from jaxdllm.models.config import ExpertConfig
from jaxdllm.models.families.config_json import first_id, require
from jaxdllm.models.families.diffusion_gemma.gemma_config import (CANVAS, DiffusionGemmaConfig, Gemma4Layers,
                                                                   published_layer_types)
from jaxdllm.models.families.tensors import TensorMapping, swiglu

MODEL_TYPES = ("diffusion_gemma",)
VISION_PREFIXES = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")
_LAYER_TYPE = {"sliding_attention": "sliding", "full_attention": "full"}
# A vision tower small enough to build (transformers builds one for every DiffusionGemma config).
TINY_VISION = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=2, head_dim=8)


def _full_layer_shape(text: dict, types: tuple[str, ...], where: str) -> tuple[int, int]:
    """`(kv heads, head dim)` of the full layers: `per_layer_config` (as transformers writes it) or
    `num_global_key_value_heads` / `global_head_dim`."""
    kv, hd = text.get("num_key_value_heads"), text.get("head_dim")
    per_layer = text.get("per_layer_config")
    if per_layer:
        shapes = {(v.get("num_key_value_heads", kv), v.get("head_dim", hd))
                  for k, v in per_layer.items() if types[int(k)] == "full"}
        if len(shapes) > 1:
            raise CheckpointError(f"{where}: full layers of different shapes {sorted(shapes)} are not supported")
        if shapes:
            return shapes.pop()
    global_kv = text.get("num_global_key_value_heads")
    return (global_kv if global_kv is not None and text.get("attention_k_eq_v", True) else kv,
            text.get("global_head_dim", 512))


def config_from_hf(raw: dict, where: str) -> DiffusionGemmaConfig:
    """DiffusionGemma (`configuration_diffusion_gemma.py`); absent keys take that file's defaults."""
    text = raw.get("text_config") or {}
    require(text, ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"), where + " text_config")
    if text.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise CheckpointError(f"{where}: hidden_activation={text['hidden_activation']!r} is not supported "
                              "(Gemma 4: gelu_pytorch_tanh)")
    if text.get("use_bidirectional_attention") == "all":
        raise CheckpointError(f"{where}: use_bidirectional_attention='all' (a bidirectional encoder) is not "
                              "supported; DiffusionGemma's encoder is causal")
    if text.get("attention_bias"):
        raise CheckpointError(f"{where}: attention_bias=true is not supported")
    if raw.get("tie_word_embeddings") is False or text.get("tie_word_embeddings") is False:
        raise CheckpointError(f"{where}: untied embeddings are not supported (DiffusionGemma ties its head, and "
                              "its encoder and denoiser share one weight set)")
    n = text["num_hidden_layers"]
    types = tuple(_LAYER_TYPE[t] for t in text["layer_types"]) if text.get("layer_types") else None
    types = types or published_layer_types(n)
    if types[-1] != "full":  # transformers forces it, with a warning
        types = (*types[:-1], "full")
    rope = text.get("rope_parameters") or {}
    sliding_rope = rope.get("sliding_attention") or {}
    full_rope = rope.get("full_attention") or {}
    if full_rope.get("rope_type", "proportional") != "proportional" or sliding_rope.get("rope_type",
                                                                                      "default") != "default":
        raise CheckpointError(f"{where}: rope types {full_rope.get('rope_type')!r} / {sliding_rope.get('rope_type')!r} "
                              "are not supported (Gemma 4: proportional on full layers, default on sliding ones)")
    full_kv, full_hd = _full_layer_shape(text, types, where)
    experts = None
    if text.get("num_experts"):
        require(text, ("top_k_experts", "moe_intermediate_size"), where + " text_config")
        experts = ExpertConfig(num_experts=text["num_experts"], experts_per_token=text["top_k_experts"],
                               expert_dim=text["moe_intermediate_size"])
    eos = text.get("eos_token_id", 1)
    eot = eos[1] if isinstance(eos, list) and len(eos) > 1 else None
    heads = text["num_attention_heads"]
    return DiffusionGemmaConfig(
        vocab_size=text["vocab_size"], embed_dim=text["hidden_size"], num_layers=n, num_heads=heads,
        num_kv_heads=text.get("num_key_value_heads", 4), head_dim=text.get("head_dim", 256),
        mlp_dim=text.get("intermediate_size", 9216), attention="bidirectional",
        block_size=int(raw.get("canvas_length") or CANVAS), tie_embeddings=True,
        rope_theta=float(sliding_rope.get("rope_theta", 10000.0)), norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        max_position=int(text.get("max_position_embeddings", 131072)), eos_token_id=first_id(eos),
        eot_token_id=eot, pad_token_id=text.get("pad_token_id", 0), bos_token_id=text.get("bos_token_id", 2),
        checkpoint_format="diffusion_gemma", model_type="diffusion_gemma", experts=experts,
        gemma4=Gemma4Layers(layer_types=types, sliding_window=int(text.get("sliding_window", 512)),
                            full_head_dim=full_hd, full_kv_heads=full_kv,
                            full_rope_theta=float(full_rope.get("rope_theta", 1_000_000.0)),
                            full_rotary_fraction=float(full_rope.get("partial_rotary_factor", 0.25)),
                            final_softcap=text.get("final_logit_softcapping", 30.0)),
        source_config=raw)


def config_to_hf(c: DiffusionGemmaConfig, out: dict) -> None:
    """DiffusionGemma's config.json into `out`: the text model under `text_config` (the special ids
    there too), `canvas_length`, and a vision config (a tiny one when the source had none)."""
    g = c.gemma4
    text = dict(out.get("text_config") or {})
    for stale in ("global_head_dim", "num_global_key_value_heads"):
        text.pop(stale, None)
    text.update(
        model_type="diffusion_gemma_text", vocab_size=c.vocab_size, hidden_size=c.embed_dim,
        intermediate_size=c.mlp_dim, num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=c.norm_eps, max_position_embeddings=c.max_position, tie_word_embeddings=True,
        attention_bias=False, sliding_window=g.sliding_window,
        layer_types=[f"{t}_attention" for t in g.layer_types],
        per_layer_config={str(i): {"head_dim": g.full_head_dim, "num_key_value_heads": g.full_kv_heads}
                          for i, t in enumerate(g.layer_types) if t == "full"},
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": c.rope_theta},
                         "full_attention": {"rope_type": "proportional", "rope_theta": g.full_rope_theta,
                                            "partial_rotary_factor": g.full_rotary_fraction}},
        num_experts=c.experts.num_experts if c.experts else None,
        top_k_experts=c.experts.experts_per_token if c.experts else None,
        moe_intermediate_size=c.experts.expert_dim if c.experts else None)
    if g.final_softcap != 30.0:
        text["final_logit_softcapping"] = g.final_softcap
    for key in ("eos_token_id", "pad_token_id", "bos_token_id"):
        value = getattr(c, key)
        if value is not None and first_id(text.get(key)) != value:
            text[key] = value
    out.update(model_type="diffusion_gemma", text_config=text, canvas_length=c.block_size, tie_word_embeddings=True)
    out.setdefault("vision_config", dict(TINY_VISION))
    out.setdefault("architectures", ["DiffusionGemmaForBlockDiffusion"])


_NORMS = (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "post_attn_norm"),
          ("pre_feedforward_layernorm", "mlp_norm"), ("post_feedforward_layernorm_1", "post_mlp_norm"),
          ("pre_feedforward_layernorm_2", "experts_norm"), ("post_feedforward_layernorm_2", "post_experts_norm"),
          ("post_feedforward_layernorm", "post_ff_norm"))


def tensor_table(c: DiffusionGemmaConfig) -> list[TensorMapping]:
    """DiffusionGemma (`modeling_diffusion_gemma.py`) names, text weights only."""
    d, h, v, m = c.embed_dim, c.num_heads, c.vocab_size, c.mlp_dim
    table = [TensorMapping("model.decoder.embed_tokens.weight", ("embed",), (v, d), (v, d), False)]
    for i in range(c.num_layers):
        lp, at = f"model.decoder.layers.{i}.", ("layers", i)
        kv, hd = c.kv_shape(i)
        table.append(TensorMapping(lp + "layer_scalar", at + ("layer_scalar",), (1,), (1,), False))
        projections = ("q", "k", "v") if c.gemma4.layer_types[i] == "sliding" else ("q", "k")
        for ours in projections:
            n = h if ours == "q" else kv
            table.append(TensorMapping(lp + f"self_attn.{ours}_proj.weight", at + ("attn", ours, "kernel"),
                                       (n * hd, d), (d, n, hd), True))
        table.append(TensorMapping(lp + "self_attn.o_proj.weight", at + ("attn", "o", "kernel"), (d, h * hd),
                                   (h, hd, d), True))
        table += [TensorMapping(lp + f"self_attn.{ours}.weight", at + ("attn", ours, "scale"), (hd,), (hd,), False)
                  for ours in ("q_norm", "k_norm")]
        table += swiglu(lp + "mlp.", at + ("mlp",), d, m)
        if c.experts is not None:
            e, em = c.experts.num_experts, c.experts.expert_dim
            ex = at + ("experts",)
            table += [TensorMapping(lp + "router.proj.weight", ex + ("router",), (e, d), (d, e), True),
                      TensorMapping(lp + "router.scale", ex + ("router_scale",), (d,), (d,), False),
                      TensorMapping(lp + "router.per_expert_scale", ex + ("per_expert_scale",), (e,), (e,), False),
                      TensorMapping(lp + "experts.gate_up_proj", ex + ("gate", "kernel"), (e, 2 * em, d), (e, d, em),
                                    True, rows=(0, em), axis=1),
                      TensorMapping(lp + "experts.gate_up_proj", ex + ("up", "kernel"), (e, 2 * em, d), (e, d, em),
                                    True, rows=(em, 2 * em), axis=1),
                      TensorMapping(lp + "experts.down_proj", ex + ("down", "kernel"), (e, d, em), (e, em, d), True)]
        norms = _NORMS if c.experts is not None else [n for n in _NORMS if not n[1].startswith(("experts",
                                                                                                 "post_experts"))]
        table += [TensorMapping(lp + f"{hf}.weight", at + (ours, "scale"), (d,), (d,), False) for hf, ours in norms]
    table.append(TensorMapping("model.decoder.norm.weight", ("final_norm", "scale"), (d,), (d,), False))
    sc = "model.decoder.self_conditioning."
    table.append(TensorMapping(sc + "pre_norm.weight", ("self_conditioning", "pre_norm", "scale"), (d,), (d,), False))
    table += swiglu(sc, ("self_conditioning", "mlp"), d, m)
    table += [TensorMapping(f"model.encoder.language_model.layers.{i}.layer_scalar",
                            ("layers", i, "encoder_layer_scalar"), (1,), (1,), False) for i in range(c.num_layers)]
    return table
