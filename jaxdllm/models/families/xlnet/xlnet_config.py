"""XLNet's config: `XLNetConfig`, a `ModelConfig` with XLNet's own settings, and the presets.

The shared fields keep their meaning: `embed_dim` is `d_model`, `num_heads` `n_head` (= `num_kv_heads`:
no grouped queries), `head_dim` `d_head` (= `d_model / n_head`, as transformers requires), `mlp_dim`
`d_inner`, `norm_eps` `layer_norm_eps`; the LM head is always tied (`tie_embeddings`), the attention
is whatever `perm_mask` says (`attention = "bidirectional"` when none is given). RoPE fields are
unused (positions enter through Transformer-XL's relative sinusoids).
"""

from __future__ import annotations

import dataclasses

from jaxdllm.errors import ConfigError
from jaxdllm.models.config import AttentionMode, ModelConfig

# The published tokenizer (xlnet-base-cased's SentencePiece vocabulary) and its `<mask>` id, which
# ASSD's checkpoints (therealgabeguo/ASARM) decode with.
VOCAB_SIZE = 32000
MASK_ID = 6
ACTIVATIONS = ("gelu", "gelu_new", "relu", "silu", "swish")


@dataclasses.dataclass(frozen=True)
class XLNetConfig(ModelConfig):
    """A `ModelConfig` of an XLNet model (`jaxdllm.models.families.xlnet.modeling.XLNetLM`).

    Attributes (beyond `ModelConfig`'s):
      ff_activation: the feed-forward activation (`ff_activation`: `gelu` is the exact erf GELU,
        `gelu_new` the tanh approximation, `relu`, `silu` / `swish`).
      clamp_len: relative distances are clamped to `[-clamp_len, clamp_len]`; -1 (default): no clamp.
    """

    checkpoint_format: str = "xlnet"
    model_type: str = "xlnet"
    attention: AttentionMode = "bidirectional"
    tie_embeddings: bool = True
    norm_eps: float = 1e-12
    ff_activation: str = "gelu"
    clamp_len: int = -1

    def __post_init__(self):
        super().__post_init__()
        if self.num_heads * self.head_dim != self.embed_dim:
            raise ConfigError(f"XLNet's heads split the width: num_heads ({self.num_heads}) x head_dim "
                              f"({self.head_dim}) must equal embed_dim ({self.embed_dim})")
        if self.num_kv_heads != self.num_heads:
            raise ConfigError(f"XLNet has no grouped-query attention: num_kv_heads ({self.num_kv_heads}) must "
                              f"equal num_heads ({self.num_heads})")
        if not self.tie_embeddings:
            raise ConfigError("XLNet's LM head is its word embedding (tied) plus a bias: tie_embeddings must be True")
        if self.attention != "bidirectional":
            raise ConfigError(f"XLNet attends as its perm_mask says (bidirectional without one); attention must be "
                              f"'bidirectional', got {self.attention!r}")
        if self.ff_activation not in ACTIVATIONS:
            raise ConfigError(f"ff_activation {self.ff_activation!r} is not supported; use one of {ACTIVATIONS}")
        if not isinstance(self.clamp_len, int) or (self.clamp_len < 0 and self.clamp_len != -1):
            raise ConfigError(f"clamp_len must be -1 (no clamp) or a non-negative integer, got {self.clamp_len!r}")
        if self.shift_logits:
            raise ConfigError("XLNet predicts each target from its own query: shift_logits must be False")


def xlnet_config(*, vocab_size: int, d_model: int, n_layer: int, n_head: int, d_inner: int,
                 max_position: int = 512, **fields) -> XLNetConfig:
    """An `XLNetConfig` from XLNet's own names (`d_model`, `n_layer`, `n_head`, `d_inner`; `d_head =
    d_model / n_head`); `fields`: any other `XLNetConfig` field (special ids, `norm_eps`, ...)."""
    if d_model % n_head:
        raise ConfigError(f"d_model ({d_model}) must be a multiple of n_head ({n_head})")
    return XLNetConfig(vocab_size=vocab_size, embed_dim=d_model, num_layers=n_layer, num_heads=n_head,
                       num_kv_heads=n_head, head_dim=d_model // n_head, mlp_dim=d_inner, max_position=max_position,
                       **fields)


# xlnet-base-cased's special ids (its config.json: bos 1, eos 2, pad 5) and its tokenizer's <mask> (6).
_PUBLISHED_IDS = dict(mask_token_id=MASK_ID, bos_token_id=1, eos_token_id=2, pad_token_id=5)

PRESETS = {
    # xlnet-base-cased (and its ASSD fine-tune therealgabeguo/ASARM, trained on rows of 512 tokens).
    "xlnet-base-cased": xlnet_config(vocab_size=VOCAB_SIZE, d_model=768, n_layer=12, n_head=12, d_inner=3072,
                                     max_position=512, **_PUBLISHED_IDS),
    # Tiny size for tests (random weights, fp32).
    "tiny-xlnet": xlnet_config(vocab_size=256, d_model=64, n_layer=2, n_head=4, d_inner=128, max_position=128,
                               mask_token_id=MASK_ID, bos_token_id=1, eos_token_id=2, pad_token_id=5),
}
CHECKPOINTS = {"xlnet/xlnet-base-cased": "xlnet-base-cased", "xlnet-base-cased": "xlnet-base-cased",
               "therealgabeguo/ASARM": "xlnet-base-cased"}
