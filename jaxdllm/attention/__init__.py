"""One attention entry point (`attend`) over structured masks (`MaskSpec`); implementations are
registered backends (`backends.py`), chosen per call, per model config, or per platform (`auto`)."""

from jaxdllm.attention.backends import AUTO, GPU_AUTO, attend, implementations, register_backend, resolve_impl
from jaxdllm.attention.mask import MASK_KINDS, MaskSpec
from jaxdllm.attention.reference import reference_attention, xla_attention
from jaxdllm.attention.tpu_splash import splash_attention
from jaxdllm.attention.triton_flash import BlockSizes, flash_attention

__all__ = ["AUTO", "BlockSizes", "GPU_AUTO", "MASK_KINDS", "MaskSpec", "attend", "flash_attention", "implementations",
           "reference_attention", "register_backend", "resolve_impl", "splash_attention", "xla_attention"]
