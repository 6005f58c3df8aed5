"""Hogwild! Inference's settings (Rodionov et al. 2025, `eqimp/hogwild_llm`; `assd-hogwild-multiverse.md` §2):
the workers, their pre-tokenized texts and the published step-end rule as id sets.

N workers of one model write at once, each reading `[common history, "### Work in progress (others)",
the other workers' current steps, "### Work in progress (own)", its own step]`; the canvas
(`jaxdllm/decoding/hogwild_canvas.py`) does that. Everything text-shaped is pre-tokenized here, as tuples
of ids (static settings), by `jaxdllm.decoding.hogwild_text` from a tokenizer and a `HogwildFormat`
(the prompt template a user may change): `jaxdllm.decoding.hogwild_text.settings_for(tokenizer, fmt)`.

**Step end** (`formatting.py`): a step ends when the newest token completes a "\\n\\n" and the text before
that break ends a sentence (`. ? ! 。 …`). A break may lie inside one token (".\\n\\n"), start a token
("\\n\\n" after "."), or span two tokens ("\\n" then "\\n": a character tokenizer); the id sets below
cover all three with the last three tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxdllm.decoding.policies.base import Policy, choose_tokens
from jaxdllm.errors import ConfigError

@dataclasses.dataclass(frozen=True)
class Hogwild(Policy):
    """`workers`: N (2-4). `first_steps`: each worker's first step (its header "**Alice [1]:** " included).
    `header_prefixes` (per worker, "**Alice ["), `digit_ids` ('0'..'9'), `header_suffix` ("]:** "): a new
    step's header. `others_header`, `own_header`: the two constant blocks. `check_ids`, `check_every`: the
    redundancy check opening a step once a worker wrote more than `check_every` tokens since its last one.
    `finisher_ids`, `finisher_tokens`: the s1-style finisher when the budget ends without an EOS (greedy).
    `page_size`: slots per page of the shared K/V (`jaxdllm/decoding/pages.py`).
    The id sets (`break_ids` ...) are the step-end rule's (module notes); `suppress_ids` are never chosen."""

    workers: int = 2
    first_steps: tuple[tuple[int, ...], ...] = ()
    header_prefixes: tuple[tuple[int, ...], ...] = ()
    header_suffix: tuple[int, ...] = ()
    digit_ids: tuple[int, ...] = ()
    others_header: tuple[int, ...] = ()
    own_header: tuple[int, ...] = ()
    check_ids: tuple[int, ...] = ()
    check_every: int = 256
    finisher_ids: tuple[int, ...] = ()
    finisher_tokens: int = 16
    break_ids: tuple[int, ...] = ()
    break_sentence_ids: tuple[int, ...] = ()
    break_leading_ids: tuple[int, ...] = ()
    newline_start_ids: tuple[int, ...] = ()
    newline_end_ids: tuple[int, ...] = ()
    newline_only_ids: tuple[int, ...] = ()
    sentence_end_ids: tuple[int, ...] = ()
    sentence_newline_ids: tuple[int, ...] = ()
    suppress_ids: tuple[int, ...] = ()
    page_size: int = 16
    name = "hogwild"
    canvas = "hogwild_canvas"

    def check(self, config) -> None:
        super().check(config)
        if not isinstance(self.workers, int) or not 2 <= self.workers <= 4:
            raise ConfigError(f"workers must be 2, 3 or 4, got {self.workers!r}")
        if self.first_steps and (len(self.first_steps) != self.workers or len(self.header_prefixes) != self.workers):
            raise ConfigError(f"first_steps and header_prefixes need one entry per worker ({self.workers}); got "
                              f"{len(self.first_steps)} and {len(self.header_prefixes)}")
        if (self.finisher_tokens < 1 or self.check_every < 1 or not isinstance(self.page_size, int)
                or self.page_size < 1):
            raise ConfigError("finisher_tokens, check_every and page_size must be >= 1, got "
                              f"{self.finisher_tokens}, {self.check_every}, {self.page_size!r}")

    def check_texts(self) -> None:
        """Raise `ConfigError` unless the pre-tokenized texts are set (the canvas asks before decoding)."""
        if not self.first_steps or len(self.digit_ids) != 10 or not self.finisher_ids:
            raise ConfigError("policy 'hogwild' needs its pre-tokenized texts: pass "
                              "**jaxdllm.decoding.hogwild_text.settings_for(tokenizer, HogwildFormat(...)) (the first "
                              "steps, headers, checks and the step-end id sets); sampler_defaults(checkpoint, 'hogwild') "
                              "reads them from its tokenizer")

    @property
    def step_feed(self) -> int:
        """The most tokens a worker is fed in one forward while working: its first step, or a step's break
        token + header (up to 3 digits) + the redundancy check."""
        header = 1 + max(len(p) for p in self.header_prefixes) + 3 + len(self.header_suffix) + len(self.check_ids)
        return max([header] + [len(s) for s in self.first_steps])

    @property
    def chunk(self) -> int:
        """The widest prefix a row is fed in one forward: a working step's, or the finisher's."""
        return max(self.step_feed, len(self.finisher_ids))

    def ids(self, name: str) -> jax.Array:
        """One of the id sets as an int32 array (-1 when empty, which no token equals)."""
        return jnp.asarray(getattr(self, name) or (-1,), jnp.int32)

    def step_ends(self, q: jax.Array, p: jax.Array, t: jax.Array) -> jax.Array:
        """`[R]` bool: the sampled `t` ends the step, `p` and `q` the two tokens before it (all `[R]`)."""
        isin = lambda x, name: jnp.isin(x, self.ids(name))
        inside = isin(t, "break_ids")
        decided_inside = isin(t, "break_sentence_ids") | (isin(t, "break_leading_ids") & isin(p, "sentence_end_ids"))
        across = ~inside & isin(t, "newline_start_ids") & isin(p, "newline_end_ids")
        before_across = jnp.where(isin(p, "newline_only_ids"), isin(q, "sentence_end_ids"),
                                  isin(p, "sentence_newline_ids"))
        return (inside & decided_inside) | (across & before_across)

    def tokenizer_settings(self, tokenizer) -> dict:
        """The texts and id sets of the default `HogwildFormat` with this policy's workers, check interval and
        finisher length, for `tokenizer` (`jaxdllm.decoding.hogwild_text.settings_for`)."""
        from jaxdllm.decoding.hogwild_text import HogwildFormat, settings_for

        return settings_for(tokenizer, HogwildFormat(workers=self.workers, check_every=self.check_every,
                                                     finisher_tokens=self.finisher_tokens))

    def choose(self, logits: jax.Array, key: jax.Array, temperature: float, *, worker: jax.Array,
               step: jax.Array) -> jax.Array:
        """`[R]` each row's next token from `[R, V]` logits, the suppressed ids removed (argmax, or a sample
        at `temperature`). `worker [R]` and `step` (the loop step) are there for policies that use them."""
        del worker, step
        logits = logits.at[:, self.ids("suppress_ids")].set(-jnp.inf, mode="drop") if self.suppress_ids else logits
        return choose_tokens(logits[:, None], temperature, key)[:, 0]
