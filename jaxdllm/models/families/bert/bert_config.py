"""BERT's config: `BertConfig`, a `ModelConfig` with BERT's own settings, and the presets.

The shared fields keep their meaning: `embed_dim` is `hidden_size`, `num_heads` `num_attention_heads`
(= `num_kv_heads`: no grouped queries), `head_dim` `hidden_size / num_attention_heads`, `mlp_dim`
`intermediate_size`, `max_position` `max_position_embeddings` (the rows of the absolute position
table: it fixes a tensor's shape), `norm_eps` `layer_norm_eps`. q/k/v/o, the feed-forward and the
head all carry biases (`qkv_bias`, `out_bias`, `mlp_bias` are always True), the MLM decoder is the
word embedding (`tie_embeddings`), the attention is bidirectional. RoPE fields are unused (positions
enter through the position table).
"""

from __future__ import annotations

import dataclasses

from jaxdllm.errors import ConfigError
from jaxdllm.models.config import AttentionMode, ModelConfig

# `hidden_act` values, as transformers' ACT2FN names them: `gelu` is the exact erf GELU, `gelu_new`
# and `gelu_pytorch_tanh` the tanh approximation.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")

# GenMol's SAFE tokenizer (datamol-io/safe-gpt; V2 adds `<` and `>`): its vocabulary sizes and ids.
GENMOL_VOCAB_SIZES = (1880, 1882)
GENMOL_IDS = dict(mask_token_id=4, bos_token_id=1, eos_token_id=2, pad_token_id=3)  # [MASK] [CLS] [SEP] [PAD]


@dataclasses.dataclass(frozen=True)
class BertConfig(ModelConfig):
    """A `ModelConfig` of a BERT masked LM (`jaxdllm.models.families.bert.modeling.BertLM`,
    transformers' `BertForMaskedLM`).

    Attributes (beyond `ModelConfig`'s):
      type_vocab_size: rows of the token-type table (`type_vocab_size`); jaxdllm always embeds type 0,
        the rows are kept so checkpoints convert both ways.
      hidden_act: the feed-forward's and the head transform's activation (`hidden_act`, one of
        `ACTIVATIONS`).
    """

    checkpoint_format: str = "bert"
    model_type: str = "bert"
    attention: AttentionMode = "bidirectional"
    tie_embeddings: bool = True
    qkv_bias: bool = True
    out_bias: bool = True
    mlp_bias: bool = True
    norm_eps: float = 1e-12
    max_position: int = 512
    type_vocab_size: int = 2
    hidden_act: str = "gelu"

    def __post_init__(self):
        super().__post_init__()
        if self.num_heads * self.head_dim != self.embed_dim:
            raise ConfigError(f"BERT's heads split the width: num_heads ({self.num_heads}) x head_dim "
                              f"({self.head_dim}) must equal embed_dim ({self.embed_dim})")
        if self.num_kv_heads != self.num_heads:
            raise ConfigError(f"BERT has no grouped-query attention: num_kv_heads ({self.num_kv_heads}) must "
                              f"equal num_heads ({self.num_heads})")
        if not self.tie_embeddings:
            raise ConfigError("BERT's MLM decoder is its word embedding (tied) plus a bias: tie_embeddings must "
                              "be True")
        if not (self.qkv_bias and self.out_bias and self.mlp_bias):
            raise ConfigError("BERT's linears all carry biases: qkv_bias, out_bias and mlp_bias must be True")
        if self.attention != "bidirectional":
            raise ConfigError(f"BERT is a bidirectional encoder: attention must be 'bidirectional', got "
                              f"{self.attention!r}")
        if self.shift_logits:
            raise ConfigError("BERT predicts each masked position from its own output: shift_logits must be False")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported; use one of {ACTIVATIONS}")
        if isinstance(self.type_vocab_size, bool) or not isinstance(self.type_vocab_size, int) \
                or self.type_vocab_size < 1:
            raise ConfigError(f"type_vocab_size must be a positive integer (BERT embeds token type 0), got "
                              f"{self.type_vocab_size!r}")
        if self.experts is not None or self.qk_norm:
            raise ConfigError("BERT has dense feed-forward layers and no q/k norm: experts must be None and "
                              "qk_norm False")


def bert_config(*, vocab_size: int, hidden_size: int, num_hidden_layers: int, num_attention_heads: int,
                intermediate_size: int, max_position_embeddings: int = 512, **fields) -> BertConfig:
    """A `BertConfig` from BERT's own names (`head_dim = hidden_size / num_attention_heads`); `fields`:
    any other `BertConfig` field (special ids, `norm_eps`, `hidden_act`, `type_vocab_size`, ...)."""
    if hidden_size % num_attention_heads:
        raise ConfigError(f"hidden_size ({hidden_size}) must be a multiple of num_attention_heads "
                          f"({num_attention_heads})")
    return BertConfig(vocab_size=vocab_size, embed_dim=hidden_size, num_layers=num_hidden_layers,
                      num_heads=num_attention_heads, num_kv_heads=num_attention_heads,
                      head_dim=hidden_size // num_attention_heads, mlp_dim=intermediate_size,
                      max_position=max_position_embeddings, **fields)


PRESETS = {
    # GenMol V1 (NVIDIA, arXiv 2501.06158; configs/base.yaml `model:`): 12 layers of 768, 12 heads, FFN 3072,
    # 256 positions, the SAFE vocabulary of 1880; about 87.3M parameters with the tied decoder.
    "genmol-89m": bert_config(vocab_size=GENMOL_VOCAB_SIZES[0], hidden_size=768, num_hidden_layers=12,
                              num_attention_heads=12, intermediate_size=3072, max_position_embeddings=256,
                              **GENMOL_IDS),
    # Tiny size for CPU runs and tests (random weights, fp32), GenMol's special ids.
    "tiny-bert": bert_config(vocab_size=256, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                             intermediate_size=1024, max_position_embeddings=128, **GENMOL_IDS),
}
CHECKPOINTS = {"nvidia/NV-GenMol-89M-v1": "genmol-89m"}
