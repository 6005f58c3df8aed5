"""Lookahead decoding (Fu et al., 2024, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding"): exact greedy decoding of a causal model that needs no draft model and no
training.

Each step is one forward over `[current | lookahead window | G verification branches]`:

* The lookahead window is a 2-D Jacobi trajectory, `level - 1` levels of `window_size` columns;
  column j of level l sits `1 + l + j` positions after the current token and sees the first
  level's earlier columns and its own column's earlier levels. The predictions after the last
  level are the next level (the oldest level is dropped), and every column's tokens plus its new
  prediction form an n-gram of `level` tokens.
* N-grams go to a per-row pool keyed by their first token, at most `guess_set_size` per key (the
  oldest of that key goes first; duplicates are not added). The pool holds `pool_capacity`
  entries in all; when it is full the oldest entry goes.
* The verification branches are the (up to) `guess_set_size` most recent n-grams whose key is the
  row's last decided token; each is checked against the greedy predictions and the longest
  verified prefix, plus the prediction after it, is accepted (1 to `level` tokens a step).

Published defaults (LLaMA-2-7B): `level` N = 5, `window_size` W = 7, `guess_set_size` G = 7; the
reference implementation's `POOL_FROM_PROMPT` seeds the pool with the prompt's n-grams. The levels
start as tokens drawn from the row's prompt (the reference implementation's initialisation) and
n-grams are pooled once every level but the first has been produced by the model. Here the pool
has a fixed size (a JAX carry), where the reference implementation's dictionary grows without
bound. It has no diffusion block and no Jacobi window: its window is `window_size`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.draft_verify import DraftVerifyPolicy, Proposal, VerifyLayout
from jaxdllm.errors import ConfigError

_NEVER = jnp.iinfo(jnp.int32).max


@dataclasses.dataclass(frozen=True)
class Lookahead(DraftVerifyPolicy):
    """`level` N (n-gram length; a step accepts up to N tokens), `window_size` W (columns of the
    lookahead window), `guess_set_size` G (n-grams kept per key and verified per step),
    `pool_capacity` (n-grams per row in all), `pool_from_prompt` (seed the pool with the prompt's
    n-grams). See the module docstring."""

    level: int = 5
    window_size: int = 7
    guess_set_size: int = 7
    pool_capacity: int = 512
    pool_from_prompt: bool = False
    name = "lookahead"

    def check(self, config):
        super().check(config)
        for name, low in (("level", 2), ("window_size", 1), ("guess_set_size", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r} (policy 'lookahead')")
        if not isinstance(self.pool_capacity, int) or self.pool_capacity < self.guess_set_size:
            raise ConfigError(f"pool_capacity must be an integer >= guess_set_size ({self.guess_set_size}), "
                              f"got {self.pool_capacity!r}")

    def layout(self) -> VerifyLayout:
        return VerifyLayout(self.level - 1, self.window_size, self.guess_set_size, self.level - 1)

    def start(self, prompt, seg, gen_length, key):
        b, lp = prompt.shape
        n, w = self.level - 1, self.window_size
        real = jnp.maximum(seg.sum(1), 1)  # tokens of each row, right-aligned
        pick = lp - 1 - jax.random.randint(key, (b, n * w), 0, 1 << 30) % real[:, None]
        state = {"levels": jnp.take_along_axis(prompt, pick, axis=1).astype(jnp.int32).reshape(b, n, w),
                 "keys": jnp.full((b, self.pool_capacity), -1, jnp.int32),
                 "grams": jnp.zeros((b, self.pool_capacity, n), jnp.int32),
                 "stamp": jnp.full((b, self.pool_capacity), -1, jnp.int32),
                 "clock": jnp.zeros((b,), jnp.int32), "steps": jnp.zeros((), jnp.int32)}
        if self.pool_from_prompt and lp >= self.level:
            prompt = prompt.astype(jnp.int32)

            def add(i, state):  # the prompt's n-gram starting at i, if it lies in the real tokens
                gram = jax.lax.dynamic_slice_in_dim(prompt, i, self.level, axis=1)
                return self.remember(state, gram[:, 0], gram[:, 1:], i >= lp - real)

            state = jax.lax.fori_loop(0, lp - self.level + 1, add, state)
        return jnp.broadcast_to(prompt[:, -1:], (b, gen_length)), state  # the canvas draft is not read

    def propose(self, state, last, draft):
        b = last.shape[0]
        score = jnp.where(state["keys"] == last[:, None], state["stamp"] + 1, 0)   # newest first
        best, index = jax.lax.top_k(score, self.guess_set_size)
        branches = jnp.take_along_axis(state["grams"], index[..., None], axis=1)
        return Proposal(state["levels"].reshape(b, -1), branches, best > 0)

    def update(self, state, last, proposal, lookahead_predictions, tokens, active, seen=None):
        b, n, w = state["levels"].shape
        levels = state["levels"]
        new = lookahead_predictions.reshape(b, n, w)[:, -1]                           # the next level
        store = active & (state["steps"] >= n - 1)  # every level past the first came from the model

        def add(j, state):  # column j's trajectory and its new token: one n-gram
            column = jnp.concatenate([levels[:, :, j], new[:, j:j + 1]], 1)          # [B, N]
            return self.remember(state, column[:, 0], column[:, 1:], store)

        for j in range(w):  # W is small and static
            state = add(j, state)
        shifted = jnp.concatenate([levels[:, 1:], new[:, None]], 1)
        return {**state, "levels": jnp.where(active[:, None, None], shifted, levels), "steps": state["steps"] + 1}

    def remember(self, state, key: jax.Array, gram: jax.Array, store: jax.Array):
        """The pool with `gram [B, N-1]` under `key [B]` for rows where `store [B]`, unless already
        there; a key holding `guess_set_size` n-grams loses its oldest, else the pool's oldest goes."""
        keys, grams, stamp = state["keys"], state["grams"], state["stamp"]
        same_key = keys == key[:, None]
        seen = (same_key & (grams == gram[:, None]).all(-1)).any(1)
        full = same_key.sum(1) >= self.guess_set_size
        age = jnp.where(full[:, None] & ~same_key, _NEVER, stamp)
        slot = jnp.argmin(age, axis=1)
        store = store & ~seen
        rows = jnp.arange(key.shape[0])

        def put(table, value):
            return table.at[rows, slot].set(jnp.where(store.reshape((-1,) + (1,) * (value.ndim - 1)), value,
                                                      table[rows, slot]))

        return {**state, "keys": put(keys, key), "grams": put(grams, gram), "stamp": put(stamp, state["clock"]),
                "clock": state["clock"] + store.astype(jnp.int32)}
