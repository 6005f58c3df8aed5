"""A checkpoint folder read once: `Checkpoint` holds the folder, its parsed `config.json` and the
side files jaxdllm keeps beside the weights, and every loader takes it in place of a path.

    checkpoint = Checkpoint.open("tasks-qwen2-small")   # the folder found, config.json parsed
    checkpoint.config                                   # ModelConfig
    checkpoint.sampler_defaults                         # jaxdllm_sampler.json's SamplerConfig keywords
    checkpoint.companions                               # companions.json: {policy: second model's folder}
    model = jaxdllm.from_pretrained(checkpoint)         # no second look at the folder or config.json
    defaults = jaxdllm.sampler_defaults(checkpoint)

Each file is read at most once, when first asked for; a path still works wherever a `Checkpoint`
does (the loaders open it themselves). A `Checkpoint` is also path-like (`os.fspath`, `Path(...)`,
`checkpoint / "tokenizer.json"`), so code written for folders keeps working.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from jaxdllm.checkpoint.hf_config import config_from_hf, read_config_json
from jaxdllm.errors import CheckpointError, ConfigError
from jaxdllm.models.config import ModelConfig
from jaxdllm.shipped import checkpoint_dir

CONFIG_FILE = "config.json"
# Sampler defaults that suit the model (e.g. a short gen_length for a model with a short
# max_position); `jaxdllm generate` reads them before the preset's.
SAMPLER_DEFAULTS_FILE = "jaxdllm_sampler.json"
CACHE_NOTES_KEY = "cache_notes"  # in that file: cache name -> what the card measured with that cache
# policy name -> the second model it decodes with (a folder or shipped name). Not copied on export:
# a trained or adapted model chooses its own partners.
COMPANIONS_FILE = "companions.json"
# A policy's own parameters saved beside the model (`jaxdllm.checkpoint.side_files`): Medusa's heads
# (`jaxdllm.decoding.policies.medusa.HEADS_FILE`) and Learn2PD's filter (`...learn2pd.FILTER_FILE`).
HEADS_FILE = "medusa_heads.safetensors"
FILTER_FILE = "learn2pd_filter.safetensors"


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """One checkpoint folder and what jaxdllm reads from it, each file read once when first asked.

    `Checkpoint(folder)` takes a folder already found and reads nothing yet; `Checkpoint.open`
    finds the folder (a shipped name works) and parses `config.json` at once.
    """

    folder: Path

    @classmethod
    def open(cls, reference: str | os.PathLike | Checkpoint) -> Checkpoint:
        """The checkpoint at `reference`: a folder or a shipped name (`jaxdllm.shipped.checkpoint_dir`),
        found once, with its `config.json` parsed now (a missing folder or a bad file is a
        `CheckpointError` naming it); a `Checkpoint` is returned as it is."""
        if isinstance(reference, Checkpoint):
            return reference
        checkpoint = cls(checkpoint_dir(reference))
        checkpoint.config  # noqa: B018 -- bad checkpoints fail here, before anything else is read
        return checkpoint

    # --- the folder, as a path ---------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.folder.name

    def __fspath__(self) -> str:
        return os.fspath(self.folder)

    def __truediv__(self, name: str | os.PathLike) -> Path:
        return self.folder / name

    def __str__(self) -> str:
        return str(self.folder)

    # --- config.json -------------------------------------------------------------------------
    @property
    def config_file(self) -> Path:
        return self.folder / CONFIG_FILE

    @functools.cached_property
    def raw_config(self) -> dict:
        """The parsed `config.json` (shared: copy it before changing it)."""
        return read_config_json(self.folder)

    @functools.cached_property
    def config(self) -> ModelConfig:
        """The model's `ModelConfig`, read by the family `config.json` names. A config.json without a
        mask id (WeDLM's released files say null) takes the mask token the checkpoint's tokenizer names."""
        config = config_from_hf(self.raw_config, where=str(self.config_file))
        if config.mask_token_id is None:
            mask = tokenizer_mask_id(self.folder)
            if mask is not None:
                config = config.replace(mask_token_id=mask)
        return config

    @property
    def has_config(self) -> bool:
        """Whether the folder holds a `config.json` (a folder of side files alone has none)."""
        return "raw_config" in self.__dict__ or self.config_file.is_file()

    # --- jaxdllm_sampler.json ----------------------------------------------------------------
    @functools.cached_property
    def _sampler_file(self) -> dict:
        path = self.folder / SAMPLER_DEFAULTS_FILE
        if not path.is_file():
            return {}
        try:
            values = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot read {path}: {e}") from None
        if not isinstance(values, dict) or not isinstance(values.get(CACHE_NOTES_KEY, {}), dict):
            raise CheckpointError(f"{path} must hold a JSON object of sampler settings "
                                  f"(and {CACHE_NOTES_KEY!r}: an object from cache name to text)")
        return values

    @property
    def sampler_defaults(self) -> dict:
        """The checkpoint's own sampler defaults (`jaxdllm_sampler.json`: `SamplerConfig` keywords),
        or {}; `jaxdllm.sampler_defaults(checkpoint)` turns them into a `SamplerConfig`."""
        return {k: v for k, v in self._sampler_file.items() if k != CACHE_NOTES_KEY}

    @property
    def cache_notes(self) -> dict[str, str]:
        """What the checkpoint's card says about decoding it with an approximate cache: cache name
        (`prefix`, `dual`) -> one line (`jaxdllm_sampler.json`'s `cache_notes`), or {}."""
        return dict(self._sampler_file.get(CACHE_NOTES_KEY, {}))

    # --- companions.json and the policies' side files ----------------------------------------
    @functools.cached_property
    def _companions(self) -> dict:
        return read_companions(self.folder)

    @property
    def companions(self) -> dict[str, str]:
        """`companions.json`: `{policy name: its second model's folder or shipped name}`, or {}."""
        return dict(self._companions)

    @property
    def companions_file(self) -> Path:
        return self.folder / COMPANIONS_FILE

    @property
    def heads_file(self) -> Path:
        """Where Medusa's heads are saved beside the model (it may not exist)."""
        return self.folder / HEADS_FILE

    @property
    def filter_file(self) -> Path:
        """Where Learn2PD's filter is saved beside the model (it may not exist)."""
        return self.folder / FILTER_FILE

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.folder)!r})"


