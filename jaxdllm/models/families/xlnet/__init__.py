"""XLNet (Yang et al. 2019): an any-order language model with two-stream attention, the model of
Any-Subset Speculative Decoding (ASSD; Guo & Ermon, arXiv 2504.20456). A family with a model of its
own, in four modules:

* `xlnet_config`: `XLNetConfig` (a `ModelConfig` with `ff_activation` and `clamp_len`), the presets.
* `modeling`: `XLNetLM`, transformers' `XLNetLMHeadModel`: content and query streams over
  Transformer-XL relative positions, post-LayerNorm layers, the tied head with its bias.
  `XLNetLM.two_stream(input_ids, perm_mask, target_positions) -> [B, K, V]` is the any-order query.
* `hf_format`: config.json reading and writing, the tensor table.
* `orders`: `order_perm_mask`, the permutation mask of ASSD's orders [visible | masked ascending].

Published size (preset `xlnet-base-cased`; `therealgabeguo/ASARM` is its ASSD fine-tune): 12 layers of
width 768, 12 heads of 64, feed-forward 3072 (GELU), vocabulary 32,000, about 117M parameters; ids:
`<mask>` 6, bos 1, eos 2, pad 5.
"""

from __future__ import annotations

from jaxdllm.models.families.family import Family
from jaxdllm.models.families.xlnet.hf_format import IGNORED, MODEL_TYPES, config_from_hf, config_to_hf, tensor_table
from jaxdllm.models.families.xlnet.modeling import XLNetLayer, XLNetLM, relative_sinusoids
from jaxdllm.models.families.xlnet.orders import order_perm_mask
from jaxdllm.models.families.xlnet.xlnet_config import CHECKPOINTS, MASK_ID, PRESETS, XLNetConfig, xlnet_config

PRESET = "assd"  # Any-Subset Speculative Decoding, its sampler (jaxdllm.decoding)


def default_preset(config: XLNetConfig) -> str:
    """`assd`: Any-Subset Speculative Decoding, the sampler of an any-order model."""
    return PRESET


FAMILY = Family(name="xlnet", model_types=MODEL_TYPES, checkpoint_format="xlnet", presets=PRESETS,
                config_from_hf=config_from_hf, config_to_hf=config_to_hf, tensor_table=tensor_table,
                checkpoints=CHECKPOINTS, config_class=XLNetConfig, model=XLNetLM, preset=default_preset,
                ignored_tensors=IGNORED, ignored_why="the LM head's weight (tied to the word embedding)",
                scores_likelihood=False)

__all__ = ["FAMILY", "MASK_ID", "XLNetConfig", "XLNetLM", "XLNetLayer", "config_from_hf", "config_to_hf",
           "order_perm_mask", "relative_sinusoids", "tensor_table", "xlnet_config"]
