"""Multiverse's fork and merge settings (Yang et al. 2025, `Multiverse4FM/Multiverse-Engine`;
`assd-hogwild-multiverse.md` §3d): which tokens open and close the parallel structure and what a forked
path and a merged conclusion are fed first.

The model writes `<Parallel><Goal><Outline>1…</Outline>…</Goal>` sequentially; at `</Goal>` the sequence
forks into one row per outline, path k fed "\\n<Path>\\n{k}:" first (the published engine; with
`newlines=False`, "<Path>{k}:"); every path ends at `</Path>`, and once all have, the parent continues with
"<Conclusion>\\n" (or "<Conclusion>") over all of them. The canvas (`jaxdllm/decoding/multiverse_canvas.py`)
does the forking; this policy holds the ids and picks tokens (argmax, or a sample at the loop's temperature).

The 12 tags are consecutive ids from `tag_base` in the published order (`TAGS`); Qwen2.5-based
Multiverse-32B has them at 151665…151676. `settings_for(tokenizer)` reads every id from a tokenizer, and
`sampler_defaults(checkpoint, "multiverse")` does so from the checkpoint's own tokenizer.
"""

from __future__ import annotations

import dataclasses

import jax

from jaxdllm.data.multiverse_tags import TAGS
from jaxdllm.decoding.policies.base import Policy, choose_tokens
from jaxdllm.errors import ConfigError



@dataclasses.dataclass(frozen=True)
class Multiverse(Policy):
    """`max_paths`: rows each request may fork into at once (its own row aside; nested forks share them).
    `tag_base`: the id of `<Think>` (the 12 tags follow in `TAGS` order). `digit_ids`: '0'..'9'; `colon_id`:
    ':'; `newline_id`: '\\n'. `newlines`: the published engine's prefixes "\\n<Path>\\n{k}:" and
    "<Conclusion>\\n" (False: "<Path>{k}:" and "<Conclusion>", for models trained without separators).
    `max_blocks`: text segments per request (its prompt's, one per path, one per merge; 0: `2 * max_paths +
    2`). `page_size`: slots per page of the shared K/V (`jaxdllm/decoding/pages.py`)."""

    max_paths: int = 4
    tag_base: int | None = None
    digit_ids: tuple[int, ...] = ()
    colon_id: int | None = None
    newline_id: int | None = None
    newlines: bool = True
    max_blocks: int = 0
    page_size: int = 16
    name = "multiverse"
    canvas = "multiverse_canvas"

    def check(self, config) -> None:
        super().check(config)
        if not isinstance(self.max_paths, int) or isinstance(self.max_paths, bool) or not 1 <= self.max_paths <= 9:
            raise ConfigError(f"max_paths must be an integer in 1..9 (rows a request forks into), got {self.max_paths!r}")
        if self.digit_ids and len(self.digit_ids) != 10:
            raise ConfigError(f"digit_ids must be the 10 ids of '0'..'9', got {len(self.digit_ids)}")
        if not isinstance(self.page_size, int) or self.page_size < 1:
            raise ConfigError(f"page_size must be a positive integer (slots per K/V page), got {self.page_size!r}")
        if self.max_blocks and self.max_blocks < self.max_paths + 2:
            raise ConfigError(f"max_blocks must be at least max_paths + 2 = {self.max_paths + 2} (the prompt's segment, "
                              f"one per path, the conclusion's), got {self.max_blocks}")

    def check_ids(self) -> None:
        """Raise `ConfigError` unless the ids are set (the canvas asks before decoding: a preset has none)."""
        if (self.tag_base is None or self.colon_id is None or len(self.digit_ids) != 10
                or (self.newlines and self.newline_id is None)):
            raise ConfigError("policy 'multiverse' needs the tag ids: pass tag_base (the id of <Think>), digit_ids, "
                              "colon_id and newline_id, e.g. **jaxdllm.decoding.policies.multiverse.settings_for("
                              "tokenizer); sampler_defaults(checkpoint, 'multiverse') reads them from its tokenizer")

    @property
    def blocks(self) -> int:
        """Text segments per request."""
        return self.max_blocks or 2 * self.max_paths + 2

    def tag(self, name: str) -> int:
        """The id of tag `name` (one of `TAGS`)."""
        return int(self.tag_base) + TAGS.index(name)

    def path_feed(self, k: int) -> tuple[int, ...]:
        """The ids path `k` (1-based) is fed first."""
        newline = (self.newline_id,) if self.newlines else ()
        return (newline + (self.tag("<Path>"),) + newline + tuple(self.digit_ids[int(d)] for d in str(k))
                + (self.colon_id,))

    def tokenizer_settings(self, tokenizer) -> dict:
        """The tag, digit, ':' and newline ids of `tokenizer` (`settings_for`)."""
        return settings_for(tokenizer)

    def conclusion_feed(self) -> tuple[int, ...]:
        """The ids a merged parent is fed first."""
        return (self.tag("<Conclusion>"),) + ((self.newline_id,) if self.newlines else ())

    def choose(self, logits: jax.Array, key: jax.Array, temperature: float, *, path: jax.Array,
               position: jax.Array) -> jax.Array:
        """`[R]` the next token of each row from its `[R, V]` logits (argmax, or a sample at `temperature`).
        `path [R]` (0: a request's own row, k: its k-th path) and `position [R]` (where the token will sit)
        are there for policies that choose by them."""
        del path, position
        return choose_tokens(logits[:, None], temperature, key)[:, 0]


def settings_for(tokenizer) -> dict:
    """The policy's id settings read from `tokenizer` (a `jaxdllm.Tokenizer` whose vocabulary holds the 12
    tags as single tokens, consecutive in `TAGS` order, and single-token digits, ':' and '\\n')."""
    def one(text):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ConfigError(f"{text!r} is {len(ids)} tokens in this tokenizer, not one: it is not a Multiverse "
                              "tokenizer (the tags, digits, ':' and newline must be single tokens)")
        return int(ids[0])

    tags = [one(t) for t in TAGS]
    if tags != list(range(tags[0], tags[0] + len(TAGS))):
        raise ConfigError(f"the tags' ids {tags} are not consecutive in the published order")
    return dict(tag_base=tags[0], digit_ids=tuple(one(str(d)) for d in range(10)), colon_id=one(":"),
                newline_id=one("\n"))
