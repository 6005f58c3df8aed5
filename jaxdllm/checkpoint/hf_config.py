"""config.json files: reading one from a checkpoint folder, and config.json <-> `ModelConfig`
through the model families (`jaxdllm.models.families`: each family reads and writes its own keys).
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxdllm.errors import CheckpointError
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families import family_for_hf, family_of
from jaxdllm.models.families.config_json import SPECIAL_ID_KEYS, checkpoint_dtype, first_id


def require_checkpoint_folder(directory: str | Path, what: str = "checkpoint directory") -> Path:
    """`directory` if it is an existing folder; else a `CheckpointError` naming `what` (e.g.
    "[model] init_from") and the shipped checkpoints that would load by name."""
    directory = Path(directory)
    if directory.is_file():
        raise CheckpointError(f"{what} {directory} is a file; a checkpoint is a folder holding config.json and "
                              "*.safetensors")
    if not directory.is_dir():
        from jaxdllm.shipped import shipped_hint

        raise CheckpointError(f"{what} {directory} does not exist ({shipped_hint()})")
    return directory


def read_config_json(directory: Path) -> dict:
    """The parsed `directory/config.json`; errors name the file."""
    file = require_checkpoint_folder(directory) / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{file} is missing: a Hugging Face checkpoint directory needs config.json")
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {file}: {e}") from e


def config_from_hf(raw: dict, where: str = "config.json") -> ModelConfig:
    """A `ModelConfig` from a parsed config.json, read by the family its `model_type` names;
    `where` names the file in errors."""
    return family_for_hf(raw, where).config_from_hf(raw, where)


def config_to_hf(config: ModelConfig, dtype: str | None = None) -> dict:
    """config.json contents for `config`, written by its family, keeping the keys of its source config;
    `dtype`: the weights' storage dtype, written as `torch_dtype` (or `dtype`, where the source used
    that key); default: the source's, else float32."""
    out = dict(config.source_config or {})
    dtype_key = "dtype" if "dtype" in out else "torch_dtype"
    family = family_of(config)
    family.config_to_hf(config, out)
    for key in () if family.writes_special_ids else SPECIAL_ID_KEYS:
        value = getattr(config, key)
        if value is not None and first_id(out.get(key)) != value:
            out[key] = value
    out[dtype_key] = dtype or checkpoint_dtype(out)
    return out
