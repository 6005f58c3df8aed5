"""Sharding by name: logical axis names on parameters, a rules table mapping them to mesh axes.

Mesh axes are `data`, `fsdp`, `tensor`. Parameters carry logical names (`vocab`, `embed`,
`heads`, `kv_heads`, `head_dim`, `mlp`, `norm`, `expert`); activations use `batch` and `length`.

One rules table is in force at a time: `DEFAULT_RULES`, or the table of `use_rules(rules)`
(the sampler sets the rules it was given around its compiled loop), which every function here
reads when no `rules` is passed, so activation constraints inside the model follow the same
table as the parameters' placement.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Mapping

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jaxdllm.errors import ConfigError

log = logging.getLogger(__name__)

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes, or None for replicated).
DEFAULT_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "layers": None,  # the stacked-layer axis of scan_layers models
    "length": None,
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    # Routed experts' leading axis: each fsdp shard holds E / fsdp whole experts (the MoE layer
    # gathers a layer's experts for its grouped matmuls; see jaxdllm/memory_plan.py).
    "expert": "fsdp",
}


def auto_mesh(mesh: Mesh) -> Mesh:
    """`mesh` with every axis in `Auto` mode: the same devices and axis names.

    `jax.make_mesh` makes `Explicit` axes by default (sharding in the types: every gather and
    contraction over a sharded dimension must say its output sharding). jaxdllm places
    parameters and batches on the `Auto` twin of a mesh and lets XLA choose the collectives;
    a call made inside `jax.set_mesh(explicit_mesh)` runs its body under `jax.sharding.auto_axes`.
    """
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def explicit_context():
    """The current `jax.set_mesh` mesh (abstract) if any of its axes is `Explicit`, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not any(t == AxisType.Explicit for t in mesh.axis_types):
        return None
    return mesh


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
    """A `(data, fsdp, tensor)` mesh over `devices` (default: all devices)."""
    devices = jax.devices() if devices is None else list(devices)
    need = data * fsdp * tensor
    if need != len(devices):
        raise ConfigError(
            f"mesh data={data} x fsdp={fsdp} x tensor={tensor} = {need} devices, "
            f"but {len(devices)} are available")
    return Mesh(np.asarray(devices).reshape(data, fsdp, tensor), MESH_AXES,
                axis_types=(AxisType.Auto,) * len(MESH_AXES))


_ACTIVE_RULES: contextvars.ContextVar = contextvars.ContextVar("jaxdllm_rules", default=None)


@contextlib.contextmanager
def use_rules(rules: Mapping[str, str | tuple[str, ...] | None] | tuple):
    """Make `rules` (a table, or `frozen_rules` of one) the table in force for this block."""
    token = _ACTIVE_RULES.set(dict(rules))
    try:
        yield
    finally:
        _ACTIVE_RULES.reset(token)


def active_rules() -> Mapping[str, str | tuple[str, ...] | None]:
    """The rules table in force: the innermost `use_rules`, else `DEFAULT_RULES`."""
    return _ACTIVE_RULES.get() or DEFAULT_RULES


