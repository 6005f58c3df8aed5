"""What several commands of the command line share: `--set` values, the model folder (opened once
as a `Checkpoint` and handed to every loader), the recipe, the cache notes and the line an
interrupted command prints."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from jaxdllm.shipped import checkpoint_dir, shipped_checkpoint


def _parse_value(text: str):
    """One `--set` value: int, float, true/false, else text; a value with commas is a list."""
    if "," in text:  # a list: data.tasks=copy,reverse
        return [_parse_value(part.strip()) for part in text.split(",") if part.strip()]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_sets(items: list[str] | None, sections: bool = False) -> dict:
    """`--set` overrides: `KEY=VALUE` -> `{key: value}`, or with `sections` `SECTION.KEY=VALUE` ->
    `{section: {key: value}}` (and `SECTION.TABLE.KEY=VALUE`, a key of a sub-table such as
    `[model.experts]`, -> `{section: {table: {key: value}}}`). Values are read as int, float,
    true/false, else text; a value with commas is a list of such values."""
    from jaxdllm.errors import ConfigError

    out: dict = {}
    form = "SECTION.KEY=VALUE" if sections else "KEY=VALUE"
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        section, dot, name = key.partition(".")
        if not sep or not key or (sections and not (dot and section and name)):
            raise ConfigError(f"--set expects {form}, got {item!r}")
        if sections:
            *tables, name = name.split(".")
            table = out.setdefault(section, {})
            for part in tables:
                table = table.setdefault(part, {})
            table[name] = _parse_value(value.strip())
        else:
            out[key] = _parse_value(value.strip())
    return out


DEFAULT_MODEL_NAME = "tasks-llada-small"
# The shipped folder, whatever the working folder holds (see jaxdllm.shipped).
DEFAULT_MODEL = shipped_checkpoint(DEFAULT_MODEL_NAME) or Path("checkpoints") / DEFAULT_MODEL_NAME


def model_dir(args) -> Path:
    """`--model` (a folder or a shipped name), else the shipped default."""
    if args.model is not None:
        return checkpoint_dir(args.model)
    return _default_model()


def _default_model() -> Path:
    from jaxdllm.errors import CheckpointError
    from jaxdllm.shipped import shipped_hint

    if not (DEFAULT_MODEL / "config.json").is_file():
        raise CheckpointError(f"no --model given and the shipped default {DEFAULT_MODEL_NAME} is missing "
                              f"({shipped_hint()})")
    return DEFAULT_MODEL


def open_model(args):
    """The `Checkpoint` of `--model` (a folder or a shipped name), else of the shipped default: the
    folder found and its config.json parsed once, then handed to every loader."""
    from jaxdllm.checkpoint.folder import Checkpoint

    return Checkpoint.open(args.model if args.model is not None else _default_model())


def recipe(args):
    """The recipe `args.recipe` with the `--set SECTION.KEY=VALUE` overrides applied."""
    from jaxdllm.shipped import recipe_path
    from jaxdllm.train import TrainConfig

    config = TrainConfig.from_toml(recipe_path(args.recipe))
    if args.set:
        raw = config.to_dict()
        _merge(raw, parse_sets(args.set, sections=True))
        config = TrainConfig.from_dict(raw)
    return config


def _merge(into: dict, changes: dict) -> None:
    """`changes` written into `into`; a sub-table changes only the keys it names."""
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def warn_cache_notes(model_dir, configs) -> None:
    """One warning per flagged cache: what the checkpoint's card measured with it. `model_dir`: the
    checkpoint's folder or `Checkpoint`."""
    from jaxdllm.pretrained import cache_note

    for name in sorted({c.cache.name for c in configs}):
        note = cache_note(model_dir, next(c for c in configs if c.cache.name == name))
        if note:
            warnings.warn(f"cache {name!r} on {model_dir.name}: {note}")


def interrupted(command: str, e: KeyboardInterrupt, resumes: str | None = None) -> int:
    """One line for Ctrl-C or SIGTERM: what was kept and, when the command `resumes`, how to go on;
    returns the exit code, 130 or 143."""
    import signal

    from jaxdllm.interrupts import signal_number

    kept = getattr(e, "kept", "")
    line = "interrupted" + ("" if not kept else f" {kept}" if kept.startswith("at ") else f"; {kept}")
    if resumes:
        line += f"; {resumes}"
    print(f"jaxdllm {command}: {line}", file=sys.stderr)
    return 143 if signal_number(e) == signal.SIGTERM else 130


def add_mesh_argument(parser) -> None:
    """`--mesh data=D,fsdp=F,tensor=T` on an inference command's parser."""
    parser.add_argument("--mesh", metavar="data=D,fsdp=F,tensor=T",
                        help="place the model on a mesh over every device of the job: parameters over fsdp and "
                             "tensor, prompts over data and fsdp; data=-1 takes the devices the others leave "
                             "(default: one device; in a multi-process job, fsdp over every device)")


def inference_mesh(args):
    """The mesh `--mesh` names (`jaxdllm.train.config.MeshSection` sizes), None for one device;
    in a multi-process job without `--mesh`, fsdp over every device of the job."""
    import jax

    from jaxdllm.errors import ConfigError
    from jaxdllm.train.config import MeshSection
    from jaxdllm.train.setup import make_training_mesh

    text = getattr(args, "mesh", None)
    if text is None:
        return None if jax.process_count() == 1 else make_training_mesh(MeshSection(data=1, fsdp=jax.device_count()))
    sizes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name.strip() not in ("data", "fsdp", "tensor"):
            raise ConfigError(f"--mesh expects data=D,fsdp=F,tensor=T (any of the three), got {text!r}")
        try:
            sizes[name.strip()] = int(value)
        except ValueError:
            raise ConfigError(f"--mesh {name.strip()} must be an integer, got {value!r}") from None
    return make_training_mesh(MeshSection(**sizes))