def tokenizer_mask_id(folder: Path) -> int | None:
    """The id of the mask token `tokenizer_config.json` names (`mask_token`), looked up in its
    `added_tokens_decoder` or `tokenizer.json`'s added tokens and vocabulary; None when it names none."""
    def read(name):
        path = folder / name
        return json.loads(path.read_text()) if path.is_file() else {}

    mask = read("tokenizer_config.json").get("mask_token")
    mask = mask.get("content") if isinstance(mask, dict) else mask
    if not mask:
        return None
    for token_id, entry in read("tokenizer_config.json").get("added_tokens_decoder", {}).items():
        if entry.get("content") == mask:
            return int(token_id)
    tokenizer = read("tokenizer.json")
    for entry in tokenizer.get("added_tokens", []):
        if entry.get("content") == mask:
            return int(entry["id"])
    vocab = tokenizer.get("model", {}).get("vocab", {})
    return int(vocab[mask]) if isinstance(vocab, dict) and mask in vocab else None


def checkpoint_of(reference: str | os.PathLike | Checkpoint) -> Checkpoint:
    """`reference` when it is a `Checkpoint`, else the checkpoint of its folder (found as
    `jaxdllm.shipped.checkpoint_dir` finds it), nothing read yet."""
    return reference if isinstance(reference, Checkpoint) else Checkpoint(checkpoint_dir(reference))


def read_companions(directory: str | os.PathLike) -> dict:
    """The model's `companions.json` (`{policy name: folder or shipped name}`), {} where there is none;
    a file that is not such a JSON object is a `ConfigError` naming it."""
    listing = Path(directory) / COMPANIONS_FILE
    if not listing.is_file():
        return {}
    try:
        table = json.loads(listing.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{listing} is not valid JSON ({e}): it maps a policy to its second model's folder, "
                          'e.g. {"spec_diffusion": "../drafter"}') from None
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise ConfigError(f"{listing} must be a JSON object from policy names to folders, e.g. "
                          f'{{"spec_diffusion": "../drafter"}}; got {json.dumps(table)[:80]}')
    return table


def read_sampler_defaults(reference: str | os.PathLike | Checkpoint) -> dict:
    """`Checkpoint.sampler_defaults` of a folder, shipped name or `Checkpoint`."""
    return checkpoint_of(reference).sampler_defaults


def read_cache_notes(reference: str | os.PathLike | Checkpoint) -> dict[str, str]:
    """`Checkpoint.cache_notes` of a folder, shipped name or `Checkpoint`."""
    return checkpoint_of(reference).cache_notes
