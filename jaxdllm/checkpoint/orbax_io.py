"""Orbax save/restore of a model's state, with its `ModelConfig` beside it."""

from __future__ import annotations

import json
from pathlib import Path

import jax
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from jaxdllm import sharding as shd
from jaxdllm.errors import CheckpointError
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.run_options import RunOptions, split_options
from jaxdllm.models.transformer import Transformer

CONFIG_FILE = "jaxdllm_config.json"
STATE_DIR = "state"
OPTIONS_KEY = "run_options"


def save_state(model: Transformer, path: str | Path) -> Path:
    """Write `path/jaxdllm_config.json` (the config and, under `run_options`, how the model runs) and
    the parameters under `path/state` with orbax."""
    out = Path(path).absolute()
    if jax.process_index() == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / CONFIG_FILE).write_text(json.dumps({**model.config.to_dict(), OPTIONS_KEY: model.options.to_dict()}, indent=2))
    state = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    import orbax.checkpoint as ocp  # here, not at import: orbax takes ~0.4 s to import, which every CLI start paid

    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(out / STATE_DIR, state, force=True)
    return out


def load_state(path: str | Path, *, mesh: Mesh | None = None, rules=shd.DEFAULT_RULES) -> Transformer:
    """Restore a model written by `save_state`, placed on `mesh` (default: first device)."""
    src = Path(path).absolute()
    if not (src / CONFIG_FILE).is_file() or not (src / STATE_DIR).is_dir():
        raise CheckpointError(f"{src} is not a jaxdllm orbax checkpoint (needs {CONFIG_FILE} and {STATE_DIR}/)")
    saved = json.loads((src / CONFIG_FILE).read_text())
    options = saved.pop(OPTIONS_KEY, {})
    fields, older_options = split_options(saved)  # files written before the split kept options beside the config
    config, options = ModelConfig.from_dict(fields), RunOptions(**{**older_options, **options})
    abstract = nnx.eval_shape(lambda: Transformer(config, options, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    if mesh is None:
        shardings = jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), state)
    else:
        shardings = shd.state_shardings(state, mesh, rules)
    target = jax.tree.map(
        lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s),
        nnx.to_pure_dict(state), nnx.to_pure_dict(shardings))
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckptr:
        restored = ckptr.restore(src / STATE_DIR, target)
    nnx.replace_by_pure_dict(state, restored)
    return nnx.merge(graphdef, state)
