"""The uniform-noise canvas (DiffusionGemma): canvases of uniformly random tokens, denoised one after
another, each read by the denoiser over the KV cache that the causal encoder wrote.

Generation (transformers' `DiffusionGemmaGenerationMixin.generate`, `algorithms.md` §9), all inside
the one compiled loop:
  * `init` encodes the prompts causally into the cache and draws the first canvas.
  * Each `step` is one denoiser forward over the current canvas ([cache; canvas], bidirectional,
    self-conditioned on the previous step's temperature-scaled logits), the policy's arithmetic
    (`policies/diffusiongemma.py`), renoising and the per-row adaptive stop. A row that stopped
    keeps its state while the others go on; its forwards stop counting.
  * A canvas ends when every row still running has stopped, or after `max_denoising_steps`. It
    commits each row's argmax canvas; a row whose canvas holds a stop id ends there (its tokens after
    the first one become pad, and every later canvas of it is pad). The committed canvas is then
    encoded causally into the cache (in the same iteration), and the next canvas starts after it.
  * NFE counts a row's denoiser forwards while it runs (the encoder passes are not counted, as
    published); tokens per forward = non-pad generated tokens / NFE.

The uniform draws (each canvas's start and every renoise) come from `canvas_draws`, a function of
the generation's key, the row, the canvas and the step: a row's draws do not depend on the batch it
is decoded in, and a test can feed the same draws to another implementation.

Rows are left-padded prompts (positions count real tokens only); the canvases sit after the padded
prompt in the cache, so a sliding layer's window is measured in tokens, as for a row decoded alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.attention import MaskSpec
from jaxdllm.decoding import branching
from jaxdllm.decoding.canvas import Canvas, Footprint
from jaxdllm.decoding.policies.diffusiongemma import DiffusionGemma
from jaxdllm.decoding.state import DecodeState
from jaxdllm.errors import ConfigError
from jaxdllm.models.families import family_of


def canvas_draws(key: jax.Array, rows: jax.Array, canvas: jax.Array | int, step: jax.Array | int, length: int,
                 vocab_size: int) -> jax.Array:
    """`[B, length]` uniform token ids for rows `rows [B]` (their indices in the caller's batch),
    canvas `canvas` and step `step` (0: the canvas's start; s >= 1: the renoise after step s)."""
    def one(row):
        k = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, row), canvas), step)
        return jax.random.randint(k, (length,), 0, vocab_size, jnp.int32)
    return jax.vmap(one)(rows)


@struct.dataclass
class UniformCarry:
    """The uniform canvas's part of the loop carry (in `DecodeState.cache`).

    Attributes:
      kv: the encoder's `KVCache` (prompt and finished canvases).
      noisy: `[B, C]` the canvas the denoiser reads next.
      argmax: `[B, C]` the argmax canvas of each row's last executed step.
      self_conditioning: `[B, C, V]` the previous step's temperature-scaled logits; `conditioned [B]`
        False on a canvas's first step (a zero signal).
      history: `[B, S, C]` the argmax canvases of the last S steps (-1 before any), S = stability_threshold.
      stopped: `[B]` rows whose denoising of the current canvas has stopped.
    """

    kv: object
    noisy: jax.Array
    argmax: jax.Array
    self_conditioning: jax.Array
    conditioned: jax.Array
    history: jax.Array
    stopped: jax.Array


