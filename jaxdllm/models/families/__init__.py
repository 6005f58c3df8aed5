"""Model families: one module each (`llada`, `dream`, `qwen2_llama`, `qwen3`, `block_diffusion`, `sdar`,
`llada2`, `wedlm`) or one subpackage for a family with a model of its own (`diffusion_gemma`, `xlnet`, `bert`),
holding its model_types, presets, config.json reading and writing, tensor table, special ids, model,
parameter count and default sampler. Everything else dispatches through `FAMILIES`: a new family is one module and one
line here; `register` checks it against the protocol (`family.FAMILY_PROTOCOL`).
"""

from __future__ import annotations

from jaxdllm.errors import CheckpointError, ConfigError
from jaxdllm.models.config import ModelConfig, register_family_config, register_presets
from jaxdllm.models.families import (bert, block_diffusion, diffusion_gemma, dream, llada, llada2,
                                      qwen2_llama, qwen3, sdar, wedlm, xlnet)
from jaxdllm.models.families.family import Family, check_family
from jaxdllm.models.transformer import register_model


def _count_params(config: ModelConfig) -> tuple[int, int]:
    return tuple(family_of(config).param_counts(config))


def register(*families: Family) -> tuple[Family, ...]:
    """Check each family against the protocol (`check_family`: a `ConfigError` naming what it lacks),
    then make its presets, checkpoint format, config class and model class known. Returns them."""
    for family in families:
        check_family(family)
    for family in families:
        register_presets(family.presets, family.checkpoints)
        register_family_config(family.checkpoint_format, family.config_class, _count_params)
        register_model(family.config_class, family.model)
    return families


# In lookup order: a family that refines others (block diffusion: Qwen2 / Dream / Llama with `bd_size`,
# shifted; SDAR: Qwen2 / Qwen3 / Llama with `block_size` and `mask_token_id`, unshifted) comes before them.
FAMILIES: tuple[Family, ...] = register(
    llada.FAMILY,
    block_diffusion.FAMILY,
    sdar.FAMILY,
    dream.FAMILY,
    qwen2_llama.FAMILY,
    qwen3.FAMILY,
    wedlm.FAMILY,
    llada2.FAMILY,
    diffusion_gemma.FAMILY,
    xlnet.FAMILY,
    bert.FAMILY,
)

SUPPORTED_MODEL_TYPES = tuple(t for family in FAMILIES for t in family.model_types)


def family_for_hf(raw: dict, where: str = "config.json") -> Family:
    """The family whose checkpoints have the parsed config.json `raw`; `where` names the file in errors."""
    for family in FAMILIES:
        if family.reads_hf(raw):
            return family
    raise CheckpointError(f"{where}: unknown architecture model_type={raw.get('model_type')!r}; "
                          f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}")


def family_of(config: ModelConfig) -> Family:
    """The family `config` belongs to (by `checkpoint_format`, `model_type` and attention)."""
    for family in FAMILIES:
        if family.holds_config(config):
            return family
    raise ConfigError(f"no model family has checkpoint_format={config.checkpoint_format!r} with "
                      f"model_type={config.model_type!r} and attention={config.attention!r}; "
                      f"families: {', '.join(f.name for f in FAMILIES)}")


__all__ = ["FAMILIES", "SUPPORTED_MODEL_TYPES", "Family", "family_for_hf", "family_of", "register"]
