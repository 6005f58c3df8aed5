"""A checkpoint as a user starts from it: model, tokenizer and the checkpoint's own sampler
settings in one call, by folder or by shipped name.

    model, tok, defaults = jaxdllm.load("tasks-llada-small")
    batch = tok(["reverse 4821=", "sort 93715="])
    out = jaxdllm.generate(model, batch.ids, defaults, attention_mask=batch.mask)
    tok.answers(out)                                           # ["1284", "13579"]

`sampler_defaults` (with `checkpoint_settings`) is the one place where a checkpoint's sampler
defaults are decided; the command line (`generate`, `eval --preset`, `distill`) and the lm-eval
model use it too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from jaxdllm import sharding as shd
from jaxdllm.checkpoint.hf_config import config_from_hf, read_config_json
from jaxdllm.checkpoint.hf_io import from_pretrained, read_cache_notes, read_sampler_defaults
from jaxdllm.decoding.config import SamplerConfig
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.transformer import Transformer
from jaxdllm.shipped import checkpoint_dir
from jaxdllm.tokenizer import Tokenizer


class Pretrained(NamedTuple):
    """What `load` returns; unpacks as `model, tokenizer, defaults`."""

    model: Transformer
    tokenizer: Tokenizer
    defaults: SamplerConfig  # the checkpoint's sampler settings (see `sampler_defaults`)


def default_preset(model_config: ModelConfig) -> str:
    """The preset a checkpoint decodes with unless told otherwise: `jacobi` (greedy, exact) for a
    causal model, `diffusiongemma` (its published sampler) for DiffusionGemma, `llada` (one token per
    step, LLaDA's published sampler) for the other diffusion models."""
    if model_config.gemma4 is not None:
        return "diffusiongemma"
    return "jacobi" if model_config.attention == "causal" else "llada"


# DiffusionGemma's generation_config.json keys that are `diffusiongemma` policy settings of the same name.
_GENERATION_KEYS = ("max_denoising_steps", "t_min", "t_max", "stability_threshold", "confidence_threshold")


def diffusiongemma_settings(directory: Path, model_config: ModelConfig) -> dict:
    """The sampler settings a DiffusionGemma checkpoint's `generation_config.json` publishes (steps,
    temperatures, stopping thresholds, entropy bound, stop ids, `max_new_tokens`), and its canvas
    (`canvas_length`) as the block length."""
    settings: dict[str, Any] = {"block_length": model_config.block_size}
    file = directory / "generation_config.json"
    raw = json.loads(file.read_text()) if file.is_file() else {}
    settings.update({key: raw[key] for key in _GENERATION_KEYS if raw.get(key) is not None})
    bound = (raw.get("sampler_config") or {}).get("entropy_bound")
    if bound is not None:
        settings["entropy_bound"] = float(bound)
    eos = raw.get("eos_token_id")
    if eos is not None:
        settings["stop_ids"] = tuple(eos) if isinstance(eos, list) else (eos,)
    length = raw.get("max_new_tokens") or SamplerConfig.preset("diffusiongemma").gen_length
    canvas = model_config.block_size
    settings["gen_length"] = max(canvas, -(-int(length) // canvas) * canvas)  # whole canvases
    return settings


def _fitted(preset: str, model_config: ModelConfig, settings: dict) -> dict:
    """`settings` with a `gen_length` that leaves room for a prompt, for a checkpoint that names
    none and is too short for the preset's (the published 256 tokens in a 64-position model):
    the largest power of two up to half of `max_position`."""
    if "gen_length" in settings:
        return settings
    base = SamplerConfig.preset(preset)
    if base.gen_length + base.prompt_bucket <= model_config.max_position:
        return settings
    return {**settings, "gen_length": 1 << (max(model_config.max_position // 2, 1).bit_length() - 1)}


def checkpoint_settings(path: str | os.PathLike, preset: str | None = None) -> tuple[str, dict]:
    """`(preset, settings)` behind `sampler_defaults`: the preset name and the `SamplerConfig`
    keywords the checkpoint sets (its `jaxdllm_sampler.json`, and a `gen_length` that fits)."""
    directory = checkpoint_dir(path)
    model_config = config_from_hf(read_config_json(directory), where=str(directory / "config.json"))
    preset = preset or default_preset(model_config)
    settings = read_sampler_defaults(directory)
    if preset == "diffusiongemma":  # its generation_config.json, under what jaxdllm_sampler.json sets
        settings = {**diffusiongemma_settings(directory, model_config), **settings}
    return preset, _fitted(preset, model_config, settings)


def sampler_defaults(path: str | os.PathLike, preset: str | None = None, **overrides: Any) -> SamplerConfig:
    """The sampler settings a checkpoint decodes with, as a `SamplerConfig`.

    In order: `preset` (default `default_preset`: `jacobi` for a causal model, `diffusiongemma` for
    DiffusionGemma, else `llada`); for DiffusionGemma, its `generation_config.json` and canvas; the
    checkpoint's `jaxdllm_sampler.json` (the settings its card was measured with, e.g. 16 tokens
    for a 64-position model); a `gen_length` that fits `max_position` when the file names none;
    then `overrides`. A `gen_length` in `overrides` rescales the block length and steps that
    come before it (`SamplerConfig.resized`): a one-block checkpoint setting stays one block.

    Args:
      path: checkpoint folder or shipped name.
      preset: a name from `jaxdllm.decoding.SAMPLER_PRESETS`.
      **overrides: any `SamplerConfig` keyword.
    """
    preset, settings = checkpoint_settings(path, preset)
    base = SamplerConfig.preset(preset, **settings)
    if "gen_length" in overrides:
        return base.resized(**overrides)
    return base.replace(**overrides) if overrides else base


def policy_params(path: str | os.PathLike, config: SamplerConfig, **load_options):
    """The parameters `config`'s policy reads, found beside the checkpoint: for `learn2pd`, its
    filter (`learn2pd_filter.safetensors`, written by `jaxdllm distill learn2pd`); for `medusa` and
    `bpd`, the heads; for `spec_diffusion` and `apd`, the second model (the one the policy's
    `drafter` / `verifier` names, else the checkpoint's `companions.json`), loaded after its
    tokenizer is checked against the checkpoint's. None for a policy without parameters of its own.
    Pass it as `generate(..., policy_params=...)`.

    Args:
      path: checkpoint folder or shipped name.
      config: the `SamplerConfig` that will decode (its block length must match the filter's).
      **load_options: for a second model, `from_pretrained`'s options (`mesh=`, `dtype=`, ...).
    """
    if not config.policy.needs_params:
        return None
    if load_options:
        return config.policy.load_params(checkpoint_dir(path), config, **load_options)
    return config.policy.load_params(checkpoint_dir(path), config)


def cache_note(path: str | os.PathLike, config: SamplerConfig) -> str | None:
    """What the checkpoint's card measured for `config`'s cache, when it flags that cache
    (`cache_notes` in `jaxdllm_sampler.json`; e.g. approximate caches that lose accuracy on a
    short one-block canvas); None otherwise, and None for a cache refreshed every step (exact)."""
    if getattr(config.cache, "refresh_every_step", False):
        return None
    return read_cache_notes(checkpoint_dir(path)).get(config.cache.name)


def load(path: str | os.PathLike, *, dtype: str | None = None, mesh=None, rules=shd.DEFAULT_RULES,
         **config_overrides: Any) -> Pretrained:
    """Model, tokenizer and sampler defaults of one checkpoint.

    Args:
      path: a checkpoint folder (Hugging Face layout) or a shipped name (`tasks-llada-small`,
        `tasks-llada-small-dparallel`, `tasks-qwen2-small`, `tasks-qwen2-small-jf`), from any
        working folder.
      dtype, mesh, rules, **config_overrides: as in `jaxdllm.from_pretrained`.

    Returns:
      `Pretrained(model, tokenizer, defaults)`: the `Transformer`; its `Tokenizer`, whose
      `answers` stop at the model's EOS and end-of-turn tokens; the checkpoint's `SamplerConfig`
      (`sampler_defaults`). `defaults.replace(policy="threshold", threshold=0.9)` changes it.
    """
    directory = checkpoint_dir(path)
    defaults = sampler_defaults(directory)  # bad settings fail before the weights are read
    model = from_pretrained(directory, dtype=dtype, mesh=mesh, rules=rules, **config_overrides)
    tokenizer = Tokenizer.from_pretrained(directory)
    ends = (model.config.eos_token_id, model.config.eot_token_id, *(getattr(defaults.policy, "stop_ids", None) or ()))
    tokenizer.stop_ids = tuple(dict.fromkeys([*tokenizer.stop_ids, *(i for i in ends if i is not None)]))
    return Pretrained(model, tokenizer, defaults)


__all__ = ["Pretrained", "cache_note", "checkpoint_settings", "default_preset", "load", "policy_params",
           "sampler_defaults"]
