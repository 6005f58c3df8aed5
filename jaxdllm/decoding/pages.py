"""Fixed-size pages of shared K/V for the canvases whose rows read each other's text (Multiverse, Hogwild!).

A request owns a pool of pages of `page` slots (`jaxdllm.attention.shared_view`: each page is a block, its
keys at page-local positions). A row's view is an ordered list of pages, each at an offset; the row writes
its tokens into its last page and, when that page is full, into new pages appended to its view. Text is
never copied: forking, merging or finishing a step only changes which pages a row's view lists.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxdllm.decoding.canvas import Canvas
from jaxdllm.errors import ConfigError


def pages_needed(fill: jax.Array, n: jax.Array, page: int) -> jax.Array:
    """`[R]` new pages a row needs to write `n [R]` tokens after `fill [R]` slots of its last page (`page`
    slots each; `fill == page`: the last page is full)."""
    return jnp.where(n > 0, jnp.maximum((fill + n + page - 1) // page - 1, 0), 0)


def allocate(need: jax.Array, next_page: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(first [B, K], next_page [B])`: each row's first new page (request-local id) for `need [B, K]`
    pages per row of each request, handed out in row order from `next_page [B]`."""
    first = next_page[:, None] + jnp.cumsum(need, 1) - need
    return first, next_page + need.sum(1)


def append_pages(view_pages: jax.Array, view_offsets: jax.Array, n_view: jax.Array, first: jax.Array,
                 need: jax.Array, page: int, most: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Append pages `first .. first + need - 1` (global ids, `[R]`) to each row's view, each `page` positions
    after the one before (the row's text goes on in them); `most` bounds `need` (static)."""
    v = view_pages.shape[1]
    last = jnp.maximum(n_view - 1, 0)
    last_offset = jnp.take_along_axis(view_offsets, last[:, None], 1)[:, 0]
    entry = jnp.arange(v)[None]
    for i in range(most):
        at = (entry == (n_view + i)[:, None]) & (i < need)[:, None]
        view_pages = jnp.where(at, (first + i)[:, None], view_pages)
        view_offsets = jnp.where(at, (last_offset + page * (i + 1))[:, None], view_offsets)
    return view_pages, view_offsets, n_view + need


def write_targets(view_pages: jax.Array, n_view_before: jax.Array, fill: jax.Array, n: jax.Array, width: int,
                  page: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`(pages [R, L], slots [R, L], valid [R, L])` of the `n [R]` tokens each row writes after `fill` slots of
    the last page of its view before the new ones (`n_view_before`), continuing into the appended pages."""
    g = fill[:, None] + jnp.arange(width, dtype=jnp.int32)[None]
    entry = jnp.clip(n_view_before[:, None] - 1 + g // page, 0, view_pages.shape[1] - 1)
    valid = jnp.arange(width)[None] < n[:, None]
    return jnp.take_along_axis(view_pages, entry, 1), g % page, valid


def after_write(fill: jax.Array, n: jax.Array, page: int) -> jax.Array:
    """`[R]` slots used in the last page after writing `n` tokens after `fill`."""
    return jnp.where(n > 0, (fill + n - 1) % page + 1, fill)


def page_lengths(segment_ids: jax.Array) -> jax.Array:
    """`[NP]` written slots of each page (pages fill from slot 0)."""
    return (segment_ids > 0).sum(1).astype(jnp.int32)


def view_text(tokens: jax.Array, segment_ids: jax.Array, view_pages: jax.Array, skip: jax.Array, width: int,
              fill_value) -> tuple[jax.Array, jax.Array]:
    """`(text [B, width], length [B])`: each row's text, the written slots of its view's pages in order
    (`view_pages [B, V]`, -1 unused; `tokens [NP, P]` any per-slot value), the first `skip [B]` dropped,
    `fill_value` after the end; its length (at most `width`)."""
    b, v = view_pages.shape
    page = tokens.shape[1]
    used = view_pages >= 0
    ids = tokens[jnp.maximum(view_pages, 0)].reshape(b, v * page)
    written = ((segment_ids[jnp.maximum(view_pages, 0)] > 0) & used[:, :, None]).reshape(b, v * page)
    index = jnp.cumsum(written, 1) - 1 - skip[:, None]                         # place in the text
    index = jnp.where(written & (index >= 0) & (index < width), index, width)
    out = jnp.full((b, width), fill_value, tokens.dtype)
    length = jnp.clip(written.sum(1) - skip, 0, width).astype(jnp.int32)
    return out.at[jnp.arange(b)[:, None], index].set(ids, mode="drop"), length


class SharedPagesCanvas(Canvas):
    """What the canvases over shared pages check alike: their own K/V (no loop cache), token-by-token
    decoding (no block stop), and a causal model of the shared Transformer (whose attention layer reads a
    `SharedView`)."""

    diffusion_blocks = False

    def check_config(self, config) -> None:
        name = config.policy.name
        if config.cache.keeps_kv:
            raise ConfigError(f"policy={name!r} keeps its own shared K/V pages: leave cache='none'")
        if config.stop_at_eos == "block":
            raise ConfigError(f"stop_at_eos='block' finishes a diffusion block; policy={name!r} decodes token by token")

    def check_model(self, model_config, config) -> None:
        from jaxdllm.models.transformer import _MODELS, Transformer  # a family's own model has no SharedView path
        if (model_config.attention != "causal" or model_config.shift_logits
                or _MODELS.get(type(model_config), Transformer) is not Transformer):
            raise ConfigError(f"policy={config.policy.name!r} decodes causal models of the shared Transformer "
                              f"(Qwen2/Llama families); this model has attention={model_config.attention!r}")
