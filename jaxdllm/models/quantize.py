"""Weight-only int8 for the linear layers and the LM head, on qwix's quantized arrays.

A quantized projection stores its kernel as int8 (`kernel`, same shape and logical axes as the
float kernel) and one absmax scale per output channel (`kernel_scale`: the kernel's shape with
every contracted axis of size 1). The matmul dequantizes into the compute dtype on the fly
(XLA fuses the convert into the dot), so activations, norms, the embedding table
and the K/V cache stay in their float dtypes. Weight bytes of an 8B model drop from 16 GB (bf16)
to about 8.5 GB: LLaDA-8B fits one 16 GB TPU v5e chip.

Why qwix's arrays and not its model rewriting (`qwix.quantize_model` with a `PtqProvider`): that
path finds weights by intercepting the model's `__call__` and matching arrays to the current
module's params. Our layers run from split state (`nnx.merge` inside `jax.lax.scan` and the
decoding loop), so on a jaxdllm `Transformer` it quantizes only the LM head and then fails on
the head's cast (qwix 0.1.8: "Unsupported type: QArray"). Here the layer owns its int8 params,
and qwix does the numerics: `qwix.quantize` (absmax calibration) and `qwix.dequantize`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

SCALE_DTYPE = jnp.float32  # scales are tiny (one per output channel); keep them exact


def contracted_axes(eqn: str) -> tuple[int, ...]:
    """Axes of the kernel (second operand of `eqn`, e.g. `"bld,dhk->blhk"`) summed over."""
    x_spec, rest = eqn.split(",")
    kernel_spec = rest.split("->")[0]
    return tuple(i for i, c in enumerate(kernel_spec) if c in x_spec)


def scale_shape(kernel_shape: tuple[int, ...], contracted: tuple[int, ...]) -> tuple[int, ...]:
    """The per-output-channel scale's shape: the kernel's with contracted axes of size 1."""
    return tuple(1 if i in contracted else n for i, n in enumerate(kernel_shape))


def quantize_kernel(w: jax.Array | np.ndarray, scale_shape_: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """`w [..]` float -> `(qvalue int8 [..], scale float32 scale_shape_)`, symmetric absmax per
    output channel (qwix: scale = max|w| / 127.5, round to nearest, clip to [-128, 127]): every
    axis where `scale_shape_` equals `w`'s size keeps its own scale.

    `w` may carry leading axes the scale lacks (a stacked `layers` axis): they keep their own
    scales too.

    Always compiled, eagerly called or inside a jitted loader: each channel's largest weight sits
    exactly on a rounding tie (|w| / scale = 127.5), which an eager division and XLA's compiled one
    (JAX 0.12 onwards) break differently (-128 against -127), so one program makes a model quantized
    in memory (`quantize_weights`) and one quantized as it loads (`from_pretrained`) the same.
    """
    return _quantize_kernel(w, tuple(scale_shape_))


@functools.partial(jax.jit, static_argnums=1)
def _quantize_kernel(w, scale_shape_):
    import qwix  # local: only int8 models need it

    w = jnp.asarray(w)
    lead = w.ndim - len(scale_shape_)
    channelwise = [i for i in range(w.ndim)
                   if i < lead or scale_shape_[i - lead] == w.shape[i] and w.shape[i] > 1]
    q = qwix.quantize(w.astype(jnp.float32), jnp.int8, channelwise_axes=channelwise)
    return q.qvalue, q.scale.astype(SCALE_DTYPE)


def dequantize(qvalue: jax.Array, scale: jax.Array, dtype=jnp.float32) -> jax.Array:
    """`qvalue * scale` in `dtype` (`qwix.dequantize`): the float kernel an int8 one stands for.

    The layers einsum this kernel exactly as they einsum a float one, so an int8 model computes
    what a float model holding `qvalue * scale` computes; XLA fuses the convert and multiply into
    the matmul. (`qwix.einsum` does the same dequantize-then-dot for weight-only int8, but its
    operand order makes XLA's CPU runtime emit a bf16 x bf16 -> f32 dot it cannot run, for 2-D
    kernels in bf16.)
    """
    import qwix  # local: only int8 models need it

    return qwix.dequantize(qwix.QArray(qvalue=qvalue, scale=scale.astype(dtype)))


def scale_path(path: tuple) -> tuple | None:
    """The flat-state path of the scale that goes with the kernel at `path` (`(..., "kernel")` or
    `("lm_head",)`), or None when `path` is no quantizable kernel."""
    if path and path[-1] == "kernel":
        return path[:-1] + ("kernel_scale",)
    if path == ("lm_head",):
        return ("lm_head_scale",)
    return None


def quantize_weights(model):
    """An int8 copy of a float `Transformer`: every linear layer's kernel and the LM head become
    int8 with per-output-channel scales; everything else is copied. The input is left as is.

    For checkpoints on disk, `from_pretrained(path, quantization="int8")` quantizes tensor by
    tensor as they load, without ever holding the float model.
    """
    from flax import nnx

    if model.options.quantization is not None:
        return model
    options = model.options.replace(quantization="int8")
    graphdef, state = nnx.split(nnx.eval_shape(lambda: type(model)(model.config, options, rngs=nnx.Rngs(0))))
    target = dict(nnx.to_flat_state(state))
    source = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    for path, var in target.items():
        if path in source:
            value = source[path].get_value()
            scale_at = scale_path(path)
            if scale_at in target:
                value, scale = quantize_kernel(value, tuple(target[scale_at].get_value().shape))
                target[scale_at].set_value(scale)
            var.set_value(value)
    return nnx.merge(graphdef, state)
