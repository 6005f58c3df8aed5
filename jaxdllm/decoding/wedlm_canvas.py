"""The WeDLM canvas: streaming diffusion decoding of a causal model (WeDLM, Tencent WeChat AI;
`wedlm/engine/wedlm_decoder.py`, `conversions-sdar-sbd-wedlm.md` §3a), with an exact prefix cache.

The answer starts as MASK. Each row keeps `committed`, the canvas column up to which its K/V are
final, and a window of `W` slots from there. Each step, per row:

1. Refill: `n` = the window's leading decided slots; the forward covers `W + n` slots (at most 2W;
   fewer at the canvas's end), so n new masks join behind the window.
2. Topological reorder: the decided slots first, then the masks, each in slot order; every token
   keeps its logical RoPE position (`CanvasView.positions` of its column).
3. One causal forward of the reordered slots after the committed prefix (the row's own cache
   offset: the model call is vmapped over rows, as on the draft canvas). Its K/V are written at
   `committed ..`; the first n reordered tokens are exactly the n leading decided slots, so their
   K/V are what a plain causal forward of the text computes: they are committed
   (`committed += n`), and every later slot is rewritten by the next step before any query sees it.
4. Fill (`policies/wedlm.py`): the masks' own logits (no shift), entropy plus the distance
   penalty, every mask under the threshold or else the lowest one. A filled token is decided now
   (it never changes) and is fed as a real token from the next step; it is committed when it leads
   the window.

The prompt is prefilled causally (not counted in `nfe`; its last logits are not used: the first
answer token is predicted from a mask slot, as published). Padding slots of the static 2W forward
sit after every real slot, so causal attention hides them. Each step fills at least one mask of
every active row, so `gen_length` steps bound the loop.

Where it differs from the published engine: the window never runs past the canvas (`gen_length`;
the engine keeps filling masks beyond `max_tokens` and drops them); a row is done once its answer is
decided (the engine spends one more forward committing the last tokens' K/V, which decides
nothing), or, with `stop_at_eos`, once an EOS and everything before it are decided (the engine
stops when that EOS is committed, one forward later); MASK is never a chosen token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxdllm.decoding.canvas import Canvas, Footprint
from jaxdllm.decoding.layout import slice_window
from jaxdllm.decoding.policies.wedlm import Wedlm
from jaxdllm.decoding.state import DecodeState, commit_window, stop_at_eos
from jaxdllm.errors import ConfigError
from jaxdllm.models.cache import KVCache


@struct.dataclass
class StreamCache:
    """The canvas's cache: the model's K/V (`KVCache`, slots = canvas columns, plus 2W spare) and
    `committed [B]`, the column up to which each row's K/V are final."""

    kv: KVCache
    committed: jax.Array


