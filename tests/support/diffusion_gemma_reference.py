"""Tiny random DiffusionGemma checkpoints written by transformers' own `DiffusionGemmaForBlockDiffusion`
(`save_pretrained`), and that model's forward and `generate` as the reference.

The released code initialises every norm, layer scalar and router scale to 1; here they are drawn
around 1 (and the encoder's layer scalars differ from the decoder's), so a swapped or missing one
shows in the logits.
"""

from __future__ import annotations

from pathlib import Path

from support.optional import torch, transformers

VISION = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=2, head_dim=8)
TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, sliding_window=8,
            max_position_embeddings=512, num_experts=8, top_k_experts=2, moe_intermediate_size=24,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])


def make_diffusion_gemma(path: Path | None = None, *, seed: int = 0, canvas: int = 8, head_scale: float = 1.0,
                         eos_scale: float = 1.0, branch_scale: float = 1.0,
                         **text) -> transformers.DiffusionGemmaForBlockDiffusion:
    """A tiny random `DiffusionGemmaForBlockDiffusion` (fp32, eval mode) with `TEXT` overridden by
    `text`; written to `path` with `save_pretrained` when given. `head_scale` scales the embedding
    (the tied head): confident predictions, so the entropy bound accepts several tokens a step;
    `eos_scale` scales EOS's row (id 1) once more, so some canvases predict it; `branch_scale` scales
    what each layer adds to the residual stream (attention, MLP and expert outputs): small values
    leave each position's prediction close to its own input token, so repeated denoising settles
    (the adaptive stop's stability)."""
    torch.manual_seed(seed)
    config = transformers.DiffusionGemmaConfig(text_config={**TEXT, **text}, vision_config=VISION, canvas_length=canvas)
    model = transformers.DiffusionGemmaForBlockDiffusion(config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vision" in name:
                continue
            if name.endswith(("norm.weight", "router.scale", "per_expert_scale")):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            if "layers" in name and name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                p.mul_(branch_scale)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(1 + 0.3 * torch.randn(b.shape, generator=g))
        model.model.decoder.embed_tokens.weight.mul_(head_scale)
        model.model.decoder.embed_tokens.weight[1].mul_(eos_scale)
    if path is not None:
        model.save_pretrained(path)
    return model


def encoder_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """`[B, L, V]` softcapped logits of the causal encoder over `ids` (the encoder's causal loss reads them)."""
    with torch.no_grad():
        hidden = model.model.encoder(input_ids=ids).last_hidden_state
        logits = model.lm_head(hidden).float()
        cap = model.config.text_config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap


def denoiser_logits(model, prompt: torch.Tensor, canvases: list[torch.Tensor],
                    self_conditioning: torch.Tensor | None = None) -> torch.Tensor:
    """`[B, C, V]` logits of the denoiser over the last of `canvases` after the prompt and every
    earlier canvas were encoded into the cache (each canvas `[B, C]`)."""
    with torch.no_grad():
        cache = transformers.DynamicCache(config=model.config.get_text_config(decoder=True))
        model.model.encoder(input_ids=prompt, cache=cache)
        for earlier in canvases[:-1]:
            start = cache.get_seq_length()
            positions = torch.arange(start, start + earlier.shape[1])[None]
            model.model.encoder(input_ids=earlier, cache=cache, position_ids=positions)
        return model(decoder_input_ids=canvases[-1], cache=cache, self_conditioning_logits=self_conditioning).logits
