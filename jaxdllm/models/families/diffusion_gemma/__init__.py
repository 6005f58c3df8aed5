"""DiffusionGemma (Google DeepMind): uniform-noise block diffusion on Gemma 4 mixture-of-experts
layers. A family with a model of its own, in four modules:

* `gemma_config`: `Gemma4Layers` (the layer pattern and numerics) on `DiffusionGemmaConfig`, a
  `ModelConfig` subclass; the presets.
* `modeling`: Gemma 4's layer (`Gemma4Block`), `SelfConditioning` and `DiffusionGemmaTransformer`,
  the shared `Transformer` with those layers, a self-conditioned input, the encoder/denoiser modes
  (`encode=`, `self_conditioning=`, `self_conditioning_mask=`) and a softcapped head.
* `hf_format`: config.json reading and writing, the tensor table, the vision tensors it skips.
* `generation`: its default sampler (`diffusiongemma`) and `generation_config.json` reading.

Published size (preset `diffusiongemma-26b-a4b`, `google/diffusiongemma-26B-A4B-it`): 25.25B text
parameters, ~3.8B active per token; 30 layers of width 2816, 16 query heads; sliding layers (every
layer but 5, 11, 17, 23, 29) 8 K/V heads of 256 with a window of 1024 and RoPE theta 1e4; full
layers 2 K/V heads of 512, K = V, proportional RoPE theta 1e6 on a quarter of the frequencies; a
dense GeLU-tanh MLP of 2112 and 128 experts of 704 (8 per token) in every layer; vocabulary 262,144,
tied embeddings, logits softcapped at 30. Canvas (block) 256. Ids: pad 0, eos 1, bos 2; generation
stops at any of 1, 106, 50.
"""

from __future__ import annotations

from jaxdllm.models.families.diffusion_gemma.gemma_config import (CANVAS, CHECKPOINTS, PRESETS, VOCAB_SIZE,
                                                                   DiffusionGemmaConfig, Gemma4Layers,
                                                                   published_layer_types)
from jaxdllm.models.families.diffusion_gemma.generation import STOP_IDS, default_preset, generation_settings
from jaxdllm.models.families.diffusion_gemma.hf_format import (MODEL_TYPES, TINY_VISION, VISION_PREFIXES,
                                                                config_from_hf, config_to_hf, tensor_table)
from jaxdllm.models.families.diffusion_gemma.modeling import DiffusionGemmaTransformer, Gemma4Block, SelfConditioning
from jaxdllm.models.families.family import Family

FAMILY = Family(name="diffusion_gemma", model_types=MODEL_TYPES, checkpoint_format="diffusion_gemma",
                presets=PRESETS, config_from_hf=config_from_hf, config_to_hf=config_to_hf, tensor_table=tensor_table,
                checkpoints=CHECKPOINTS, holds=lambda c: c.checkpoint_format == "diffusion_gemma",
                writes_special_ids=True, config_class=DiffusionGemmaConfig, model=DiffusionGemmaTransformer,
                preset=default_preset, generation_settings=generation_settings, ignored_tensors=VISION_PREFIXES,
                ignored_why="vision tensors (jaxdllm runs DiffusionGemma on text)", fixed_block=True,
                scores_likelihood=False)

__all__ = ["CANVAS", "FAMILY", "STOP_IDS", "VOCAB_SIZE", "DiffusionGemmaConfig", "DiffusionGemmaTransformer",
           "Gemma4Block", "Gemma4Layers", "SelfConditioning", "config_from_hf", "config_to_hf",
           "published_layer_types", "tensor_table"]
