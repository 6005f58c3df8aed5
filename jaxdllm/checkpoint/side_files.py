"""Small modules saved beside a model's weights (Learn2PD's filter, Medusa heads): one safetensors
file whose metadata says it is a side file (loading the weights skips it, an export leaves it in
place) and holds the module's construction facts as JSON under its own key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdllm.checkpoint.hf_io import SIDE_FILE_METADATA
from jaxdllm.errors import CheckpointError


def side_file_path(path, file_name: str) -> Path:
    """`path/file_name` for a model folder, else `path` itself (a file)."""
    path = Path(path)
    return path / file_name if path.is_dir() else path


def save_module(module: nnx.Module, target: Path, key: str, facts: dict, label: str) -> Path:
    """Write `module`'s parameters to `target`, with `facts` (JSON-able) under metadata `key`."""
    from safetensors.numpy import save_file

    tensors = {"/".join(map(str, k)): np.asarray(v.get_value())
               for k, v in nnx.to_flat_state(nnx.state(module, nnx.Param))}
    target.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target), metadata={key: json.dumps(facts), SIDE_FILE_METADATA: label})
    return target


def read_facts(target: Path, key: str, missing: str) -> dict:
    """The JSON facts under metadata `key` of side file `target`; `missing` says what to do when
    there is no such file."""
    from safetensors import safe_open

    if not target.is_file():
        raise CheckpointError(f"no {missing}")
    with safe_open(str(target), "np") as f:
        raw = (f.metadata() or {}).get(key)
    if raw is None:
        raise CheckpointError(f"{target} has no {key!r} metadata: it is not what was asked for")
    return json.loads(raw)


def load_module(target: Path, build: Callable[[], nnx.Module], what: str) -> nnx.Module:
    """`build()` with its parameters read from `target` (names and shapes must match)."""
    from safetensors.numpy import load_file

    module = build()
    tensors = load_file(str(target))
    flat = dict(nnx.to_flat_state(nnx.state(module, nnx.Param)))
    names = {"/".join(map(str, k)) for k in flat}
    if set(tensors) != names:
        raise CheckpointError(f"{target}: tensors {sorted(tensors)} do not match {what} ({sorted(names)})")
    for key, var in flat.items():
        value = tensors["/".join(map(str, key))]
        if value.shape != var.get_value().shape:
            raise CheckpointError(f"{target}: {'/'.join(map(str, key))} has shape {value.shape}, {what} needs "
                                  f"{var.get_value().shape}")
        var.set_value(jnp.asarray(value))
    return module
