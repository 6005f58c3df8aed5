"""A checkpoint as a user starts from it: model, tokenizer and the checkpoint's own sampler
settings in one call, by folder or by shipped name.

    model, tok, defaults = jaxdllm.load("tasks-llada-small")
    batch = tok(["reverse 4821=", "sort 93715="])
    out = jaxdllm.generate(model, batch.ids, defaults, attention_mask=batch.mask)
    tok.answers(out)                                           # ["1284", "13579"]

`sampler_defaults` (with `checkpoint_settings`) is the one place where a checkpoint's sampler
defaults are decided; the command line (`generate`, `eval --preset`, `distill`) and the lm-eval
model use it too.

Every function here takes a folder, a shipped name or a `Checkpoint`
(`jaxdllm.checkpoint.folder`): a caller that opens the checkpoint once and hands the value on
finds the folder once and parses its config.json once.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from jaxdllm import sharding as shd
from jaxdllm.checkpoint.folder import Checkpoint, checkpoint_of
from jaxdllm.checkpoint.hf_io import from_pretrained
from jaxdllm.decoding.config import SamplerConfig, settings_for_preset
from jaxdllm.decoding.policies.base import Policy
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families import family_of
from jaxdllm.models.transformer import Transformer
from jaxdllm.tokenizer import Tokenizer

CheckpointLike = str | os.PathLike | Checkpoint


class Pretrained(NamedTuple):
    """What `load` returns; unpacks as `model, tokenizer, defaults`."""

    model: Transformer
    tokenizer: Tokenizer
    defaults: SamplerConfig  # the checkpoint's sampler settings (see `sampler_defaults`)


def default_preset(model_config: ModelConfig) -> str:
    """The preset a checkpoint decodes with unless told otherwise, as its family says
    (`Family.default_preset`): `jacobi` (greedy, exact) for a causal model, `llada` (one token per
    step, LLaDA's published sampler) for the diffusion models, a family's own sampler where it has one."""
    return family_of(model_config).default_preset(model_config)


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


def checkpoint_settings(path: CheckpointLike, preset: str | None = None) -> tuple[str, dict]:
    """`(preset, settings)` behind `sampler_defaults`: the preset name and the `SamplerConfig`
    keywords the checkpoint sets (its `jaxdllm_sampler.json`, and a `gen_length` that fits).
    `path`: checkpoint folder, shipped name or `Checkpoint`."""
    checkpoint = Checkpoint.open(path)
    model_config = checkpoint.config
    family = family_of(model_config)
    preset = preset or family.default_preset(model_config)
    # what the family reads from the checkpoint's own files (e.g. a generation_config.json), under
    # what jaxdllm_sampler.json sets
    settings = {**family.sampler_settings(checkpoint.folder, model_config, preset), **checkpoint.sampler_defaults}
    # under both, what the preset's policy reads from the checkpoint's tokenizer (Multiverse's tag ids)
    policy = SamplerConfig.preset(preset).policy
    if (type(policy).tokenizer_settings is not Policy.tokenizer_settings
            and (checkpoint.folder / "tokenizer.json").is_file()):
        settings = {**policy.tokenizer_settings(Tokenizer.from_pretrained(checkpoint)), **settings}
    # a setting of another policy (the checkpoint's Jacobi `window` under `--preset lookahead`) is left out
    return preset, _fitted(preset, model_config, settings_for_preset(preset, settings))


def _keeps_block(model_config: ModelConfig) -> bool:
    """Whether a new `gen_length` keeps the block length: the model attends block-causally (LLaDA2,
    block diffusion) or its family decodes in blocks of the model's own `block_size` only
    (`Family.fixed_block`: a canvas the model fixes)."""
    return model_config.attention == "block_causal" or family_of(model_config).fixed_block


def sampler_defaults(path: CheckpointLike, preset: str | None = None, **overrides: Any) -> SamplerConfig:
    """The sampler settings a checkpoint decodes with, as a `SamplerConfig`.

    In order: `preset` (default `default_preset`: `jacobi` for a causal model, a family's own
    sampler where it has one, else `llada`); what the family reads for that preset from the
    checkpoint's own files (`Family.sampler_settings`, e.g. a `generation_config.json`); the
    checkpoint's `jaxdllm_sampler.json` (the settings its card was measured with, e.g. 16 tokens
    for a 64-position model); a `gen_length` that fits `max_position` when the file names none;
    then `overrides`. A `gen_length` in `overrides` rescales the block length and steps that
    come before it (`SamplerConfig.resized`): a one-block checkpoint setting stays one block; a
    block-causal model (it decodes any `gen_length` in whole blocks) and a family's fixed canvas
    (`Family.fixed_block`) keep their block length.

    Args:
      path: checkpoint folder, shipped name or `Checkpoint` (`jaxdllm.checkpoint.folder`).
      preset: a name from `jaxdllm.decoding.SAMPLER_PRESETS`.
      **overrides: any `SamplerConfig` keyword.
    """
    checkpoint = Checkpoint.open(path)
    preset, settings = checkpoint_settings(checkpoint, preset)
    base = SamplerConfig.preset(preset, **settings)
    if "gen_length" in overrides:
        if "block_length" not in overrides and _keeps_block(checkpoint.config):
            # A block-causal model decodes any gen_length in its blocks (to the end of the block that
            # holds the last position, as the published loops): the block stays. So does a family's
            # fixed canvas (`Family.fixed_block`: a gen_length that is no multiple of it is an error).
            overrides = {**overrides, "block_length": base.block_length}
        return base.resized(**overrides)
    return base.replace(**overrides) if overrides else base


def policy_params(path: CheckpointLike, config: SamplerConfig, **load_options):
    """The parameters `config`'s policy reads, found beside the checkpoint: for `learn2pd`, its
    filter (`learn2pd_filter.safetensors`, written by `jaxdllm distill learn2pd`); for `medusa` and
    `bpd`, the heads; for `spec_diffusion` and `apd`, the second model (the one the policy's
    `drafter` / `verifier` names, else the checkpoint's `companions.json`), loaded after its
    tokenizer is checked against the checkpoint's. None for a policy without parameters of its own.
    Pass it as `generate(..., policy_params=...)`.

    Args:
      path: checkpoint folder, shipped name or `Checkpoint` (a folder of side files alone, without
        a config.json, works too).
      config: the `SamplerConfig` that will decode (its block length must match the filter's).
      **load_options: for a second model, `from_pretrained`'s options (`mesh=`, `dtype=`, ...).
    """
    if not config.policy.needs_params:
        return None
    checkpoint = checkpoint_of(path)
    # the model itself first: a policy that cannot decode it says so before asking for its second model
    if checkpoint.has_config:
        config.canvas.check_model(checkpoint.config, config)
    # the policy reads its side files (heads, filter, companions.json) through the Checkpoint, which is path-like
    if load_options:
        return config.policy.load_params(checkpoint, config, **load_options)
    return config.policy.load_params(checkpoint, config)


def companions(path: CheckpointLike, config: SamplerConfig, **load_options) -> dict:
    """`{role: model}`: the second model `config`'s policy runs (`Policy.companion`: SpecDiff's
    `drafter`, APD's `verifier`), loaded as `policy_params` loads it; {} for a policy without one.
    Pass it as `generate(..., companions=...)`."""
    role = config.policy.companion
    return {role: policy_params(path, config, **load_options)} if role else {}


def cache_note(path: CheckpointLike, config: SamplerConfig) -> str | None:
    """What the checkpoint's card measured for `config`'s cache, when it flags that cache
    (`cache_notes` in `jaxdllm_sampler.json`; e.g. approximate caches that lose accuracy on a
    short one-block canvas); None otherwise, and None for a cache refreshed every step (exact)."""
    if getattr(config.cache, "refresh_every_step", False):
        return None
    return checkpoint_of(path).cache_notes.get(config.cache.name)


def load(path: CheckpointLike, *, dtype: str | None = None, mesh=None, rules=shd.DEFAULT_RULES,
         **config_overrides: Any) -> Pretrained:
    """Model, tokenizer and sampler defaults of one checkpoint.

    Args:
      path: a checkpoint folder (Hugging Face layout) or a shipped name (`tasks-llada-small`,
        `tasks-llada-small-dparallel`, `tasks-qwen2-small`, `tasks-qwen2-small-jf`), from any
        working folder, or a `Checkpoint`.
      dtype, mesh, rules, **config_overrides: as in `jaxdllm.from_pretrained`.

    Returns:
      `Pretrained(model, tokenizer, defaults)`: the `Transformer`; its `Tokenizer`, whose
      `answers` stop at the model's EOS and end-of-turn tokens; the checkpoint's `SamplerConfig`
      (`sampler_defaults`). `defaults.replace(policy="threshold", threshold=0.9)` changes it.
    """
    checkpoint = Checkpoint.open(path)  # found once, config.json parsed once
    defaults = sampler_defaults(checkpoint)  # bad settings fail before the weights are read
    model = from_pretrained(checkpoint, dtype=dtype, mesh=mesh, rules=rules, **config_overrides)
    tokenizer = Tokenizer.from_pretrained(checkpoint)
    ends = (model.config.eos_token_id, model.config.eot_token_id, *(getattr(defaults.policy, "stop_ids", None) or ()))
    tokenizer.stop_ids = tuple(dict.fromkeys([*tokenizer.stop_ids, *(i for i in ends if i is not None)]))
    return Pretrained(model, tokenizer, defaults)


__all__ = ["Pretrained", "cache_note", "checkpoint_settings", "default_preset", "load", "policy_params",
           "sampler_defaults"]
