"""Tiny models for tests: one builder, by preset name, overrides and seed.

Building a model runs its initialisers op by op, and every fresh model is a fresh object for
`nnx.jit`; a test that only reads a model asks for `shared=True` and gets the one built earlier in
this run with the same arguments. A test that changes parameters (a train step, `nnx.update`,
editing `lm_head`) builds its own.
"""

from __future__ import annotations

import functools

from flax import nnx

from jaxdllm import ModelConfig, Transformer


def tiny_model(preset: str, seed: int = 0, head_scale: float | None = None, *, shared: bool = False,
               **overrides) -> Transformer:
    """A randomly initialised `Transformer` of model preset `preset` with config `overrides`,
    initialised from `nnx.Rngs(seed)`. `head_scale` multiplies the LM head: random weights give
    flat logits, a scaled head peaked ones (confident predictions, CE that differs per position).
    `shared=True` returns the model cached for these arguments (build it once per run; do not
    change it)."""
    if shared:
        return _cached(preset, seed, head_scale, tuple(sorted(overrides.items())))
    model = Transformer(ModelConfig.preset(preset, **overrides), rngs=nnx.Rngs(seed))
    if head_scale is not None:
        model.lm_head[...] = model.lm_head[...] * head_scale
    return model


@functools.cache
def _cached(preset: str, seed: int, head_scale: float | None, overrides: tuple) -> Transformer:
    return tiny_model(preset, seed, head_scale, **dict(overrides))


def two_layer_diffusiongemma() -> Transformer:
    """The tiny DiffusionGemma with one sliding and one full layer (shared: the registry contract
    tests build it once)."""
    import dataclasses

    gemma4 = dataclasses.replace(ModelConfig.preset("tiny-diffusiongemma").gemma4, layer_types=("sliding", "full"))
    return tiny_model("tiny-diffusiongemma", shared=True, num_layers=2, gemma4=gemma4)
