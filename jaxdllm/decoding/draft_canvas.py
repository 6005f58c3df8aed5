"""The draft canvas: draft-and-verify decoding of causal models (Jacobi, Lookahead, Medusa, BPD,
Token Recycling, any `DraftVerifyPolicy`). The answer starts as a draft; each step feeds every
row's verification layout (`policies/draft_verify.py`) in one forward under
`MaskSpec(kind="lookahead")` (branches) or `MaskSpec(kind="tree")` (a token tree) and accepts the
longest verified prefix. The engine calls only the policy's `layout`, `in_flight_end`, `start`,
`for_model`, `seed` (after the prefill), `propose`, `accept` and `update`.

Rows move independently: a row's layout starts at its last decided token (whose prediction is
the first undecided position), so each row reads and writes the exact KV cache at its own offset
(the model call is vmapped over rows). The forward writes its K/V at slots `start ..
start + length`; the accepted branch's K/V (a tree's accepted path) are then moved to the slots
right after the current token (`KVCache.move_slots`, `gather_slots`), where the accepted tokens
sit. Every other slot at or after the next step's start is rewritten by that step before any
query can see it (keys before a row's start are the decided text; the mask shows a window token
only its own structure). That is the cache truncation. The prompt is prefilled once (not counted in `nfe`, like the block cache's
fills).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxdllm.decoding.canvas import Canvas, Footprint
from jaxdllm.decoding.layout import slice_window
from jaxdllm.decoding.policies.draft_verify import DraftVerifyPolicy, Seen
from jaxdllm.decoding.state import DecodeState, commit_window, stop_at_eos
from jaxdllm.errors import ConfigError
from jaxdllm.models.cache import KVCache


class DraftCanvas(Canvas):
    """The draft canvas (causal models)."""

    name = "draft_canvas"
    policy_base = DraftVerifyPolicy
    diffusion_blocks = False  # a policy's own window (Jacobi's `window`), never `block_length`

    def check_config(self, config) -> None:
        if config.cache.keeps_kv:
            raise ConfigError(f"policy={config.policy.name!r} keeps its own exact KV cache: leave cache='none'")
        if config.stop_at_eos == "block":
            raise ConfigError(f"stop_at_eos='block' finishes a diffusion block; policy={config.policy.name!r} "
                              "decodes without blocks: use stop_at_eos=True")

    def check_model(self, model_config, config) -> None:
        if model_config.attention != "causal":
            raise ConfigError(f"policy={config.policy.name!r} decodes causal models; the model's attention is "
                              f"{model_config.attention!r}")

    def max_steps(self, config, lay=None) -> int:
        return config.gen_length  # every step accepts at least one token of every active row

    def cache_slots(self, config, lay) -> int:
        """KV slots per row: the canvas plus one layout past its end."""
        return lay.total + config.policy.layout().length

    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """An exact cache of the canvas plus one verification layout; the widest forward is the
        prompt's prefill or a layout; the layout's logits; the policy's second model, if any."""
        span = config.policy.layout().length
        total = prompt_len + config.gen_length
        return Footprint(canvas=total, kv_slots=total + span, widest=max(prompt_len, span), attended=total + span,
                         logits=span, companions=config.policy.companion_footprints(prompt_len, config))

    def comparison_presets(self, preset: str, gen_length: int, defaults: dict) -> dict:
        """Autoregressive decoding (a window of 1), Jacobi decoding and Jacobi Forcing's multi-block
        decoding, at the checkpoint's window (default 16)."""
        g, n = gen_length, min(defaults.get("window", 16), gen_length)
        return {"ar": ("jacobi", dict(gen_length=g, window=1)),
                "jacobi": ("jacobi", dict(gen_length=g, window=n)),
                "jacobi-mr": ("jacobi-forcing", dict(gen_length=g, window=n))}

    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None) -> DecodeState:
        """The carry for `prompt [B, Lp]` followed by the first draft `[B, G]`, with the prompt's K/V
        prefilled; rows with `valid [B]` False start done."""
        b = prompt.shape[0]
        draft, policy_state = config.policy.start(prompt, view.seg[:, :lay.prompt_len], config.gen_length, key)
        policy_state = config.policy.for_model(policy_state, model.config.vocab_size)
        canvas = jnp.concatenate([prompt, draft.astype(prompt.dtype)], 1)
        undecided = jnp.broadcast_to(jnp.arange(lay.total) >= lay.prompt_len, canvas.shape)
        cache = model.init_cache(b, self.cache_slots(config, lay))
        lp = lay.prompt_len
        reads_hidden = getattr(config.policy, "reads_hidden", False)
        before = max(lp - 2, 0)  # the token before the last prompt token: what drafts the first step
        out = model(prompt, view.positions[:, :lp], lay.mask(view.seg[:, :lp]), cache,
                    logits_slice=(before, lp - before) if reads_hidden else (lp - 1, 1), return_hidden=reads_hidden)
        cache = out.cache
        hidden = out.hidden[:, 0] if reads_hidden else None
        policy_state = config.policy.seed(policy_state, hidden, policy_params, model.unembed,
                                          temperature=config.temperature)
        return DecodeState.start(canvas, undecided, done=~valid, key=key, cache=cache, policy_state=policy_state,
                                 max_trajectory=config.max_trajectory)

    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        """One forward of every row's verification layout, acceptance, the K/V move, the policy's
        update and the bookkeeping."""
        policy, T = config.policy, lay.total
        shape = policy.layout()
        w, e = shape.accept_width, shape.lookahead_len
        b = state.canvas.shape[0]
        first = jnp.where(state.undecided.any(1), jnp.argmax(state.undecided, axis=1), T - 1)  # [B]
        start = first - 1  # the last decided token: its prediction is the first undecided position
        last = jnp.take_along_axis(state.canvas, start[:, None], axis=1)[:, 0].astype(jnp.int32)
        current_pos = jnp.take_along_axis(view.positions, start[:, None], axis=1)            # [B, 1]
        draft = slice_window(state.canvas, first, w).astype(jnp.int32)     # past the end: clipped, never accepted
        key = jax.random.fold_in(state.key, state.step)
        proposal = policy.propose(state.policy_state, last, draft)
        parts = [last[:, None], proposal.lookahead, proposal.branches.reshape(b, -1)]
        if shape.tree:
            parts.append(proposal.nodes)
        ids = jnp.concatenate(parts, 1).astype(jnp.int32)
        positions = current_pos + jnp.asarray(shape.position_offsets())[None]
        end = jnp.minimum(policy.in_flight_end(first, lay.prompt_len), T)
        targets = first[:, None] + jnp.arange(w)
        candidates = (targets < end[:, None]) & slice_window(state.undecided, first, w) & ~state.done[:, None]

        reads_hidden = getattr(policy, "reads_hidden", False)

        def row(ids, positions, start, cache):  # one row at its own cache offset
            one = _with_batch(cache, lambda x, axis: jnp.expand_dims(x, axis))
            mask = lay.mask(jnp.ones((1, shape.length), jnp.int32), q_offset=start, **shape.mask_fields(start))
            out = model(ids[None], positions[None], mask, one, return_hidden=reads_hidden)
            hidden = out.hidden[0] if reads_hidden else None
            return out.logits[0], hidden, _with_batch(out.cache, jnp.squeeze)

        axes = state.cache.batch_axes()
        logits, hidden, cache = jax.vmap(row, in_axes=(0, 0, 0, axes), out_axes=(0, 0, axes))(
            ids, positions, start, state.cache)
        if config.temperature > 0 and getattr(policy, "samples", False):  # autoregressive sampling (window 1)
            noise = jax.random.gumbel(key, logits.shape, jnp.float32)
            predicted = jnp.argmax(logits.astype(jnp.float32) / config.temperature + noise, axis=-1).astype(jnp.int32)
        else:
            predicted = jnp.argmax(logits, axis=-1).astype(jnp.int32)                   # [B, length]
        if shape.tree:
            verdict = policy.accept(predicted, proposal, candidates, logits=logits, key=key,
                                    temperature=config.temperature)
        else:
            branch_pred = predicted[:, 1 + e:].reshape(b, shape.branches, shape.branch_len)
            predictions = jnp.concatenate([jnp.broadcast_to(predicted[:, None, :1], (b, shape.branches, 1)),
                                           branch_pred], -1)                             # [B, C, W]
            verdict = policy.accept(predictions, proposal, candidates)
        commit = verdict.commit
        if config.stop_at_eos:  # a window can reach its fixed point past an EOS: nothing after it counts
            eos = commit & (verdict.tokens == lay.eos_id)
            cut = jnp.where(eos.any(1), jnp.argmax(eos, axis=1), w)
            commit = commit & (jnp.arange(w)[None] <= cut[:, None])
        if shape.tree:  # the accepted path's K/V, gathered to the slots after the current token
            cache = cache.gather_slots(start[:, None] + verdict.path, start + 1)
        else:
            source = start + 1 + e + verdict.branch * shape.branch_len
            cache = cache.move_slots(source, start + 1, shape.branch_len)
        active = candidates.any(1)
        seen = Seen(ids, logits, hidden, verdict, policy_params, model.unembed, config.temperature, lay)
        policy_state = policy.update(state.policy_state, last, proposal, predicted[:, 1:1 + e], verdict.tokens,
                                     active, seen=seen)
        nfe = state.nfe + active.astype(jnp.int32)
        state = commit_window(state.replace(nfe=nfe, cache=cache, policy_state=policy_state),
                              first, commit, verdict.tokens, nfe,
                              draft=jnp.where(candidates, verdict.tokens, draft))
        if config.stop_at_eos:
            state = stop_at_eos(state, lay.eos_id, view.answer)
        state = state.replace(done=state.done | ~state.undecided.any(1))
        return state


def _with_batch(cache: KVCache, fn) -> KVCache:
    """`fn(array, batch_axis)` on every array of `cache` (under vmap a row has lost its batch axis)."""
    axes = cache.batch_axes()
    return jax.tree.map(fn, cache, axes)

