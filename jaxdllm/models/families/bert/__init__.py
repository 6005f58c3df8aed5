"""BERT (Devlin et al. 2019) as a masked diffusion model: GenMol's backbone (NVIDIA, arXiv 2501.06158),
transformers' `BertForMaskedLM`. A family with a model of its own, in four modules:

* `bert_config`: `BertConfig` (a `ModelConfig` with `type_vocab_size` and `hidden_act`), the presets.
* `modeling`: `BertLM`: absolute position and token-type embeddings, post-LayerNorm layers with biased
  q/k/v/o, the MLM head (dense, act, LayerNorm, the tied decoder plus its bias), on the shared forward.
* `hf_format`: config.json reading and writing, the tensor table.
* `genmol_checkpoint`: `convert_genmol_checkpoint`, GenMol's Lightning checkpoint (EMA weights) to a
  transformers folder (`python -m jaxdllm.models.families.bert.genmol_checkpoint CKPT OUT`).

Published size (preset `genmol-89m`; `nvidia/NV-GenMol-89M-v1`): 12 layers of width 768, 12 heads of
64, feed-forward 3072 (GELU), 256 positions, the SAFE vocabulary of 1880; about 87M parameters; ids
`[UNK]` 0, `[CLS]` 1 (bos), `[SEP]` 2 (eos), `[PAD]` 3, `[MASK]` 4.
"""

from __future__ import annotations

from jaxdllm.models.families.bert.bert_config import (CHECKPOINTS, GENMOL_IDS, PRESETS, BertConfig,
                                                      bert_config)
from jaxdllm.models.families.bert.hf_format import IGNORED, MODEL_TYPES, config_from_hf, config_to_hf, tensor_table
from jaxdllm.models.families.bert.modeling import BertAttention, BertLayer, BertLM
from jaxdllm.models.families.family import Family

PRESET = "genmol"  # GenMol's confidence sampler (jaxdllm.decoding)


def default_preset(config: BertConfig) -> str:
    """`genmol`: GenMol's sampler (one token per step by confidence with annealed Gumbel noise)."""
    return PRESET


FAMILY = Family(name="bert", model_types=MODEL_TYPES, checkpoint_format="bert", presets=PRESETS,
                config_from_hf=config_from_hf, config_to_hf=config_to_hf, tensor_table=tensor_table,
                checkpoints=CHECKPOINTS, config_class=BertConfig, model=BertLM, preset=default_preset,
                ignored_tensors=IGNORED,
                ignored_why="the MLM decoder (the word embedding and cls.predictions.bias, tied), the position and "
                            "token-type id buffers, a pretraining checkpoint's pooler and next-sentence head")

__all__ = ["FAMILY", "GENMOL_IDS", "BertAttention", "BertConfig", "BertLM", "BertLayer", "bert_config",
           "config_from_hf", "config_to_hf", "tensor_table"]