class UniformCanvas(Canvas):
    """The uniform-noise canvas (DiffusionGemma)."""

    name = "uniform_canvas"
    policy_base = DiffusionGemma

    def check_config(self, config) -> None:
        if config.gen_length % config.block_length:
            c = config.block_length
            raise ConfigError(f"gen_length ({config.gen_length}) must be a multiple of the canvas length "
                              f"block_length ({c}): use gen_length {max(c, config.gen_length // c * c)} or "
                              f"{-(-config.gen_length // c) * c}")
        if config.cache.keeps_kv or config.stop_at_eos or config.cfg_scale:
            raise ConfigError("policy 'diffusiongemma' keeps its own KV cache and stops rows at its stop ids: leave "
                              "cache='none', stop_at_eos=False and cfg_scale=0")

    def check_model(self, model_config, config) -> None:
        # the model must run as an encoder and as a self-conditioned denoiser (its family's forward inputs)
        if not {"encode", "self_conditioning"} <= set(family_of(model_config).model.forward_inputs):
            raise ConfigError(f"policy {config.policy.name!r} decodes DiffusionGemma models (uniform-noise canvases, "
                              "an encoder and a self-conditioned denoiser); this model is "
                              f"{model_config.model_type!r}: decode it with its own sampler (leave --preset out; from "
                              "Python, jaxdllm.sampler_defaults(checkpoint))")
        canvas = model_config.block_size
        if canvas and config.block_length != canvas:
            raise ConfigError(f"gen_length {config.gen_length} with block_length {config.block_length}: this model "
                              f"denoises canvases of exactly {canvas} tokens (its canvas_length); set gen_length to a "
                              f"multiple of {canvas} (e.g. {max(canvas, -(-config.gen_length // canvas) * canvas)}) and "
                              f"block_length to {canvas}")
        if not config.policy.stop_ids and model_config.eos_token_id is None and model_config.eot_token_id is None:
            raise ConfigError("policy 'diffusiongemma' needs stop ids: set stop_ids= or the model's eos_token_id")

    def max_steps(self, config, lay=None) -> int:
        return config.num_blocks * config.policy.max_denoising_steps

    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """The encoder's cache over the prompt and every canvas; the widest forward is the prompt's
        prefill or a canvas; ten float32 `[C, V]` buffers per row: the denoiser's logits before and after
        the softcap; their temperature-scaled copy, the probabilities and entropy terms of the entropy
        bound, the proposal's Gumbel noise and its sum with the logits; the self-conditioning signal the
        carry keeps, the copy a stopped row keeps, and its softmax read by the next step's input."""
        total = prompt_len + config.gen_length
        return Footprint(canvas=total, kv_slots=total, widest=max(prompt_len, config.block_length), attended=total,
                         logits=config.block_length, logit_copies=10)

    def comparison_presets(self, preset: str, gen_length: int, defaults: dict) -> dict:
        """The checkpoint's own sampler (DiffusionGemma's published one) at `gen_length`."""
        return {preset: (preset, {**defaults, "gen_length": gen_length})}

    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None) -> DecodeState:
        """Encode `prompt [B, Lp]` into the cache and draw the first canvas; rows with `valid [B]`
        False start done."""
        b, lp = prompt.shape
        c, v = config.block_length, model.config.vocab_size
        canvas = jnp.concatenate([prompt, jnp.full((b, config.gen_length), model.config.pad_token_id or 0,
                                                   prompt.dtype)], 1)
        kv = model.init_cache(b, lay.total)
        seg = view.seg[:, :lp]
        kv = model(prompt, view.positions[:, :lp], MaskSpec(kind="causal", q_segment_ids=seg), kv,
                   logits_slice=(lp - 1, 1), encode=True).cache
        stability = max(config.policy.stability_threshold, 1)
        carry = UniformCarry(
            kv=kv, noisy=canvas_draws(key, jnp.arange(b), 0, 0, c, v), argmax=jnp.zeros((b, c), jnp.int32),
            self_conditioning=jnp.zeros((b, c, v), jnp.float32), conditioned=jnp.zeros((b,), bool),
            history=jnp.full((b, stability, c), -1, jnp.int32), stopped=~valid)
        undecided = jnp.broadcast_to(jnp.arange(lay.total) >= lp, canvas.shape)
        return DecodeState.start(canvas, undecided, done=~valid, key=key, cache=carry, policy_state=jnp.zeros(()),
                                 max_trajectory=config.max_trajectory)

    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        """One denoiser forward of the current canvas; at a canvas's end, its commit and encoding."""
        policy, carry = config.policy, state.cache
        b, c, lp = state.canvas.shape[0], config.block_length, lay.prompt_len
        start = lp + state.block * c
        positions = jax.lax.dynamic_slice_in_dim(view.positions, start, c, axis=1)
        running = ~(carry.stopped | state.done)
        nfe = state.nfe + running.astype(jnp.int32)
        out = model(carry.noisy, positions, MaskSpec(kind="bidirectional", q_offset=start), carry.kv,
                    self_conditioning=carry.self_conditioning, self_conditioning_mask=carry.conditioned)
        step_key = jax.random.fold_in(jax.random.fold_in(state.key, -1 - state.block), state.block_step)
        z, entropy, proposal, argmax, accepted = policy.denoise(out.logits, state.block_step, step_key)
        fresh = canvas_draws(state.key, jnp.arange(b), state.block, state.block_step + 1, c, z.shape[-1])
        noisy = jnp.where(accepted, proposal, fresh)
        # a stopped row keeps its canvas, argmax and conditioning
        keep = ~running
        argmax = jnp.where(keep[:, None], carry.argmax, argmax)
        noisy = jnp.where(keep[:, None], carry.noisy, noisy)
        z = jnp.where(keep[:, None, None], carry.self_conditioning, z)
        stable = (carry.history == argmax[:, None]).all(axis=(1, 2)) if policy.stability_threshold else True
        history = jnp.concatenate([carry.history[:, 1:], argmax[:, None]], 1)
        confident = entropy.mean(-1) < policy.confidence_threshold  # a stopped row's value is never read
        stopped = carry.stopped | (stable & confident)
        carry = carry.replace(kv=out.cache, noisy=noisy, argmax=argmax, self_conditioning=z,
                              conditioned=jnp.ones((b,), bool), history=history, stopped=stopped)
        state = state.replace(nfe=nfe, cache=carry)
        ended = jnp.all(stopped | state.done) | (state.block_step + 1 >= policy.max_denoising_steps)
        state = branching.cond(ended, lambda s: self._finish_canvas(model, s, view, lay, config),
                             lambda s: s.replace(block_step=s.block_step + 1), state)
        return state

    def _finish_canvas(self, model, state: DecodeState, view, lay, config) -> DecodeState:
        """Commit each row's argmax canvas, end the rows that reached a stop id, encode the canvas
        into the cache and draw the next one."""
        carry, c, lp = state.cache, config.block_length, lay.prompt_len
        b, v = carry.noisy.shape[0], carry.self_conditioning.shape[-1]
        start = lp + state.block * c
        pad = model.config.pad_token_id or 0
        stops = jnp.asarray(config.policy.stop_ids or lay.eos_eot, jnp.int32)  # default: the model's EOS, EoT
        tokens = carry.argmax
        is_stop = (tokens[..., None] == stops).any(-1)
        after_first = (jnp.cumsum(is_stop, axis=1) - is_stop) > 0  # past the first stop id
        tokens = jnp.where(after_first | state.done[:, None], pad, tokens)
        canvas = jax.lax.dynamic_update_slice_in_dim(state.canvas, tokens.astype(state.canvas.dtype), start, axis=1)
        commit_step = jax.lax.dynamic_update_slice_in_dim(
            state.commit_step, jnp.broadcast_to(state.nfe[:, None], (b, c)), start, axis=1)
        undecided = jax.lax.dynamic_update_slice_in_dim(state.undecided, jnp.zeros((b, c), bool), start, axis=1)
        done = state.done | is_stop.any(1)
        # a row that ended: its later canvases are pad, decided now (not a forward)
        later = done[:, None] & (jnp.arange(canvas.shape[1])[None] >= start + c)
        canvas = jnp.where(later, pad, canvas)
        commit_step = jnp.where(later, state.nfe[:, None], commit_step)
        undecided = undecided & ~later
        block = state.block + 1
        done = done | (block >= config.num_blocks)
        positions = jax.lax.dynamic_slice_in_dim(view.positions, start, c, axis=1)

        def encode(kv):
            return model(tokens, positions, MaskSpec(kind="causal", q_offset=start), kv, logits_slice=(c - 1, 1),
                         encode=True).cache

        kv = branching.cond(jnp.all(done), lambda kv: kv, encode, carry.kv)
        carry = carry.replace(
            kv=kv, noisy=canvas_draws(state.key, jnp.arange(b), block, 0, c, v), conditioned=jnp.zeros((b,), bool),
            history=jnp.full_like(carry.history, -1), stopped=done)
        return state.replace(canvas=canvas, commit_step=commit_step, undecided=undecided, done=done, block=block,
                             block_step=jnp.int32(0), cache=carry)

