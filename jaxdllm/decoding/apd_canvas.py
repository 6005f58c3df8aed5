"""The APD canvas: a diffusion model decoded left to right, its parallel commits steered by a small
causal model (`policies/apd.py`, `algorithms.md` §14). Two models run in each step of the loop:

* the diffusion model (the model decoded), with a KV cache: the prompt is prefilled once; each step
  feeds the canvas from `kv_window` tokens before the text decided since its previous forward to the
  end (the undecided positions MASK) as one window after its cached prefix (`window_mask`), writing
  the K/V of that window. The K/V of decided text older than the window stay as last written.
* the verifier (`policy_params`, a causal model with the same tokenizer), with an exact KV cache of
  the decided text: each step feeds the last decided token and the first M - 1 draft tokens at the
  row's own offset (`causal_mask`), so position j's logits read the draft before j. The K/V of the
  draft tokens the step accepts are already in place; the next step overwrites the rest.

Rows move independently (each at its own offset, forwards vmapped over rows). NFE counts the
diffusion model's forwards; each step also runs one verifier forward over M tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.decoding.canvas import Canvas, CompanionFootprint, Footprint
from jaxdllm.decoding.layout import slice_window
from jaxdllm.decoding.policies.apd import Apd
from jaxdllm.decoding.second_model import causal_mask, check_second_model, row_forward, window_mask
from jaxdllm.decoding.state import DecodeState, commit_window, stop_at_eos
from jaxdllm.errors import ConfigError


@struct.dataclass
class ApdCarry:
    """The APD canvas's part of the loop carry (in `DecodeState.cache`).

    Attributes:
      model_kv: the diffusion model's `KVCache`.
      verifier_kv: the verifier's `KVCache`.
      previous: `[B]` int32 each row's first undecided position at its previous step.
    """

    model_kv: object
    verifier_kv: object
    previous: jax.Array


class ApdCanvas(Canvas):
    """The APD canvas (diffusion models steered by a small causal model)."""

    name = "apd_canvas"
    policy_base = Apd
    diffusion_blocks = False  # left to right, by the policy's `draft_window`

    def check_config(self, config) -> None:
        if config.cache.keeps_kv:
            raise ConfigError(f"policy={config.policy.name!r} keeps both models' KV caches itself: leave cache='none'")
        if config.stop_at_eos == "block":
            raise ConfigError(f"stop_at_eos='block' finishes a diffusion block; policy={config.policy.name!r} decodes "
                              "left to right without blocks: use stop_at_eos=True")

    def check_model(self, model_config, config) -> None:
        if model_config.mask_token_id is None or model_config.attention != "bidirectional":
            raise ConfigError(f"policy={config.policy.name!r} decodes bidirectional masked-diffusion models (LLaDA, "
                              f"Dream); this model has attention {model_config.attention!r} and mask_token_id "
                              f"{model_config.mask_token_id}")

    def max_steps(self, config, lay=None) -> int:
        return config.gen_length  # every step commits at least one token of every active row

    def _window(self, config, lay) -> int:
        return _window(config, lay.shift, lay.total)

    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """The diffusion model's cache of the canvas plus one window, its widest forward the prompt's
        prefill or a window (whose logits it keeps); the verifier's cache of the canvas plus a draft,
        and its forward over the draft."""
        total, m = prompt_len + config.gen_length, config.policy.draft_window
        window = _window(config, int(model_config.shift_logits), total)
        verifier = CompanionFootprint("verifier", kv_slots=total + m, widest=max(prompt_len - 1, m), logits=m)
        return Footprint(canvas=total, kv_slots=total + window, widest=max(prompt_len, window),
                         attended=total + window, logits=window, companions=(verifier,))

    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None) -> DecodeState:
        """The carry for `prompt [B, Lp]` and a masked answer, with both models' prompt K/V prefilled."""
        check_second_model(policy_params, model.config.vocab_size, config.policy.name, "verifier")
        if policy_params.config.attention != "causal":
            raise ConfigError(f"policy {config.policy.name!r}: the verifier must be a causal model, got attention "
                              f"{policy_params.config.attention!r}")
        b, lp = prompt.shape
        m = config.policy.draft_window
        canvas = jnp.concatenate([prompt, jnp.full((b, config.gen_length), lay.mask_id, prompt.dtype)], 1)
        undecided = jnp.broadcast_to(jnp.arange(lay.total) >= lp, canvas.shape)
        seg, pos = view.seg[:, :lp], view.positions[:, :lp]
        model_kv = model.init_cache(b, lay.total + self._window(config, lay))
        model_kv = model(prompt, pos, lay.mask(seg, kind="bidirectional"), model_kv, logits_slice=(lp - 1, 1)).cache
        verifier_kv = policy_params.init_cache(b, lay.total + m)
        if lp > 1:  # the last prompt token is the first step's first fed token
            verifier_kv = policy_params(prompt[:, :-1], pos[:, :-1], lay.mask(seg[:, :-1], kind="causal"), verifier_kv,
                                        logits_slice=(lp - 2, 1)).cache
        carry = ApdCarry(model_kv, verifier_kv, jnp.full((b,), lp, jnp.int32))
        return DecodeState.start(canvas, undecided, done=~valid, key=key, cache=carry, policy_state=jnp.zeros(()),
                                 max_trajectory=config.max_trajectory)

    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        """One forward of each model, the mixture's verdict and the bookkeeping."""
        policy, T = config.policy, lay.total
        m, shift = policy.draft_window, lay.shift
        carry: ApdCarry = state.cache
        first = jnp.where(state.undecided.any(1), jnp.argmax(state.undecided, axis=1), T - 1)        # [B]
        # The diffusion model: the canvas from kv_window before the text decided since its last read.
        width = self._window(config, lay)
        begin = jnp.maximum(carry.previous - max(policy.kv_window, shift), 0)  # a shifted model reads one back
        ids, positions, seg = view.window(state.canvas, begin, width)
        seg = seg * (begin[:, None] + jnp.arange(width) < T)
        logits, model_kv = row_forward(model, ids.astype(jnp.int32), positions, begin, carry.model_kv, window_mask,
                                       seg)
        at = first[:, None] + jnp.arange(m) - begin[:, None] - shift                               # [B, M]
        draft_logits = jnp.take_along_axis(logits, jnp.clip(at, 0, width - 1)[..., None], axis=1)
        key = jax.random.fold_in(state.key, state.step)
        noise = jax.random.gumbel(key, draft_logits.shape) if config.temperature else jnp.zeros_like(draft_logits)
        log_draft = jax.nn.log_softmax(draft_logits.astype(jnp.float32), -1)
        draft = policy.draft(log_draft, noise, config.temperature)
        # The verifier: the last decided token, then the draft, at the row's own offset.
        last = jnp.take_along_axis(state.canvas, (first - 1)[:, None], axis=1).astype(jnp.int32)
        fed = jnp.concatenate([last, draft[:, :-1]], 1)
        fed_pos = slice_window(view.positions, first - 1, 1) + jnp.arange(m)[None]
        verifier_logits, verifier_kv = row_forward(policy_params, fed, fed_pos, first - 1, carry.verifier_kv,
                                                   causal_mask)
        target, count = policy.judge(draft, log_draft, verifier_logits, noise, config.temperature)
        targets = first[:, None] + jnp.arange(m)
        candidates = (targets < T) & slice_window(state.undecided, first, m) & ~state.done[:, None]
        commit = candidates & (jnp.arange(m)[None] < count[:, None])
        if config.stop_at_eos:  # nothing after an EOS counts
            eos = commit & (target == lay.eos_id)
            cut = jnp.where(eos.any(1), jnp.argmax(eos, axis=1), m)
            commit = commit & (jnp.arange(m)[None] <= cut[:, None])
        active = candidates.any(1)
        nfe = state.nfe + active.astype(jnp.int32)
        carry = ApdCarry(model_kv, verifier_kv, jnp.where(active, first, carry.previous))
        state = commit_window(state.replace(nfe=nfe, cache=carry), first, commit, target, nfe)
        if config.stop_at_eos:
            state = stop_at_eos(state, lay.eos_id, view.answer)
        state = state.replace(done=state.done | ~state.undecided.any(1))
        return state


def _window(config, shift: int, total: int) -> int:
    """Tokens of the diffusion model's window: `kv_window` before the newly decided text to the canvas's end."""
    return min(max(config.policy.kv_window, shift) + config.gen_length, total)