def frozen_rules(rules: Mapping) -> tuple:
    """`rules` as a sorted tuple of items: hashable, so it can be a static argument of a jit."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in rules.items()))


def logical_to_spec(logical_axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh,
                    rules: Mapping[str, str | tuple[str, ...] | None] | None = None) -> PartitionSpec:
    """The `PartitionSpec` for an array of `shape` whose dims carry `logical_axes` (`rules`:
    default the table in force, `active_rules()`).

    A dim whose size the mapped mesh axes do not divide is replicated (logged), so odd head
    counts still load; a mesh axis is used at most once per array.
    """
    rules = active_rules() if rules is None else rules
    if len(logical_axes) != len(shape):
        raise ConfigError(f"logical axes {logical_axes} do not match shape {shape}")
    used: set[str] = set()
    spec = []
    for name, dim in zip(logical_axes, shape):
        if name is not None and name not in rules:
            raise ConfigError(f"no sharding rule for logical axis {name!r}; rules: {sorted(rules)}")
        target = rules.get(name) if name is not None else None
        axes = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
        axes = tuple(a for a in axes if a in mesh.shape and mesh.shape[a] > 1 and a not in used)
        size = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
        if axes and dim % size:
            log.info("replicating logical axis %r (size %d) not divisible by mesh %s", name, dim, axes)
            axes = ()
        used.update(axes)
        spec.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
    return PartitionSpec(*spec)


def batch_sharding(mesh: Mesh, ndim: int = 2, rules=None) -> NamedSharding:
    """Rows of an `[B, ...]` array over the mesh axes the `batch` rule names (those present with
    size > 1), the other `ndim - 1` dims whole, on `auto_mesh(mesh)`. The one definition of how
    batches shard: training batches, the sampler's rows and lowered programs use it."""
    mesh = auto_mesh(mesh)
    axes = batch_axes(mesh, rules)
    return NamedSharding(mesh, PartitionSpec(axes or None, *([None] * (ndim - 1))))


def batch_axes(mesh: Mesh, rules=None) -> tuple[str, ...]:
    """The mesh axes rows are split over (the `batch` rule's axes present with size > 1)."""
    spec = logical_to_spec(("batch",), (0,), mesh, rules)  # size 0 divides every axis
    axes = spec[0] if spec[0] is not None else ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def process_rows(mesh: Mesh, batch_size: int, rules=None) -> tuple[int, int]:
    """`(start, stop)`: the rows of a `[batch_size, ...]` batch that this process's devices hold
    under `batch_sharding(mesh)`, the part of every global batch this process feeds in a
    multi-process job (all of it when rows are not split or the process holds every split).

    Raises `ConfigError` when the rows this process holds are not one contiguous range (a mesh
    whose batch axes interleave the processes' devices)."""
    sharding = batch_sharding(mesh, 2, rules)
    held = sorted({(idx[0].start or 0, batch_size if idx[0].stop is None else idx[0].stop)
                   for idx in sharding.addressable_devices_indices_map((batch_size, 1)).values()})
    start, stop = held[0][0], held[-1][1]
    if any(a[1] != b[0] for a, b in zip(held, held[1:])):
        raise ConfigError(f"this process's devices hold rows {held} of the batch, not one contiguous range: "
                          "order the mesh's devices by process (jaxdllm.sharding.make_mesh does)")
    return start, stop


def batch_shards(mesh: Mesh, rules=None) -> int:
    """How many ways rows are split: a batch must be a multiple of this."""
    return int(np.prod([mesh.shape[a] for a in batch_axes(mesh, rules)]))  # 1 for no axes


def constrain(x: jax.Array, logical_axes: tuple[str | None, ...], rules=None) -> jax.Array:
    """`x` constrained to the sharding its logical axes name on the current mesh (`jax.set_mesh`),
    by `rules` (default the table in force); unchanged when no mesh is set. Activations use
    `batch`, `length`, `embed`, `vocab`."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(logical_axes, x.shape, mesh, rules))


def state_shardings(state: nnx.State, mesh: Mesh, rules=None) -> nnx.State:
    """A pytree like `state` (abstract or concrete) holding a `NamedSharding` per parameter, on
    `auto_mesh(mesh)`."""
    mesh = auto_mesh(mesh)

    def one(var):
        axes = getattr(var, "logical_axes", None)
        shape = var.get_value().shape
        axes = (None,) * len(shape) if axes is None else axes
        return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model: nnx.Module, mesh: Mesh, rules=None) -> nnx.Module:
    """Move an existing model's parameters to their named shardings on `mesh` (in place)."""
    graphdef, state = nnx.split(model)
    shardings = state_shardings(state, mesh, rules)
    values = jax.tree.map(lambda v: v.get_value(), state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    placed = jax.device_put(values, shardings)
    nnx.update(model, placed)
    return model
