"""`RunOptions`: how a `Transformer` runs, apart from what it is (`ModelConfig`).

The same checkpoint runs in bfloat16 on a TPU with the splash kernel and scanned layers, or in
float32 on a CPU with the reference attention; none of that changes the architecture. A model
holds its options in one place (`model.options`); `with_options` gives a view of the same
parameters that runs differently.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from jaxdllm.errors import ConfigError
from jaxdllm.validation import check_fields

DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots")
MOE_IMPLS = ("auto", "ragged_dot", "pallas", "tiles", "dense")
QUANTIZATIONS = ("int8",)  # weight-only; see jaxdllm/models/quantize.py
WEIGHT_FORMATS = DTYPES + QUANTIZATIONS  # how a memory plan or a decoding setup stores the weights
# Options that fix the parameters' layout: a model built with one value cannot run with another.
LAYOUT_OPTIONS = ("param_dtype", "scan_layers", "quantization")


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How a model's parameters are stored and its forward is computed.

    Attributes:
      param_dtype: storage dtype of the parameters (`float32`, `bfloat16`, `float16`).
      dtype: compute dtype of the matmuls. Norms, RoPE and softmax always run in float32.
      attention_impl: attention implementation, one of `jaxdllm.attention.implementations()`.
      scan_layers: store the layers' parameters stacked along a leading `layers` axis and run them
        with one `jax.lax.scan` (one compiled layer instead of `num_layers`: faster compiles at
        depth). Checkpoints import and export the same either way.
      remat: rematerialise activations in the backward pass, per layer: `none`, `full` (keep only
        each layer's input) or `dots` (keep matmul outputs without batch dims,
        `jax.checkpoint_policies.dots_with_no_batch_dims_saveable`). Decoding never differentiates
        and runs with `none`.
      quantization: `None` (float weights) or `"int8"`: weight-only int8 for every linear layer and
        the LM head, one scale per output channel (`jaxdllm.models.quantize`).
      moe_impl: how routed experts run (`jaxdllm.models.moe.grouped_swiglu`): `auto` (on TPU and GPU
        XLA's `ragged_dot`; on a CPU `tiles`, or `dense` at small shapes and where the expert kernels
        are spread over a mesh), `ragged_dot` (XLA's everywhere), `pallas` (the grouped matmul kernel of
        `jaxdllm.models.grouped_matmul`: Triton on one NVIDIA GPU, not partitioned over a mesh;
        interpreted elsewhere, for tests), `tiles` (each expert on its own rows, padded to whole
        row tiles, one tile after another in a loop: what XLA's CPU backend runs well) or `dense`
        (every expert on every token, mixed by the routing weights).
    """

    param_dtype: str = "float32"
    dtype: str = "float32"
    attention_impl: str = "auto"
    scan_layers: bool = False
    remat: str = "none"
    quantization: str | None = None
    moe_impl: str = "auto"

    def __post_init__(self):
        check_fields(self, "run option ")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ConfigError(f"{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"quantization must be None or one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.moe_impl not in MOE_IMPLS:
            raise ConfigError(f"moe_impl must be one of {MOE_IMPLS}, got {self.moe_impl!r}")
        if self.remat not in REMAT_POLICIES:
            raise ConfigError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        from jaxdllm.attention import implementations  # local: attention imports nothing from models

        if self.attention_impl not in implementations():
            raise ConfigError(
                f"attention_impl must be one of {implementations()}, got {self.attention_impl!r}")

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The option names (what `from_pretrained(**options)` and a recipe's `[model]` accept)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @property
    def jnp_param_dtype(self):
        return jnp.dtype(self.param_dtype)

    @property
    def jnp_dtype(self):
        return jnp.dtype(self.dtype)

    def replace(self, **changes: Any) -> "RunOptions":
        """A copy with `changes` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def split_options(settings: dict) -> tuple[dict, dict]:
    """`(model config fields, run options)` of one dict of settings (a recipe's `[model]` table,
    `from_pretrained` keywords)."""
    names = set(RunOptions.fields())
    return ({k: v for k, v in settings.items() if k not in names},
            {k: v for k, v in settings.items() if k in names})
