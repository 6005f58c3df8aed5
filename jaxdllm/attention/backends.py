"""Attention backends: a registry of implementations and the table `auto` picks from per platform.

A backend is a function `fn(q [B, Lq, H, D], k [B, Lk, Hkv, D], v, mask: MaskSpec, *, scale,
**options) -> [B, Lq, H, D]` that returns zeros for query rows with no visible key. Built in:

* `reference`: dense float32 softmax over the materialised mask (the definition).
* `xla`: `jax.nn.dot_product_attention(implementation="xla")` with a dense boolean mask.
* `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")` (NVIDIA GPUs; bf16/fp16, no
  segment ids or query offset; causal or no mask).
* `pallas`: the tile-skipping flash kernel (`triton_flash.py`), Pallas on Triton for NVIDIA GPUs;
  on a TPU `pallas` means `splash`. Elsewhere it runs in the Pallas interpreter (tests).
* `splash`: JAX's splash attention kernel (`tpu_splash.py`), Pallas Mosaic for TPUs, sharded with
  `shard_map` under a mesh; the Pallas interpreter elsewhere.

`auto` resolves per platform through `AUTO`: on a TPU `splash`; on an NVIDIA GPU per mask, from
`GPU_AUTO` (cuDNN where it is faster and can express the mask, the tile kernel for the structured
masks; `sampling/results/attention_benchmark_h100.json`); `reference` elsewhere. A new backend is
one module plus one `register_backend` call (and an `AUTO` entry if it should be the default
somewhere).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxdllm.attention.mask import MaskSpec
from jaxdllm.attention.platform import target_platform
from jaxdllm.attention.reference import reference_attention, xla_attention
from jaxdllm.attention.tpu_splash import splash_attention
from jaxdllm.attention.triton_flash import flash_attention
from jaxdllm.errors import ConfigError

Backend = Callable[..., jax.Array]

_BACKENDS: dict[str, Backend] = {}

# NVIDIA GPU, impl="auto": the backend per mask kind, from the H100 measurements in
# sampling/results/attention_benchmark_h100.json (which tests/attention/test_attention_backends.py reads to
# check this table): cuDNN is faster on dense and causal masks; the tile kernel is faster where it
# skips most tiles (block diffusion, Jacobi Forcing). Block-causal and tree (drafts over a cache:
# most key tiles past the prefix are empty) were not measured; they are structured like them, and
# cuDNN cannot express them. Multiverse Attention's per-token structure only the dense paths read (`xla`).
GPU_AUTO: dict[str, str] = {"bidirectional": "cudnn", "causal": "cudnn", "block_causal": "pallas",
                            "block_diffusion": "pallas", "jacobi_forcing": "pallas", "tree": "pallas",
                            "multiverse": "xla"}


def cudnn_can_run(mask: MaskSpec, q: jax.Array, k: jax.Array) -> bool:
    """Whether `jax.nn.dot_product_attention(implementation="cudnn")` expresses this call: bf16 or
    fp16, head_dim a multiple of 8 up to 128, no segment ids, no query offset, no sliding window, and for causal
    masks as many queries as keys."""
    if mask.kind not in ("bidirectional", "causal") or mask.q_segment_ids is not None or mask.window is not None:
        return False
    offset = mask.q_offset
    if isinstance(offset, jax.core.Tracer) or jnp.ndim(offset) or int(offset) != 0:
        return False
    d = q.shape[-1]
    return (q.dtype in (jnp.bfloat16, jnp.float16) and d % 8 == 0 and d <= 128
            and (mask.kind == "bidirectional" or q.shape[1] == k.shape[1]))


def gpu_auto(mask: MaskSpec | None, q: jax.Array | None, k: jax.Array | None) -> str:
    """`GPU_AUTO`'s choice for this call, `pallas` where cuDNN cannot express it."""
    if mask is None:
        return "pallas"
    choice = GPU_AUTO.get(mask.kind, "pallas")
    if choice == "cudnn" and (q is None or not cudnn_can_run(mask, q, k)):
        return "pallas"
    return choice


# platform (jax.default_backend()) -> the backend impl="auto" uses: a name, or a function of the
# call `(mask, q, k) -> name`.
AUTO: dict[str, str | Callable] = {"gpu": gpu_auto, "cuda": gpu_auto, "rocm": "xla", "tpu": "splash"}
AUTO_FALLBACK = "reference"


def register_backend(name: str, fn: Backend) -> None:
    """Make `fn` selectable as `attend(..., impl=name)` and `ModelConfig(attention_impl=name)`."""
    if name == "auto":
        raise ConfigError("'auto' is reserved: it picks a backend per platform (see AUTO)")
    _BACKENDS[name] = fn


def implementations() -> tuple[str, ...]:
    """Every accepted `impl` name: `auto` and the registered backends."""
    return ("auto", *_BACKENDS)


def resolve_impl(impl: str, backend: str | None = None, mask: MaskSpec | None = None, q: jax.Array | None = None,
                 k: jax.Array | None = None) -> str:
    """The registered backend `impl` names on platform `backend` (default: `target_platform()`, the
    platform being compiled for) for a call with `mask`, `q` and `k` (the GPU's choice depends on
    them)."""
    if impl not in implementations():
        raise ConfigError(f"attention impl must be one of {implementations()}, got {impl!r}")
    platform = backend or target_platform()
    if impl == "auto":
        choice = AUTO.get(platform, AUTO_FALLBACK)
        return choice(mask, q, k) if callable(choice) else choice
    if impl == "pallas" and platform == "tpu":  # the Triton kernel does not lower to Mosaic
        return "splash"
    return impl


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: MaskSpec, *,
           impl: str = "auto", scale: float | None = None, **options) -> jax.Array:
    """Attention of `q [B, Lq, H, D]` over `k, v [B, Lk, Hkv, D]` under `mask`; `[B, Lq, H, D]`.

    Rows with no visible key return zeros on every implementation. `options` are passed to the
    chosen backend (`block_sizes` tunes `pallas`; the dense paths ignore it), so a registered
    backend should accept `**options`.
    """
    if q.shape[2] % k.shape[2]:
        raise ConfigError(f"query heads {q.shape[2]} must be a multiple of kv heads {k.shape[2]}")
    return _BACKENDS[resolve_impl(impl, mask=mask, q=q, k=k)](q, k, v, mask, scale=scale, **options)


def _dense(fn):
    def backend(q, k, v, mask, *, scale=None, **_tuning):  # tile settings mean nothing to a dense path
        return fn(q, k, v, mask, scale=scale)
    return backend


def cudnn_attention(q, k, v, mask, *, scale=None, **_tuning):
    """cuDNN's fused attention (`jax.nn.dot_product_attention`), for the calls `cudnn_can_run`
    accepts; every query sees a key there, so no row needs zeroing."""
    if not cudnn_can_run(mask, q, k):
        raise ConfigError("cudnn attention needs bf16/fp16, head_dim <= 128, a causal or no mask, no segment "
                         "ids and no query offset; use impl='pallas' or 'auto'")
    return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=mask.kind == "causal",
                                        implementation="cudnn")


register_backend("reference", _dense(reference_attention))
register_backend("xla", _dense(xla_attention))
register_backend("cudnn", cudnn_attention)
register_backend("pallas", flash_attention)
register_backend("splash", splash_attention)
