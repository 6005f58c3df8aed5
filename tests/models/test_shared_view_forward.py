"""Rows reading views of shared cache blocks (Hogwild! workers) against contiguous layouts.

A one-layer model's logits over a view must equal a plain forward over the view's text laid out
contiguously (layer-0 keys depend only on token and position). With more layers a block's deeper K/V
were computed from its writer's view (the published caveat), so the reference is the published
main-branch method: a contiguous cache assembled from the blocks with every key re-rotated by its
block's offset (key-side rotation), and the new tokens run through it causally. Both hold at every
step, for 2-4 workers feeding 1-3 tokens each, every worker seeing the others' newest tokens.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdllm.attention import MaskSpec
from jaxdllm.attention.shared_view import SharedView
from jaxdllm.models.cache import KVCache
from jaxdllm.models.layers import apply_rope, rope_inv_freq
from tests.support.forward import forward
from tests.support.models import tiny_model

COMMON, OTHERS, OWN = 0, 1, 2  # the shared blocks; worker w writes block 3 + w
SLOTS = 24


def _views(lengths: np.ndarray, workers: int):
    """Hogwild! views `[common, others header, the other workers' blocks, own header, own block]`, offsets as
    running sums of the block lengths."""
    blocks, offsets = [], []
    for w in range(workers):
        order = [COMMON, OTHERS] + [3 + u for u in range(workers) if u != w] + [OWN, 3 + w]
        blocks.append(order)
        offsets.append(np.concatenate([[0], np.cumsum(lengths[order])[:-1]]))
    return np.asarray(blocks, np.int32), np.asarray(offsets, np.int32)


def _fill(model, cache, tokens, block):
    """Write `tokens` into an empty block (a one-entry view), returning the cache."""
    ids = jnp.asarray(tokens, jnp.int32)[None]
    view = SharedView(view_blocks=jnp.asarray([[block]], jnp.int32), view_offsets=jnp.zeros((1, 1), jnp.int32),
                      write_block=jnp.asarray([block], jnp.int32), write_slot=jnp.zeros((1,), jnp.int32),
                      q_valid=jnp.ones(ids.shape, bool))
    return forward(model, ids, jnp.arange(ids.shape[1])[None], view, cache).cache


def _steps(model, workers: int, seed: int):
    """Yield `(logits [W, L, V], n [W], text per block, cache, views, offsets)` after each parallel step."""
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    cache = model.init_cache(3 + workers, SLOTS)
    text = {COMMON: list(rng.integers(5, vocab, 6)), OTHERS: list(rng.integers(5, vocab, 3)),
            OWN: list(rng.integers(5, vocab, 2))}
    for block in (COMMON, OTHERS, OWN):
        cache = _fill(model, cache, text[block], block)
    for w in range(workers):
        text[3 + w] = []
    for _ in range(3):
        n = rng.integers(1, 4, workers)
        new = [rng.integers(5, vocab, k) for k in n]
        old = np.asarray([len(text[3 + w]) for w in range(workers)])
        for w in range(workers):
            text[3 + w] += list(new[w])
        lengths = np.asarray([len(text[b]) for b in range(3 + workers)])
        views, offsets = _views(lengths, workers)
        width = 3
        ids = np.zeros((workers, width), np.int32)
        for w in range(workers):
            ids[w, :n[w]] = new[w]
        positions = offsets[:, -1:] + old[:, None] + np.arange(width)[None]
        view = SharedView(view_blocks=jnp.asarray(views), view_offsets=jnp.asarray(offsets),
                          write_block=jnp.asarray(3 + np.arange(workers), jnp.int32),
                          write_slot=jnp.asarray(old, jnp.int32), q_valid=jnp.asarray(np.arange(width)[None] < n[:, None]))
        out = forward(model, jnp.asarray(ids), jnp.asarray(positions, jnp.int32), view, cache)
        cache = out.cache
        yield np.asarray(out.logits), n, text, cache, views, offsets


# the slow run (the default run's 6-minute budget); 2 and 3 workers: every step of
# tests/decoding/test_hogwild_generate.py, in the default run
@pytest.mark.parametrize("workers", [pytest.param(4, marks=pytest.mark.slow)])
def test_one_layer_views_equal_a_plain_forward_over_the_contiguous_text(workers):
    model = tiny_model("tiny-qwen2", shared=True, num_layers=1)
    for logits, n, text, _, views, _ in _steps(model, workers, seed=workers):
        for w in range(workers):
            contiguous = np.concatenate([text[b] for b in views[w]]).astype(np.int32)
            plain = np.asarray(forward(model, jnp.asarray(contiguous)[None]).logits[0])
            np.testing.assert_allclose(logits[w, :n[w]], plain[-n[w]:], atol=2e-5, rtol=1e-4)


def _key_rotated_cache(model, cache, view_blocks, view_offsets, text, own_new: int):
    """The published reference layout for one worker: its view copied into a contiguous cache, each block's
    keys re-rotated by the block's offset; the own block's newest `own_new` slots are left empty (the
    reference forward recomputes them)."""
    inv_freq = rope_inv_freq(model.config.rope_dim, model.config.rope_theta, model.config.rope_scaling)
    ks, vs = [], []
    for layer_k, layer_v in zip(cache.k, cache.v):
        pieces_k, pieces_v = [], []
        for block, offset in zip(view_blocks, view_offsets):
            length = len(text[block])
            k = layer_k[block, :length][None]
            pieces_k.append(apply_rope(k, jnp.full((1, length), offset), inv_freq)[0])
            pieces_v.append(layer_v[block, :length])
        ks.append(jnp.concatenate(pieces_k)[None])
        vs.append(jnp.concatenate(pieces_v)[None])
    total = sum(len(text[b]) for b in view_blocks)
    seg = (jnp.arange(total) < total - own_new).astype(jnp.int32)[None]
    return KVCache(k=tuple(ks), v=tuple(vs), segment_ids=seg)


# 2 workers in the slow run (the default run's 6-minute budget): 4 covers the view of more blocks
@pytest.mark.parametrize("workers", [pytest.param(2, marks=pytest.mark.slow), 4])
def test_views_equal_a_key_rotated_contiguous_cache(workers):
    model = tiny_model("tiny-qwen2", shared=True)
    assert model.config.num_layers > 1
    for logits, n, text, cache, views, offsets in _steps(model, workers, seed=10 + workers):
        for w in range(workers):
            ref_cache = _key_rotated_cache(model, cache, views[w], offsets[w], text, int(n[w]))
            total = int(ref_cache.segment_ids.shape[1])
            new = jnp.asarray(text[views[w][-1]][-n[w]:], jnp.int32)[None]
            start = total - int(n[w])
            causal = MaskSpec(kind="causal", q_offset=start)
            out = forward(model, new, jnp.arange(start, total)[None], causal, ref_cache)
            np.testing.assert_allclose(logits[w, :n[w]], np.asarray(out.logits[0]), atol=2e-5, rtol=1e-4)


def test_a_shared_view_forward_without_a_cache_is_refused():
    model = tiny_model("tiny-qwen2", shared=True)
    view = SharedView(view_blocks=jnp.zeros((1, 1), jnp.int32), view_offsets=jnp.zeros((1, 1), jnp.int32),
                      write_block=jnp.zeros((1,), jnp.int32), write_slot=jnp.zeros((1,), jnp.int32),
                      q_valid=jnp.ones((1, 2), bool))
    with pytest.raises(Exception, match="shared blocks' cache"):
        model(jnp.ones((1, 2), jnp.int32), jnp.arange(2)[None], view)
