"""APD (adaptive parallel decoding; Israel et al., 2025; `algorithms.md` §14): a small causal model
steers how many tokens a diffusion model commits at once. The policy holds the settings and the
per-step rule; the canvas that runs both models is `jaxdllm.decoding.apd_canvas`.

The diffusion model decodes left to right. Each step, one forward of it over the canvas after the
decided text gives a draft of the next `draft_window` (M) positions by Gumbel-max sampling
(`argmax(log p_dLLM + T g)`, one noise draw g per position). The small causal model (the
*verifier*, a second model in the loop with its own KV cache) reads the draft in one cached forward.
The target at position j is the multiplicative mixture

    argmax(R log p_dLLM(j) + (1 - R) log p_AR(j | draft before j) + T g_j)

sampled with the *same* noise. The step commits the longest prefix on which the draft equals the
target, plus the target's token after it (the first position is always decided): at most M tokens.

* `mix` (R): 1 accepts the whole window (the target is the draft); 0 decodes with the small model
  alone (at temperature 0 its greedy output, token for token). Higher is faster.
* `kv_window` (W): the diffusion model re-reads the last W decided tokens each step (plus those
  decided since its previous forward); the K/V of older text come from its cache.
* `draft_window` (M): the most tokens one step can commit.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.base import Policy
from jaxdllm.decoding.second_model import load_companion
from jaxdllm.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Apd(Policy):
    """APD's settings (see the module docstring). `verifier`: the small causal model's folder or
    shipped name (default: the one the model's `companions.json` names)."""

    mix: float = 0.7
    kv_window: int = 16
    draft_window: int = 16
    verifier: str = ""
    name = "apd"
    canvas = "apd_canvas"
    needs_params = True
    params_kind = "its verifier, a small causal model with the same tokenizer (companions.json names it)"
    companion = "verifier"

    def check(self, config):
        if not 0.0 <= self.mix <= 1.0:
            raise ConfigError(f"mix (APD's R) must be in [0, 1], got {self.mix} (policy {self.name!r})")
        for field in ("kv_window", "draft_window"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < (1 if field == "draft_window" else 0):
                raise ConfigError(f"{field} must be an integer >= {1 if field == 'draft_window' else 0}, got "
                                  f"{value!r} (policy {self.name!r})")

    def load_params(self, directory, config, **load_options):
        """The small causal model (`verifier`, or the one `directory/companions.json` names), after
        checking that its tokenizer is the model's; `load_options` go to `from_pretrained` (`mesh=`, `dtype=`)."""
        return load_companion(directory, self.verifier, self.name, "verifier", **load_options)

    def draft(self, log_draft, noise, temperature):
        """`[B, M]` int32 the diffusion model's draft: `argmax(log p + T g)` of its log-probabilities
        `log_draft [B, M, V]` and the Gumbel noise `[B, M, V]` (zeros at temperature 0)."""
        return jnp.argmax(log_draft + temperature * noise, -1).astype(jnp.int32)

    def judge(self, draft, log_draft, verifier_logits, noise, temperature):
        """`(target [B, M] int32, count [B])`: the mixture's sample with the draft's noise and how many
        positions the step commits (the longest prefix where the draft is the target, plus one, at
        most M). `verifier_logits [B, M, V]`: each position's, given the draft before it."""
        log_ar = jax.nn.log_softmax(verifier_logits.astype(jnp.float32), -1)
        mixed = log_draft if self.mix == 1 else self.mix * log_draft + (1 - self.mix) * log_ar
        target = jnp.argmax(mixed + temperature * noise, -1).astype(jnp.int32)
        agree = jnp.cumprod((draft == target).astype(jnp.int32), -1).sum(-1)
        return target, jnp.minimum(agree + 1, draft.shape[1])
