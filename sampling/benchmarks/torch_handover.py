"""A jaxdllm model's weights handed to a PyTorch model on the same device, without a file.

    state = torch_state_dict(model)                      # name -> torch.Tensor, checkpoint layout
    hf = torch_module(lambda: Qwen2ForCausalLM(hf_config), state, device="cuda")

`torch_state_dict` takes each checkpoint tensor as `jaxdllm.checkpoint.hf_io.device_tensors` makes
it on the model's device and wraps it with `torch.from_dlpack`: torch reads the arrays JAX holds
(no copy; a transposed tensor is a new JAX array made once). `torch_module` builds the PyTorch
model with its parameters on the `meta` device (nothing allocated, no random initialisation; the
buffers, e.g. RoPE tables, are made on `device` as usual) and assigns the handed tensors to them.
A 26B model is so held once per layout (jaxdllm's and the checkpoint's), not three times.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from jaxdllm.checkpoint.hf_io import device_tensors


def torch_state_dict(model) -> dict:
    """`{checkpoint tensor name: torch.Tensor}` of a jaxdllm `Transformer` on one device, in the
    checkpoint's layout and the parameter dtype (each of its `hf_shape`), sharing JAX's memory."""
    import torch

    return {name: torch.from_dlpack(x) for name, x in device_tensors(model)}


@contextlib.contextmanager
def unset_parameters(device: str, dtype=None):
    """Modules made inside get parameters without values on `meta` and buffers on `device` (in
    `dtype`, default the current default dtype): no initialisation runs (transformers'
    `no_init_weights`), so a module that makes its parameters on an explicit device (the published
    LLaDA makes them on the CPU) costs neither the memory nor the time of random weights."""
    import torch

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers before 5
        from transformers.modeling_utils import no_init_weights

    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype or before)
    try:
        with torch.device(device), no_init_weights(), parameters_on_meta():
            yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def parameters_on_meta():
    """Modules made inside put their parameters on the `meta` device (shapes only) and keep their
    buffers where they are made: `nn.Module.register_parameter` moves each new parameter."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None:
            kind = type(module._parameters[name])
            module._parameters[name] = kind(module._parameters[name].to("meta"), requires_grad=False)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def tied_names(module) -> set[str]:
    """The parameters a transformers model ties to others (its `all_tied_weights_keys`, or the
    older `_tied_weights_keys`): `tie_weights()` sets them, no tensor is handed to them."""
    return set(getattr(module, "all_tied_weights_keys", None) or getattr(module, "_tied_weights_keys", None) or ())


def torch_module(build: Callable, state: dict, device: str, unused: tuple[str, ...] = ()):
    """`build()` made with unset parameters on `device` (`unset_parameters`, the state's dtype), `state`
    assigned to them, the weights the model ties to others tied (transformers'
    `all_tied_weights_keys`, e.g. a tied LM head), in eval mode with gradients off. Parameters
    under the name prefixes `unused` (a part the benchmark never runs, such as a vision tower) are
    zeros.

    Raises `ValueError` naming the parameters `state` does not give or the tensors the model has
    no place for.
    """
    import torch

    with unset_parameters(device, next(iter(state.values())).dtype):
        module = build()
    zeros = {n: torch.zeros(p.shape, dtype=p.dtype, device=device)
             for n, p in module.named_parameters() if n.startswith(unused) and n not in state} if unused else {}
    result = module.load_state_dict({**state, **zeros}, strict=False, assign=True)
    missing = [k for k in result.missing_keys if k not in tied_names(module)]
    if missing or result.unexpected_keys:
        raise ValueError(f"weights do not match the PyTorch model: missing {missing[:5]}, "
                         f"unexpected {list(result.unexpected_keys)[:5]}")
    if hasattr(module, "tie_weights"):
        module.tie_weights()
    still_meta = [n for n, p in module.named_parameters() if p.is_meta]
    if still_meta:
        raise ValueError(f"parameters left without weights: {still_meta[:5]}")
    return module.eval().requires_grad_(False)
