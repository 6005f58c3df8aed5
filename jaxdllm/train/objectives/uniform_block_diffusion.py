"""DiffusionGemma's training objective (`uniform_block_diffusion`): uniform-noise block diffusion
with the encoder's causal loss, on one weight set (`algorithms.md` §9).

Per example `t ~ U(t_min, 1)`; each answer token (`target_mask`) is replaced by a uniformly random
token with probability t. The causal encoder runs over the clean row and writes its K/V; the
denoiser runs over the noisy row, canvases of `block_size` starting at each example's prompt end
(as at decoding time: the first canvas follows the prompt), each canvas bidirectional over itself
and seeing the encoder's clean K/V before it (`MaskSpec(kind="denoise_canvas")`; sliding layers
see the W - 1 clean tokens before the canvas).

Self-conditioning: with probability `self_conditioning` per example, a first denoiser pass (no
self-conditioning, gradient stopped, as Analog Bits does) gives logits that condition the second;
the other examples get the zero signal. The loss is the mean cross-entropy over every answer
token (corrupted or not, flat weight; `reweight=True` divides each example's by `1 - t`, the
offered variant, capped at 1/t_min) plus `encoder_weight` times the encoder's next-token loss on
the answer. Rows hold one example each (no packing).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.attention import MaskSpec
from jaxdllm.errors import ConfigError
from jaxdllm.models.families import family_of
from jaxdllm.train.objectives.base import Objective, Views, accuracy, token_ce


@dataclasses.dataclass(frozen=True)
class UniformBlockDiffusion(Objective):
    """Settings: `block_size` (the canvas; default the model's), `t_min`, `self_conditioning` (the
    probability of the two-pass step), `encoder_weight`, `reweight`."""

    block_size: int | None = None
    t_min: float = 1e-3
    self_conditioning: float = 0.5
    encoder_weight: float = 1.0
    reweight: bool = False
    name = "uniform_block_diffusion"
    packing = False

    @property
    def stacked_views(self) -> int:
        """Two forwards keep activations for the backward: the encoder's and the (second) denoiser's
        (the first self-conditioning pass is gradient-stopped)."""
        return 2

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.t_min < 1 or not 0 <= self.self_conditioning <= 1 or self.encoder_weight < 0:
            raise ConfigError("[objective] needs 0 < t_min < 1, 0 <= self_conditioning <= 1 and encoder_weight >= 0")

    def check(self, config):
        # the model must run as an encoder and as a self-conditioned denoiser (its family's forward inputs)
        if not {"encode", "self_conditioning"} <= set(family_of(config).model.forward_inputs):
            raise ConfigError("objective 'uniform_block_diffusion' trains DiffusionGemma models (an encoder and a "
                              f"self-conditioned denoiser on one weight set); this model is {config.model_type!r}")
        if not (self.block_size or config.block_size):
            raise ConfigError("objective 'uniform_block_diffusion' needs a canvas length: set [objective] block_size "
                              "or the model's block_size")

    def forward(self, views: Views, tokens, noisy, positions, seg, prompt_len, use_sc):
        """The encoder over the clean rows `tokens [B, L]` and the denoiser over `noisy [B, L]`
        (canvases from `prompt_len [B]`), self-conditioned for rows `use_sc [B]` by a first,
        gradient-stopped pass. Returns `(the encoder's ForwardOutput, denoiser logits [B, L, V])`."""
        config, (b, n) = views.config, tokens.shape
        encoded = views.forward(tokens, positions, MaskSpec(kind="causal", q_offset=n, q_segment_ids=seg),
                                views.init_cache(b, 2 * n), encode=True)
        mask = MaskSpec(kind="denoise_canvas", block_size=self.block_size or config.block_size, prefix_len=prompt_len,
                        q_segment_ids=seg)

        def denoise(sc, sc_mask):
            return views.forward(noisy, positions, mask, encoded.cache, self_conditioning=sc,
                                 self_conditioning_mask=sc_mask).logits

        if self.self_conditioning == 0:
            return encoded, denoise(None, None)
        return encoded, denoise(jax.lax.stop_gradient(denoise(None, None)), use_sc)

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        config = views.config
        tokens, seg, positions = batch["tokens"], batch["segment_ids"], batch["positions"]
        target = batch["target_mask"] & (seg > 0)
        b, n = tokens.shape
        k_t, k_noise, k_tok, k_sc = jax.random.split(key, 4)
        t = jax.random.uniform(k_t, (b, 1), minval=self.t_min, maxval=1.0)
        corrupt = (jax.random.uniform(k_noise, tokens.shape) < t) & target
        noisy = jnp.where(corrupt, jax.random.randint(k_tok, tokens.shape, 0, config.vocab_size), tokens)

        prompt_len = (batch["prompt_mask"] & (seg > 0)).sum(1).astype(jnp.int32)
        use_sc = jax.random.uniform(k_sc, (b,)) < self.self_conditioning
        encoded, logits = self.forward(views, tokens, noisy, positions, seg, prompt_len, use_sc)

        weight = jnp.where(target, 1.0 / (1.0 - t) if self.reweight else 1.0, 0.0)
        weight = jnp.minimum(weight, 1.0 / self.t_min)
        denoise_loss = (token_ce(logits, tokens) * weight).sum() / jnp.maximum(target.sum(), 1)
        # the encoder's logit at i predicts token i + 1
        next_target = jnp.concatenate([target[:, 1:], jnp.zeros((b, 1), bool)], 1)
        next_tokens = jnp.concatenate([tokens[:, 1:], tokens[:, :1]], 1)
        encoder_loss = jnp.where(next_target, token_ce(encoded.logits, next_tokens), 0.0).sum() / jnp.maximum(
            next_target.sum(), 1)
        loss = denoise_loss + self.encoder_weight * encoder_loss
        return loss, {"loss": loss, "denoise_loss": denoise_loss, "encoder_loss": encoder_loss,
                      "corrupted_accuracy": accuracy(logits, tokens, corrupt),
                      "answer_accuracy": accuracy(logits, tokens, target), "corrupted_tokens": corrupt.sum()}