class WedlmCanvas(Canvas):
    """The WeDLM canvas (causal models trained with the `wedlm` objective)."""

    name = "wedlm_canvas"
    policy_base = Wedlm
    diffusion_blocks = False  # the policy's own streaming window, never `block_length`
    unmasks = True

    def check_config(self, config) -> None:
        if config.cache.keeps_kv:
            raise ConfigError(f"policy={config.policy.name!r} keeps its own exact prefix cache: leave cache='none'")
        if config.stop_at_eos == "block":
            raise ConfigError(f"stop_at_eos='block' finishes a diffusion block; policy={config.policy.name!r} "
                              "streams without blocks: use stop_at_eos=True")

    def check_model(self, model_config, config) -> None:
        if model_config.attention != "causal" or model_config.shift_logits:
            raise ConfigError(f"policy={config.policy.name!r} decodes causal models whose masked slots read their "
                              f"own logits (WeDLM); the model has attention={model_config.attention!r}, "
                              f"shift_logits={model_config.shift_logits}")
        if model_config.mask_token_id is None:
            raise ConfigError("the model config has no mask_token_id and its tokenizer names no mask token "
                              "(WeDLM's released config.json says null): load it with "
                              "from_pretrained(..., mask_token_id=ID), the id of the mask in its tokenizer")

    def max_steps(self, config, lay=None) -> int:
        return config.gen_length  # every step fills at least one mask of every active row

    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """An exact cache of the canvas plus a window's spare slots; the widest forward is the prompt's
        prefill or 2W slots, whose logits a step keeps."""
        span = 2 * config.policy.window
        total = prompt_len + config.gen_length
        return Footprint(canvas=total, kv_slots=total + span, widest=max(prompt_len, span), attended=total + span,
                         logits=span)

    def comparison_presets(self, preset: str, gen_length: int, defaults: dict) -> dict:
        """Next-token decoding (the model keeps it: Jacobi with a window of 1), WeDLM one mask per step
        and WeDLM at the checkpoint's threshold."""
        g = gen_length
        return {"ar": ("jacobi", dict(gen_length=g, window=1)),
                "wedlm-one": (preset, dict(gen_length=g, entropy_threshold=0.0)),
                "wedlm": (preset, dict(gen_length=g))}

    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None) -> DecodeState:
        """The carry for `prompt [B, Lp]` followed by G MASK, the prompt's K/V prefilled; rows with
        `valid [B]` False start done."""
        b, lp = prompt.shape
        canvas = jnp.concatenate([prompt, jnp.full((b, config.gen_length), lay.mask_id, prompt.dtype)], 1)
        kv = model.init_cache(b, lay.total + 2 * config.policy.window)
        kv = model(prompt, view.positions[:, :lp], lay.mask(view.seg[:, :lp]), kv, logits_slice=(lp - 1, 1)).cache
        cache = StreamCache(kv=kv, committed=jnp.full((b,), lp, jnp.int32))
        return DecodeState.start(canvas, view.answer, done=~valid, key=key, cache=cache,
                                 policy_state=jnp.zeros((), jnp.float32), max_trajectory=config.max_trajectory)

    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        """One reordered forward of every row's window, the commit of its leading decided slots, the
        fill and the bookkeeping."""
        w, total = config.policy.window, lay.total
        span = 2 * w
        cur = state.cache.committed                                          # [B]
        slots = jnp.arange(span)[None]
        inside = cur[:, None] + slots < total                                 # [B, 2W]
        masked = slice_window(state.undecided, cur, span) & inside
        decided = ~masked & inside
        # n: the window's leading decided slots (the first mask's slot; W at most)
        lead = jnp.minimum(jnp.where((~decided).any(1), jnp.argmax(~decided, axis=1), span), w)
        fed = inside & (slots < w + lead[:, None])
        group = jnp.where(fed & decided, 0, jnp.where(fed, 1, 2))            # decided, masks, padding
        order = jnp.argsort(group * span + slots, axis=1)                    # the topological reorder
        ids = jnp.take_along_axis(slice_window(state.canvas, cur, span), order, 1).astype(jnp.int32)
        positions = jnp.take_along_axis(slice_window(view.positions, cur, span), order, 1)

        def row(ids, positions, start, kv):  # one row at its own cache offset
            one = jax.tree.map(lambda x, axis: jnp.expand_dims(x, axis), kv, kv.batch_axes())
            mask = lay.mask(jnp.ones((1, span), jnp.int32), q_offset=start)
            out = model(ids[None], positions[None], mask, one)
            return out.logits[0], jax.tree.map(jnp.squeeze, out.cache, out.cache.batch_axes())

        axes = state.cache.kv.batch_axes()
        logits, kv = jax.vmap(row, in_axes=(0, 0, 0, axes), out_axes=(0, axes))(ids, positions, cur, state.cache.kv)
        back = jnp.argsort(order, axis=1)                                    # reordered row -> slot
        logits = jnp.take_along_axis(logits.astype(jnp.float32), back[..., None], 1)

        active = ~state.done & masked.any(1)
        key = jax.random.fold_in(state.key, state.step)
        fill, tokens = config.policy.fill(logits, masked & fed, key, config.temperature, lay.mask_id)
        fill = fill & active[:, None]
        nfe = state.nfe + active.astype(jnp.int32)
        committed = jnp.where(active, cur + lead, cur)
        state = commit_window(state.replace(nfe=nfe, cache=StreamCache(kv=kv, committed=committed)),
                              cur, fill, tokens, nfe)
        if config.stop_at_eos:
            state = stop_at_eos(state, lay.eos_id, view.answer)
        return state.replace(done=state.done | ~state.undecided.any(1))

