"""LoRA adapters on the model's projections, applied in the forward and merged only at export.

`add_lora(model, rank, alpha, targets, key)` attaches to every target projection `W` (q, k, v, o,
gate, up, down; `Einsum` kernels viewed as `[in, out]`) an `A [in..., rank]` (normal, std
`1/sqrt(in)`) and a `B [rank, out...]` (zeros, so training starts from the base model), both
`nnx.LoRAParam`, so `nnx.split(model, nnx.LoRAParam, ...)` separates what training updates from
the frozen base. The forward adds `(alpha / rank) * (x A) B`. `merge_lora(model)` folds
`W + (alpha / rank) A B` into the kernels and removes the adapters (export). With `scan_layers`
the adapters are stacked along the `layers` axis like their kernels.
"""

from __future__ import annotations

import math
import zlib

import jax
import jax.numpy as jnp
from flax import nnx

from jaxdllm.models.layers import Einsum

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


def _targets(model: nnx.Module, targets) -> list[tuple[tuple, Einsum]]:
    return [(path, node) for path, node in nnx.iter_graph(model)
            if isinstance(node, Einsum) and path and path[-1] in targets]


def _split_dims(e: Einsum) -> tuple[int, int, int]:
    """`(stacked layer dims, input dims, output dims)` of an Einsum kernel."""
    x_spec, rest = e.eqn.split(",")
    kernel_spec = rest.split("->")[0]
    n_in = sum(c in x_spec for c in kernel_spec)
    lead = len(e.kernel.get_value().shape) - len(kernel_spec)
    return lead, n_in, len(kernel_spec) - n_in


def _adapter_key(key: jax.Array, path: tuple) -> jax.Array:
    """A key per adapter from its unrolled path (`layers/3/attn/q`), so a scanned model (one stacked
    adapter per projection) draws the same initial weights as the unrolled one."""
    return jax.random.fold_in(key, zlib.crc32("/".join(map(str, path)).encode()) & 0x7FFFFFFF)


def add_lora(model: nnx.Module, rank: int, alpha: float, targets=TARGETS, *, key: jax.Array) -> nnx.Module:
    """Attach LoRA adapters (float32) to every projection named in `targets`, in place; returns `model`."""
    for path, e in _targets(model, targets):
        lead, n_in, _ = _split_dims(e)
        shape, axes = e.kernel.get_value().shape, e.kernel.get_metadata().get("logical_axes")
        axes = axes or (None,) * len(shape)
        in_shape, out_shape = shape[lead:lead + n_in], shape[lead + n_in:]
        draw = lambda p: jax.random.normal(_adapter_key(key, p), (*in_shape, rank), jnp.float32)
        if lead:  # stacked layers: path ('layers', 'attn', 'q') holds layers 0..L-1
            a = jnp.stack([draw((path[0], i, *path[1:])) for i in range(shape[0])])
        else:
            a = draw(path)
        a = a / math.sqrt(math.prod(in_shape))
        e.lora_a = nnx.LoRAParam(a, logical_axes=(*axes[:lead + n_in], None))
        e.lora_b = nnx.LoRAParam(jnp.zeros((*shape[:lead], rank, *out_shape), jnp.float32),
                                 logical_axes=(*axes[:lead], None, *axes[lead + n_in:]))
        e.lora_scale = alpha / rank
    return model


def lora_delta(e: Einsum) -> jax.Array:
    """`(alpha / rank) A B` in the kernel's shape (float32)."""
    lead, n_in, _ = _split_dims(e)
    shape = e.kernel[...].shape
    a, b = e.lora_a[...], e.lora_b[...]
    rank = a.shape[-1]
    a = a.reshape(*shape[:lead], -1, rank)
    b = b.reshape(*shape[:lead], rank, -1)
    return (e.lora_scale * jnp.matmul(a, b)).reshape(shape)


def merge_lora(model: nnx.Module) -> nnx.Module:
    """Fold every adapter into its kernel and remove it, in place; returns `model` (a plain model)."""
    for _, e in _targets(model, TARGETS):
        if e.lora_a is None:
            continue
        kernel = e.kernel[...]
        e.kernel[...] = (kernel.astype(jnp.float32) + lora_delta(e)).astype(kernel.dtype)
        e.lora_a, e.lora_b = nnx.data(None), nnx.data(None)
        e.lora_scale = 0.0
    return model
