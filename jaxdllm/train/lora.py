"""LoRA on the model's projection kernels, as a pure function of the parameter dict.

For a target kernel `W` (viewed as a matrix `[in, out]`: `[E, H*D]` for q/k/v, `[H*D, E]` for
o, `[E, M]` / `[M, E]` for the MLP), LoRA adds `(alpha / rank) * A @ B` with `A [in, rank]`
(normal, std `1/sqrt(in)`) and `B [rank, out]` (zeros, so training starts from the base
model). Training differentiates only the `A`/`B` dict; `merge` folds them into the kernels,
which is both the forward used in training and the export.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxdllm.errors import ConfigError

# Where each kernel splits into (input dims, output dims).
_SPLIT = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}
TARGETS = tuple(_SPLIT)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """`rank` 0 disables LoRA. `targets` name kernels among `TARGETS` (dParallel: all seven)."""

    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets))
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ConfigError(f"lora.rank must be a non-negative integer, got {self.rank!r}")
        unknown = sorted(set(self.targets) - set(TARGETS))
        if unknown:
            raise ConfigError(f"lora.targets {unknown} are not LoRA targets; choose from {TARGETS}")
        if self.rank and not self.targets:
            raise ConfigError("lora.targets is empty: name at least one kernel")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _target_paths(params: dict, targets) -> list[tuple]:
    """Paths `(…, 'attn'|'mlp', name, 'kernel')` of the target kernels, in a stable order."""
    found = []
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = tuple(getattr(k, "key", getattr(k, "idx", None)) for k in path)
        if len(keys) >= 2 and keys[-1] == "kernel" and keys[-2] in targets:
            found.append(keys)
    return found


def _get(tree, keys):
    for k in keys:
        tree = tree[k]
    return tree


def _path_name(keys) -> str:
    return "/".join(str(k) for k in keys[:-1])


def init_lora(params: dict, config: LoraConfig, key: jax.Array) -> dict:
    """`{"layers/0/attn/q": {"a": [in, r], "b": [r, out]}, ...}` for every target kernel (float32)."""
    lora = {}
    paths = _target_paths(params, config.targets)
    for keys, k in zip(paths, jax.random.split(key, max(len(paths), 1))):
        kernel = _get(params, keys)
        split = _SPLIT[keys[-2]]
        n_in, n_out = math.prod(kernel.shape[:split]), math.prod(kernel.shape[split:])
        lora[_path_name(keys)] = {
            "a": jax.random.normal(k, (n_in, config.rank), jnp.float32) / math.sqrt(n_in),
            "b": jnp.zeros((config.rank, n_out), jnp.float32),
        }
    return lora


def num_lora_params(lora: dict) -> int:
    """Trainable parameter count: `sum rank * (in + out)` over the targets."""
    return sum(x.size for x in jax.tree.leaves(lora))


def merge(params: dict, lora: dict, config: LoraConfig) -> dict:
    """`params` with `W + scale * (A @ B)` folded into every target kernel (a new dict)."""
    merged = jax.tree.map(lambda x: x, params)
    for keys in _target_paths(params, config.targets):
        name = _path_name(keys)
        if name not in lora:
            raise ConfigError(f"LoRA weights have no entry for {name}; were they made for another model?")
        parent = _get(merged, keys[:-1])
        kernel = parent["kernel"]
        delta = (lora[name]["a"] @ lora[name]["b"]) * config.scale
        parent["kernel"] = (kernel.astype(jnp.float32) + delta.reshape(kernel.shape)).astype(kernel.dtype)
    return merged
