"""WeDLM (Tencent WeChat AI, `tencent/WeDLM-{7B,8B}-{Base,Instruct}`): diffusion decoding under a plain
causal mask. The weights and tensor names are the base model's (Qwen2.5-7B or Qwen3-8B); attention is
causal; a masked slot reads its own logit (no shift). Decoding reorders each window so its decided
tokens come first (keeping their RoPE positions), which is why the committed prefix's K/V are ordinary
causal K/V and a prefix cache is exact (sampler preset "wedlm", `jaxdllm.decoding.wedlm_canvas`).

Published checkpoints (config.json: `model_type` "wedlm", `architectures` ["WeDLMForCausalLM"], an
`auto_map` to its remote code, `qk_norm`, `attention_bias`, `layer_types`, 16,384 positions):
- WeDLM-7B(-Instruct), from Qwen2.5-7B: 28 layers, width 3584, 28 / 4 heads of 128, SwiGLU 18944,
  vocabulary 152,064, q/k/v biases (`attention_bias` true, `qk_norm` false).
- WeDLM-8B(-Instruct), from Qwen3-8B: 36 layers, width 4096, 32 / 8 heads of 128, SwiGLU 12288,
  vocabulary 151,936, q/k RMSNorm (`qk_norm` true, `attention_bias` false).
Both: untied embeddings, RMSNorm eps 1e-6, RoPE theta 1e6, EOS / pad 151643, turns end at `<|im_end|>`
151645.

The mask token. The released config.json files say `mask_token_id: null`; the published engine and
trainer then fall back to 151665. In Qwen2.5's vocabulary that is the first id past its 22 special
tokens (151643-151664), free for a mask; in Qwen3's it is `<tool_response>`, and a port of WeDLM-8B
uses 151666 instead. So the id is not trusted from a default: `jaxdllm.checkpoint.folder` reads it
from the checkpoint's own tokenizer (`tokenizer_config.json` `mask_token`) when config.json has none,
and a WeDLM checkpoint whose tokenizer names no mask either is refused by the sampler with the fix
(`from_pretrained(..., mask_token_id=ID)`). The presets carry 151665 for the 7B (Qwen2.5 vocabulary)
and no mask for the 8B.

config.json: WeDLM's released form (above), read and written with its own flags; other keys
(`layer_types`, `auto_map`, ...) are kept through `ModelConfig.source_config`. A conversion by a
jaxdllm recipe (`training/wedlm_tasks_cpu.toml`: `model_type = "wedlm"` on a Qwen2 checkpoint) is
written the same way, with its mask id. Tensors: the Hugging Face names
(`jaxdllm.models.families.tensors.HF_DECODER_NAMES`, with the q/k norms on a Qwen3 body).
"""

from __future__ import annotations

from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families import qwen3
from jaxdllm.models.families.config_json import read_hf_decoder, write_hf_decoder
from jaxdllm.models.families.family import Family
from jaxdllm.models.families.qwen2_llama import QWEN2_7B, QWEN_IDS, QWEN_IM_END
from jaxdllm.models.families.tensors import HF_DECODER_NAMES, TensorMapping, decoder_table

MODEL_TYPES = ("wedlm",)
ARCHITECTURE = "WeDLMForCausalLM"
QWEN2_MASK_ID = 151665  # the engine's fallback: the first free id of Qwen2.5's vocabulary
MAX_POSITION = 16384  # the released config.json files (the README says 32k)

_WEDLM = dict(attention="causal", shift_logits=False, max_position=MAX_POSITION, model_type="wedlm",
              eot_token_id=QWEN_IM_END, **QWEN_IDS)

PRESETS = {
    # WeDLM-7B(-Instruct) (from Qwen2.5-7B).
    "wedlm-7b": ModelConfig(**QWEN2_7B, mask_token_id=QWEN2_MASK_ID, **_WEDLM),
    # WeDLM-8B(-Instruct) (from Qwen3-8B); the mask comes from the checkpoint's tokenizer.
    "wedlm-8b": ModelConfig(**qwen3.QWEN3_8B, **_WEDLM),
    # Tiny size for tests (random weights, fp32): a tiny Qwen3 body.
    "tiny-wedlm": ModelConfig(**qwen3.TINY_QWEN3, attention="causal", max_position=512, model_type="wedlm",
                              mask_token_id=255),
}
CHECKPOINTS = {"tencent/WeDLM-7B-Base": "wedlm-7b", "tencent/WeDLM-7B-Instruct": "wedlm-7b",
               "tencent/WeDLM-8B-Base": "wedlm-8b", "tencent/WeDLM-8B-Instruct": "wedlm-8b"}


def config_from_hf(raw: dict, where: str) -> ModelConfig:
    """A `ModelConfig` from a WeDLM config.json: causal, logits not shifted, q/k/v biases and q/k norm as
    its `attention_bias` and `qk_norm` say; on a Qwen vocabulary a turn ends at `<|im_end|>` (151645)."""
    c = read_hf_decoder(raw, where, attention="causal", shift_logits=False)
    if c.vocab_size in (QWEN2_7B["vocab_size"], qwen3.VOCAB_SIZE):
        c = c.replace(eot_token_id=QWEN_IM_END)
    return c


def config_to_hf(c: ModelConfig, out: dict) -> None:
    """WeDLM's config.json keys into `out` (`mask_token_id` goes with the other special ids)."""
    write_hf_decoder(c, out, ARCHITECTURE)


def tensor_table(c: ModelConfig) -> list[TensorMapping]:
    """Every tensor of a WeDLM checkpoint (its body's Hugging Face names), in file order."""
    return decoder_table(c, HF_DECODER_NAMES)


FAMILY = Family(name="wedlm", model_types=MODEL_TYPES, checkpoint_format="hf", presets=PRESETS,
                config_from_hf=config_from_hf, config_to_hf=config_to_hf, tensor_table=tensor_table,
                checkpoints=CHECKPOINTS, preset=lambda c: "wedlm")
