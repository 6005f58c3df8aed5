"""Hugging Face checkpoint import/export: config.json + safetensors (one file or a sharded index).

Import reads one tensor at a time, converts its layout and dtype on the host, and places it
straight into its target sharding; at most one tensor (plus its cast copy) is on the host. With
`RunOptions.scan_layers` a layer's tensor is written on device into its slice of the stacked
parameter.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from jaxdllm import sharding as shd
from jaxdllm.checkpoint.folder import SAMPLER_DEFAULTS_FILE, Checkpoint
from jaxdllm.checkpoint.hf_config import config_to_hf
from jaxdllm.checkpoint.hf_names import is_ignorable, param_location, tensor_table
from jaxdllm.errors import CheckpointError, ConfigError
from jaxdllm.models import quantize
from jaxdllm.models.config import ModelConfig, checkpoint_fields
from jaxdllm.models.families import family_of
from jaxdllm.models.families.config_json import checkpoint_dtype
from jaxdllm.models.families.tensors import TensorMapping
from jaxdllm.models.run_options import RunOptions, split_options
from jaxdllm.models.transformer import Transformer

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# A safetensors file beside the weights that is not part of them (e.g. Learn2PD's filter) says so
# in its metadata; loading skips it and an export leaves it in place.
SIDE_FILE_METADATA = "jaxdllm_side_file"
# Files beside the weights that describe the model to other tools; copied on export on request.
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json", "chat_template.jinja", "vocab.json", "merges.txt", SAMPLER_DEFAULTS_FILE)
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _readable_like_other_files(path: Path) -> None:
    """safetensors writes 0600; give the file the mode any new file gets (0644 under umask 022),
    as transformers' `save_pretrained` does, so other users and containers can read it."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def _weight_map(directory: Path) -> dict[str, Path]:
    """tensor name -> safetensors file, from the index or from every *.safetensors file."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"cannot read {index}: {e}") from e
        files = {name: directory / fname for name, fname in weight_map.items()}
        for file in sorted(set(files.values())):
            if not file.is_file():
                raise CheckpointError(f"{index} lists {file.name}, which is missing")
        return files
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        hint = " (pytorch_model.bin is not read: convert it to safetensors)" if any(
            directory.glob("*.bin")) else ""
        raise CheckpointError(f"no {SINGLE_FILE}, {INDEX_FILE} or *.safetensors in {directory}{hint}")
    files = {}
    for file in shards:
        handle = _open(file)
        if SIDE_FILE_METADATA in (handle.metadata() or {}):  # not weights (e.g. Learn2PD's filter)
            continue
        for name in handle.keys():
            files[name] = file
    return files


def is_side_file(file: Path) -> bool:
    """Whether a safetensors file declares itself a side file (`SIDE_FILE_METADATA`), not weights."""
    return SIDE_FILE_METADATA in (_open(file).metadata() or {})


# safetensors dtype names -> numpy dtypes, for reading tensors straight from the memory-mapped file
_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
                       "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
                       "BOOL": np.bool_}


def _mapped_tensors(file: Path) -> dict[str, np.ndarray]:
    """`{name: read-only view}` of every tensor of a safetensors file, over one memory map: a
    device's shard read from a view touches only the file pages that hold it (each process of a
    multi-process job reads its own shards, not whole tensors). Tensors of a dtype numpy cannot
    view are left out (read with the safetensors handle instead)."""
    import json
    import struct

    with open(file, "rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
    data = np.memmap(file, np.uint8, mode="r")
    start = 8 + header_size
    views = {}
    for name, info in header.items():
        dtype = _SAFETENSORS_DTYPES.get(info.get("dtype")) if name != "__metadata__" else None
        if dtype is None:
            continue
        begin, end = info["data_offsets"]
        views[name] = data[start + begin:start + end].view(dtype).reshape(info["shape"])
    return views


def _open(file: Path):
    try:
        return safe_open(str(file), framework="numpy")
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"cannot read safetensors file {file}: {e}") from e


def _log_ignored(directory: Path, files: dict[str, Path], config: ModelConfig) -> None:
    """Say how many of the checkpoint's tensors the config's family skips (`Family.ignores_tensor`)."""
    family = family_of(config)
    ignored = sum(family.ignores_tensor(name) for name in files)
    if ignored:
        log.warning("%s: skipping its %d %s", directory, ignored, family.ignored_why or "tensors the model does not use")


def _check_tensors(table: list[TensorMapping], files: dict[str, Path], config: ModelConfig,
                   handles: dict[Path, object], where: Path) -> None:
    expected = {t.name for t in table}
    missing = [t.name for t in table if t.name not in files]
    unexpected = sorted(n for n in files if n not in expected and not is_ignorable(n, config))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"unexpected tensors {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
        raise CheckpointError(f"{where} does not match its config.json ({config.model_type}): "
                              + "; ".join(parts))
    for t in table:
        file = files[t.name]
        try:
            shape = tuple(handles[file].get_slice(t.name).get_shape())
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"cannot read tensor {t.name} from {file}: {e}") from e
        if shape != t.hf_shape:
            raise CheckpointError(
                f"tensor {t.name} in {file.name} has shape {list(shape)}, expected {list(t.hf_shape)}")


def _placement(shape: tuple, logical_axes, mesh: Mesh | None, rules):
    if mesh is None:
        return SingleDeviceSharding(jax.devices()[0])
    mesh = shd.auto_mesh(mesh)  # a jax.make_mesh mesh (Explicit axes) is used through its Auto twin
    return NamedSharding(mesh, shd.logical_to_spec(logical_axes, shape, mesh, rules))


def _slice_placement(placement, depth: int):
    """The placement of one slice of a stacked parameter (its `depth` leading axes dropped: a
    layer of a `scan_layers` parameter, an expert of a routed-experts kernel)."""
    if isinstance(placement, SingleDeviceSharding) or not depth:
        return placement
    return NamedSharding(placement.mesh, PartitionSpec(*tuple(placement.spec)[depth:]))


# Write one slice into a stacked parameter in place (the old buffer is donated). The index is
# traced: one compile per parameter shape, not per layer or expert.
@functools.partial(jax.jit, donate_argnums=0)
def _set_slice(stacked, x, index):
    lead = (1,) * index.shape[0]
    return jax.lax.dynamic_update_slice(stacked, x.reshape(lead + x.shape), (*index, *(0,) * x.ndim))


@jax.jit
def _get_slice(stacked, index):
    depth = index.shape[0]
    sizes = (1,) * depth + stacked.shape[depth:]
    return jax.lax.dynamic_slice(stacked, (*index, *(0,) * (stacked.ndim - depth)), sizes).reshape(stacked.shape[depth:])


def _sliced(value, index: tuple[int, ...]):
    return value if not index else _get_slice(value, np.asarray(index, np.int32))


@functools.lru_cache(maxsize=None)
def _quantizer(scale_shape: tuple, kernel_placement, scale_placement):
    """A jitted `float kernel -> (int8 kernel, scale)` writing both in their placements (one
    compile per kernel shape, not per layer)."""
    return jax.jit(functools.partial(quantize.quantize_kernel, scale_shape_=scale_shape),
                   out_shardings=(kernel_placement, scale_placement))


def _place(host: np.ndarray, placement, dtype=None) -> jax.Array:
    """Put `host` (an array or a view of the memory-mapped file) on devices as `dtype` (default:
    its own); each device (this process's only) reads and casts just its shard."""
    dtype = host.dtype if dtype is None else dtype
    # always a copy: the device buffer must not alias the file's memory map (closed after the file)
    own = lambda part: np.array(part, dtype=dtype, order="C", copy=True)
    if isinstance(placement, SingleDeviceSharding):
        return jax.device_put(own(host), placement)
    return jax.make_array_from_callback(host.shape, placement, lambda idx: own(host[idx]))


def verify_checkpoint(path: str | Path | Checkpoint) -> dict:
    """Check a checkpoint directory (a folder, shipped name or `Checkpoint`) without loading its
    weights: config.json, every safetensors header (a truncated file fails here), and the name and
    shape of every tensor the config needs.

    Returns `{"tensors": N, "files": F, "bytes": total size of the weight files}`; raises
    `CheckpointError` naming the file or tensor otherwise.
    """
    checkpoint = Checkpoint.open(path)
    directory, config = checkpoint.folder, checkpoint.config
    files = _weight_map(directory)
    table = tensor_table(config)
    _check_tensors(table, files, config, {f: _open(f) for f in set(files.values())}, directory)
    _log_ignored(directory, files, config)
    unique = set(files.values())
    return {"tensors": len(table), "files": len(unique), "bytes": sum(f.stat().st_size for f in unique)}


def from_pretrained(path: str | Path | Checkpoint, *, dtype: str | None = None, compute_dtype: str | None = None,
                    mesh: Mesh | None = None, rules=shd.DEFAULT_RULES, options: RunOptions | None = None,
                    **overrides) -> Transformer:
    """Load a Hugging Face checkpoint directory into a `Transformer`.

    Args:
      path: directory with config.json and model.safetensors (or a sharded index), the name
        of a shipped checkpoint (`tasks-llada-small`; see `jaxdllm.shipped`), or a `Checkpoint`
        (`jaxdllm.checkpoint.folder`: the folder and its config.json are not read again).
      dtype: parameter and compute dtype (`float32`, `bfloat16`, `float16`); default: the
        checkpoint's `torch_dtype`/`dtype`.
      compute_dtype: a different compute dtype (e.g. fp32 parameters, bf16 matmuls).
      mesh: place each parameter in its named sharding on this mesh (see
        `jaxdllm.sharding`); default: the first device.
      rules: logical-axis -> mesh-axis table.
      options: how the model runs (`RunOptions`); `dtype` / `compute_dtype` and option keywords
        below change it.
      **overrides: `RunOptions` fields (`attention_impl="xla"`, `scan_layers=True`, `remat`,
        `quantization="int8"`: each linear layer's tensor is quantized on its devices as it loads,
        weight-only int8 with per-output-channel scales; the float tensor is never kept), or
        `ModelConfig` fields that do not change parameter shapes (e.g. `attention="bidirectional"`).

    Returns:
      The model; `model.config.source_config` keeps the config.json for export, `model.options`
      says how it runs.
    """
    checkpoint = Checkpoint.open(path)
    directory, raw, config = checkpoint.folder, checkpoint.raw_config, checkpoint.config
    config_overrides, option_overrides = split_options(overrides)
    fixed = sorted(set(config_overrides) & checkpoint_fields(type(config)))
    if fixed:
        raise ConfigError(f"from_pretrained cannot override {fixed}: the checkpoint fixes them "
                         "(use dtype= for the parameter dtype)")
    if config_overrides:
        config = config.replace(**config_overrides)
    stored = checkpoint_dtype(raw)
    if options is None:
        options = RunOptions(param_dtype=stored, dtype=stored)
    if dtype is not None:
        options = options.replace(param_dtype=dtype, dtype=dtype)
    if compute_dtype is not None:
        options = options.replace(dtype=compute_dtype)
    options = options.replace(**option_overrides)

    files = _weight_map(directory)
    table = tensor_table(config)
    _check_tensors(table, files, config, {f: _open(f) for f in set(files.values())}, directory)
    _log_ignored(directory, files, config)

    abstract = nnx.eval_shape(lambda: Transformer(config, options, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    variables = dict(nnx.to_flat_state(state))
    target = _NP_DTYPES[options.param_dtype]
    stacked: dict[tuple, jax.Array] = {}  # scan_layers: stacked parameters, filled layer by layer
    # File by file, each handle closed after use: its memory-mapped pages leave the process.
    for file in sorted(set(files.values())):
        handle, mapped = _open(file), _mapped_tensors(file)
        for t in (t for t in table if files[t.name] == file):
            path, index = param_location(t, options.scan_layers)
            var = variables[path]
            shape = tuple(var.get_value().shape)
            if shape[len(index):] != t.shape:  # a bug in the table, not in the checkpoint
                raise AssertionError(f"{t.name}: table shape {t.shape} != parameter {shape}")
            host = t.to_jax(t.read(mapped if t.name in mapped else handle))  # a view of the file where numpy can
            kept = var.get_value().dtype  # a float parameter keeps its own dtype (the routers' float32 bias);
            want = kept if jnp.issubdtype(kept, jnp.floating) else target  # an int8 kernel loads as floats first
            placement = _placement(shape, var.logical_axes, mesh, rules)
            here = _slice_placement(placement, len(index))
            values = {path: _place(host, here, want)}
            scale_at = quantize.scale_path(path)
            if scale_at in variables:  # an int8 kernel: quantize this tensor on its devices
                scale_var = variables[scale_at]
                scale_shape = tuple(scale_var.get_value().shape)
                scale_placement = _placement(scale_shape, scale_var.logical_axes, mesh, rules)
                values = dict(zip((path, scale_at), _quantizer(
                    scale_shape[len(index):], here, _slice_placement(scale_placement, len(index)))(values[path])))
            del host
            for at, value in values.items():
                if not index:
                    variables[at].set_value(value)
                    continue
                if at not in stacked:
                    full = variables[at].get_value()
                    stacked[at] = jax.jit(lambda: jnp.zeros(full.shape, full.dtype),
                                          out_shardings=_placement(full.shape, variables[at].logical_axes,
                                                                   mesh, rules))()
                stacked[at] = _set_slice(stacked[at], value, np.asarray(index, np.int32))
            del values
        del handle, mapped
    for path, value in stacked.items():
        variables[path].set_value(value)
    return nnx.merge(graphdef, state)


def _float_value(params: dict, t: TensorMapping, scan_layers: bool) -> jax.Array:
    """The slice of a parameter that checkpoint tensor `t` covers, in jaxdllm's layout on the
    parameter's devices; an int8 kernel as the float kernel it stands for (`int8 * scale`)."""
    path, index = param_location(t, scan_layers)
    value = _sliced(params[path].get_value(), index)
    scale_at = quantize.scale_path(path)
    if scale_at in params:
        value = quantize.dequantize(value, _sliced(params[scale_at].get_value(), index))
    return value


def device_tensors(model: Transformer) -> Iterator[tuple[str, jax.Array]]:
    """Each tensor of `model`'s checkpoint, `(name, array of the tensor's checkpoint shape)` in file
    order, made on the model's devices in the parameter dtype: no file and no host copy. For
    handing the weights to another framework on the same device (`torch.from_dlpack`). A fused
    tensor's parts are concatenated; each transposed tensor is a new array (the caller holds both
    layouts while it keeps them)."""
    params = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    dtype = jnp.dtype(model.options.param_dtype)  # an int8 kernel dequantizes to float32
    for name, group in itertools.groupby(tensor_table(model.config), key=lambda t: t.name):
        group = list(group)  # a fused tensor's parts are consecutive in the table
        parts = [t.to_hf(_float_value(params, t, model.options.scan_layers).astype(dtype), xp=jnp) for t in group]
        yield name, parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=group[0].axis)


def _to_host(array: jax.Array) -> np.ndarray:
    if not array.is_fully_addressable:
        from jax.experimental import multihost_utils
        array = multihost_utils.process_allgather(array, tiled=True)
    return np.asarray(jax.device_get(array))


_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([KMG]I?B|B)?\s*", re.IGNORECASE)
_SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(size: int | str) -> int:
    """Bytes from an int or text such as `"5GB"`, `"500MiB"`, `"1000000"`; `ConfigError` otherwise."""
    value = size
    if isinstance(size, str):
        match = _SIZE.fullmatch(size)
        value = int(float(match[1]) * _SIZE_UNITS[(match[2] or "B").upper()]) if match else None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"max_shard_size must be a positive size such as 5GB or 500MiB, got {size!r}")
    return value


def save_pretrained(model: Transformer, path: str | Path, *, max_shard_size: int | str = "5GB",
                    dtype: str | None = None, copy_files_from: str | Path | None = None) -> Path:
    """Write `model` as a Hugging Face checkpoint directory in its source layout.

    Args:
      model: a `Transformer` (sharded or not; multi-host arrays are gathered per tensor).
      path: output directory (created).
      max_shard_size: bytes per safetensors file (int or "5GB"); larger models get
        `model-0000k-of-0000n.safetensors` plus `model.safetensors.index.json`.
      dtype: tensor dtype on disk; default the parameter dtype (`model.options.param_dtype`).
      copy_files_from: a checkpoint directory whose tokenizer/generation/chat-template files
        (and `*.py` remote code, e.g. LLaDA's) are copied along.

    An int8 model (run option `quantization="int8"`) is written as the float weights it stands for
    (`int8 * scale`), so any tool reads the result.

    Returns:
      The output directory. Only process 0 writes.
    """
    config = model.config
    out = Path(path)
    dtype = dtype or model.options.param_dtype
    np_dtype = _NP_DTYPES[dtype]
    table = tensor_table(config)
    params = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    limit = parse_size(max_shard_size)
    itemsize = np.dtype(np_dtype).itemsize

    shards: list[list[TensorMapping]] = [[]]
    size = 0
    for t in table:  # plan the files first so only one file's tensors are on the host at once
        nbytes = int(np.prod(t.part_shape)) * itemsize
        fused_with_previous = shards[-1] and shards[-1][-1].name == t.name  # parts of one tensor share a file
        if shards[-1] and size + nbytes > limit and not fused_with_previous:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    names = ([SINGLE_FILE] if len(shards) == 1 else
             [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))])

    writer = jax.process_index() == 0
    if writer:
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob("*.safetensors"):
            if not is_side_file(stale):
                stale.unlink()
    weight_map, total = {}, 0
    for fname, shard in zip(names, shards):
        parts: dict[str, list[np.ndarray]] = {}  # a fused tensor's parts, in row order
        axes: dict[str, int] = {}
        for t in shard:
            value = _float_value(params, t, model.options.scan_layers)
            parts.setdefault(t.name, []).append(t.to_hf(_to_host(value).astype(np_dtype)))
            axes[t.name] = t.axis
            weight_map[t.name] = fname
        tensors = {name: p[0] if len(p) == 1 else np.concatenate(p, axis=axes[name]) for name, p in parts.items()}
        del parts
        total += sum(w.nbytes for w in tensors.values())
        if writer:
            save_file(tensors, str(out / fname), metadata={"format": "pt"})
            _readable_like_other_files(out / fname)
        del tensors
    if writer:
        if len(shards) > 1:
            (out / INDEX_FILE).write_text(json.dumps(
                {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        elif (out / INDEX_FILE).exists():
            (out / INDEX_FILE).unlink()
        (out / "config.json").write_text(json.dumps(config_to_hf(config, dtype), indent=2))
        if copy_files_from is not None:
            src = Path(copy_files_from)
            for f in [src / n for n in SIDE_FILES] + sorted(src.glob("*.py")):
                if f.is_file() and f.resolve() != (out / f.name).resolve():
                    shutil.copy2(f, out / f.name)
    return out
