"""How a DiffusionGemma checkpoint decodes by default: its own sampler (`diffusiongemma`, the
uniform-noise canvas) at the settings its `generation_config.json` publishes, on canvases of the
model's `canvas_length`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxdllm.errors import CheckpointError
from jaxdllm.models.families.diffusion_gemma.gemma_config import DiffusionGemmaConfig

PRESET = "diffusiongemma"
# The published generation config stops at any of these (eos, end of turn, and 50).
STOP_IDS = (1, 106, 50)
# The preset's length when the checkpoint names none (`SamplerConfig.preset("diffusiongemma").gen_length`).
DEFAULT_LENGTH = 256
# generation_config.json keys that are `diffusiongemma` policy settings of the same name.
_GENERATION_KEYS = ("max_denoising_steps", "t_min", "t_max", "stability_threshold", "confidence_threshold")


def default_preset(config: DiffusionGemmaConfig) -> str:
    """`diffusiongemma`: its published sampler."""
    return PRESET


def generation_settings(directory: Path, config: DiffusionGemmaConfig, preset: str) -> dict:
    """For the `diffusiongemma` preset: the sampler settings the checkpoint's `generation_config.json`
    publishes (steps, temperatures, stopping thresholds, entropy bound, stop ids, `max_new_tokens`
    rounded up to whole canvases) and its canvas (`canvas_length`) as the block length. Other
    presets: none."""
    if preset != PRESET:
        return {}
    settings: dict[str, Any] = {"block_length": config.block_size}
    file = directory / "generation_config.json"
    try:
        raw = json.loads(file.read_text()) if file.is_file() else {}
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: not valid JSON ({e}); fix or remove the file") from None
    settings.update({key: raw[key] for key in _GENERATION_KEYS if raw.get(key) is not None})
    bound = (raw.get("sampler_config") or {}).get("entropy_bound")
    if bound is not None:
        settings["entropy_bound"] = float(bound)
    eos = raw.get("eos_token_id")
    if eos is not None:
        settings["stop_ids"] = tuple(eos) if isinstance(eos, list) else (eos,)
    length = raw.get("max_new_tokens") or DEFAULT_LENGTH
    canvas = config.block_size
    settings["gen_length"] = max(canvas, -(-int(length) // canvas) * canvas)  # whole canvases
    return settings
