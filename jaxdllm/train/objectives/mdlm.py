"""MDLM's masked-diffusion objective as GenMol trains with it (bionemo-moco's `MDLM.loss` with
`global_mean_loss`; Sahoo et al. 2024).

* Time: antithetic over the batch, `t_i = ((u + i) / B mod 1) (1 - time_eps) + time_eps` (one uniform
  `u` per batch), so a batch covers [0, 1] evenly.
* Log-linear schedule: every real token (BOS and EOS included) becomes MASK with probability
  `alpha = (1 - eps) t`.
* Substitution parameterisation: the MASK logit is set to -1e6 before the log-softmax (a masked
  token is never predicted as MASK); unmasked tokens carry no loss.
* Per masked token `-log p(x0) * sigma'(t) / expm1(sigma(t))`, which for the log-linear schedule is
  exactly `-log p(x0) / t`; the loss is the sum over the batch divided by the number of real
  (non-PAD) tokens in it (`global_mean_loss`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.errors import ConfigError
from jaxdllm.train.objectives.base import Objective, Views, aligned_logits, masked_metrics, padding_mask

MASK_LOGIT = -1e6  # the substitution parameterisation's MASK logit


def antithetic_times(key: jax.Array, batch: int, time_eps: float) -> jax.Array:
    """`[batch]` float32 times in `[time_eps, 1)`: one uniform draw shifted by `i / batch` per row."""
    u = jax.random.uniform(key, ())
    t = jnp.mod(u / batch + jnp.arange(batch) / batch, 1.0)
    return t * (1.0 - time_eps) + time_eps


def substitution_log_probs(logits: jax.Array, mask_token_id: int) -> jax.Array:
    """`[B, L, V]` float32 log-probabilities with the MASK logit at -1e6."""
    logits = logits.astype(jnp.float32).at[..., mask_token_id].set(MASK_LOGIT)
    return jax.nn.log_softmax(logits, axis=-1)


@dataclasses.dataclass(frozen=True)
class Mdlm(Objective):
    """Settings: `eps` (the schedule's floor: at most `1 - eps` of the tokens are masked) and
    `time_eps` (the smallest time drawn); both 1e-3 as published."""

    name = "mdlm"
    needs_mask_token = True
    eps: float = 1e-3
    time_eps: float = 1e-3

    def __post_init__(self):
        super().__post_init__()
        for field in ("eps", "time_eps"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
                raise ConfigError(f"[objective] {field} must be a number in (0, 1), got {value!r}")

    def check(self, config):
        if config.attention != "bidirectional":
            raise ConfigError(f"objective 'mdlm' trains a bidirectional masked model (GenMol's BERT); this model's "
                              f"attention is {config.attention!r}")
        if config.shift_logits:
            raise ConfigError("objective 'mdlm' predicts each token at its own position: the model must not shift logits")

    def noise(self, real: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """`(masked [B, L] bool, t [B, 1])` for the real tokens `real [B, L]`: each row's time and which
        of its tokens become MASK."""
        k_t, k_m = jax.random.split(key)
        t = antithetic_times(k_t, real.shape[0], self.time_eps)[:, None]
        return (jax.random.uniform(k_m, real.shape) < (1.0 - self.eps) * t) & real, t

    def __call__(self, views: Views, batch: dict, key: jax.Array):
        config = views.config
        tokens, seg = batch["tokens"], batch["segment_ids"]
        real = seg > 0
        masked, t = self.noise(real, key)
        noisy = jnp.where(masked, config.mask_token_id, tokens)
        logits = aligned_logits(views.student(noisy, batch["positions"], padding_mask(batch, config.attention)), config)
        logp = substitution_log_probs(logits, config.mask_token_id)
        nll = -jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
        loss = jnp.where(masked, nll / t, 0.0).sum() / jnp.maximum(real.sum(), 1)
        return loss, {**masked_metrics(loss, logits, tokens, masked), "mean_t": t.mean()}


__all__ = ["Mdlm", "antithetic_times", "substitution_log_probs"]
