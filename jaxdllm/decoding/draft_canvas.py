"""Jacobi decoding of causal models: the answer starts as a draft and each row's window of
`policy.window(block_length)` positions is refined in parallel under the causal mask until its
tokens reach a fixed point; `policies/jacobi.py` decides which positions are in flight and
which are accepted.

Rows move independently: a row's window starts at its last decided token (whose logit predicts
the first undecided position), so each row reads and writes the exact KV cache at its own
offset (the model call is vmapped over rows). The cache holds exact K/V for every decided token:
the window's slots are rewritten each step, and a rejected draft's K/V sit only at or after the
row's next window start, where the next step overwrites them before any query can see them
(causal attention never reads a key after its query). That overwrite is the cache truncation.
The prompt is prefilled once (not counted in `nfe`, like the block cache's fills).

With rejection recycling a row's forward holds its regular draft and the pool's candidates
(vmapped, each on a copy of the row's cache); the candidate with the longest accepted prefix
gives the logits, the new draft and the cache, so the cache stays exact. Rows still count one
forward per step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxdllm.decoding.layout import CanvasView, slice_window
from jaxdllm.decoding.policies import StepContext
from jaxdllm.decoding.policies.jacobi import exact_prefix
from jaxdllm.decoding.state import DecodeState, commit_window, record_trajectory, stop_at_eos
from jaxdllm.errors import ConfigError
from jaxdllm.models.cache import KVCache


class JacobiDecoding:
    """The draft canvas (causal models)."""

    name = "jacobi"

    def check_config(self, config) -> None:
        if config.cache.keeps_kv:
            raise ConfigError(f"policy={config.policy.name!r} keeps its own exact KV cache: leave cache='none'")

    def check_model(self, model_config, config) -> None:
        if model_config.attention != "causal":
            raise ConfigError(f"policy={config.policy.name!r} decodes causal models; the model's attention is "
                              f"{model_config.attention!r}")

    def max_steps(self, config) -> int:
        return config.gen_length  # every step accepts at least one token of every active row

    def _extended(self, canvas, view: CanvasView, n: int):
        """Canvas and view with `n` positions past the end, so every window has `n` tokens."""
        b = canvas.shape[0]
        pad = jnp.broadcast_to(canvas[:, -1:], (b, n))
        positions = jnp.concatenate([view.positions, view.positions[:, -1:] + 1 + jnp.arange(n)], 1)
        return jnp.concatenate([canvas, pad], 1), CanvasView(jnp.concatenate([view.seg, jnp.ones((b, n), jnp.int32)], 1),
                                                             positions)

    def init(self, model, prompt, view, key, lay, config, valid) -> DecodeState:
        """The carry for `prompt [B, Lp]` followed by the first draft `[B, G]`, with the prompt's K/V
        prefilled; rows with `valid [B]` False start done."""
        b, n = prompt.shape[0], config.block_length
        w = config.policy.window(n)
        draft = config.policy.initial_draft(prompt, view.seg[:, :lay.prompt_len], config.gen_length, key)
        canvas = jnp.concatenate([prompt, draft.astype(prompt.dtype)], 1)
        undecided = jnp.broadcast_to(jnp.arange(lay.total) >= lay.prompt_len, canvas.shape)
        cache = KVCache.init(model.config, b, lay.total + w)
        cache = model(prompt, view.positions[:, :lay.prompt_len], lay.mask(view.seg[:, :lay.prompt_len]), cache,
                      logits_slice=(lay.prompt_len - 1, 1))[1]
        return DecodeState.start(canvas, undecided, done=~valid, key=key, cache=cache,
                                 policy_state=config.policy.init_state(b, n, model.config.vocab_size),
                                 max_trajectory=config.max_trajectory)

    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        """One forward of every row's window `[B, W]` (and of its recycled alternatives),
        acceptance, and the bookkeeping."""
        policy, T = config.policy, lay.total
        n = config.block_length
        w = policy.window(n)
        first = jnp.where(state.undecided.any(1), jnp.argmax(state.undecided, axis=1), T - 1)  # [B]
        start = first - 1  # the last decided token: its logit predicts the first undecided one
        canvas, ext = self._extended(state.canvas, view, w)
        ids, pos, seg = ext.window(canvas, start, w)
        draft = slice_window(canvas, first, w)                                   # [B, W]
        drafts, valid = draft[:, None], jnp.ones((draft.shape[0], 1), bool)
        if policy.recycle:
            pooled, ok = policy.recycled_drafts(state.policy_state, ids[:, 0])
            drafts, valid = jnp.concatenate([drafts, pooled], 1), jnp.concatenate([valid, ok], 1)
        end = jnp.minimum(policy.in_flight_end(first, lay.prompt_len, n), T)
        targets = first[:, None] + jnp.arange(w)
        candidates = (targets < end[:, None]) & slice_window(state.undecided, first, w) & ~state.done[:, None]

        def row(last, drafts, valid, candidates, pos, seg, start, cache):  # one row, its own cache offset
            one = _with_batch(cache, lambda x, axis: jnp.expand_dims(x, axis))
            mask = lay.mask(seg[None], q_offset=start, kind="causal")

            def forward(draft):  # the window: the last decided token, then the draft
                return model(jnp.concatenate([last[None], draft[:-1]])[None], pos[None], mask, one)

            logits, caches = jax.vmap(forward)(drafts)                           # [C, 1, W, V]
            accepted = (exact_prefix(jnp.argmax(logits[:, 0], -1), drafts) & candidates[None]).sum(1)
            best = jnp.argmax(jnp.where(valid, accepted, -1))                    # a tie keeps the regular draft
            cache = _with_batch(jax.tree.map(lambda x: x[best], caches), lambda x, axis: jnp.squeeze(x, axis))
            return logits[best, 0], drafts[best], cache

        axes = state.cache.batch_axes()
        logits, chosen, cache = jax.vmap(row, in_axes=(0, 0, 0, 0, 0, 0, 0, axes), out_axes=(0, 0, axes))(
            ids[:, 0], drafts, valid, candidates, pos, seg, start, state.cache)
        nfe = state.nfe + candidates.any(1).astype(jnp.int32)
        ctx = StepContext(config=config, block=state.block, block_step=state.block_step,
                          key=jax.random.fold_in(state.key, state.step), state=state.policy_state,
                          eos_eot_ids=lay.eos_eot, eos_id=lay.eos_id, policy_params=policy_params,
                          draft=chosen, undecided=state.undecided[:, lay.prompt_len:])
        decision = policy.commit(logits, candidates, ctx)
        if config.stop_at_eos:  # a window can reach its fixed point past an EOS: nothing after it counts
            eos = decision.commit & (decision.tokens == lay.eos_id)
            cut = jnp.where(eos.any(1), jnp.argmax(eos, axis=1), w)
            decision = decision._replace(commit=decision.commit & (jnp.arange(w)[None] <= cut[:, None]))
        policy_state = decision.state
        if policy.recycle:  # this window's greedy output (verified prefix, rejected tail), keyed by the token before it
            policy_state = policy.remember(policy_state, ids[:, 0], decision.tokens, candidates.any(1))
        state = commit_window(state.replace(nfe=nfe, cache=cache, policy_state=policy_state),
                              first, decision.commit, decision.tokens, nfe, draft=decision.draft)
        if config.stop_at_eos:
            state = stop_at_eos(state, lay.eos_id, lay.prompt_len)
        state = state.replace(done=state.done | ~state.undecided.any(1))
        return record_trajectory(state, config.max_trajectory).replace(step=state.step + 1)


def _with_batch(cache: KVCache, fn) -> KVCache:
    """`fn(array, batch_axis)` on every array of `cache` (under vmap a row has lost its batch axis)."""
    axes = cache.batch_axes()
    return jax.tree.map(fn, cache, axes)


JACOBI = JacobiDecoding()
