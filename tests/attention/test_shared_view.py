"""Shared-view attention (`jaxdllm.attention.shared_view`) against an independent numpy definition.

The reference concatenates, for each query, the keys its view makes visible (a slot of a block in use that
is written and whose logical position `offset + j` is at most the query's), rotates every key at its logical
position and every query at its own, and takes one float64 softmax: what a contiguous causal forward over
the view's text computes. Views: Hogwild!-style (2-4 workers, offsets running sums of the blocks' lengths,
the own block partly written), Multiverse-style (paths at the same offset, a conclusion reading all of them),
and random ones (entries wholly after the queries, unused entries, rows seeing nothing). The merge path runs
on the reference backend's lse variant, the tile kernel and splash (both in the Pallas interpreter on CPU);
the dense path is checked too. The lse variants are checked against a numpy logsumexp of the masked scores.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdllm.attention.mask import MaskSpec
from jaxdllm.attention.reference import reference_attention_lse
from jaxdllm.attention.shared_view import (SharedView, merge_partials, view_attention, view_attention_dense,
                                           view_attention_merged)
from jaxdllm.attention.tpu_splash import splash_attention_lse
from jaxdllm.attention.triton_flash import BlockSizes, flash_attention_lse
from jaxdllm.errors import ConfigError

S, H, HKV, D = 8, 2, 1, 8          # slots per block, query heads, kv heads (GQA), head dim
INV_FREQ = 1.0 / (100.0 ** (np.arange(0, D, 2) / D))
TILES = BlockSizes(16, 16, 16, 16)
KERNEL_OPTIONS = {"pallas": {"block_sizes": TILES}, "splash": {"min_query_block": 1}, "reference": {}}


# ------------------------------------------------------------------------------------ RoPE, twice --
def _rotate(x, at):
    """jnp rotate-half RoPE: `x [N, L, heads, D]` at positions `at [N, L]` (the callback under test)."""
    ang = at.astype(jnp.float32)[..., None, None] * jnp.asarray(INV_FREQ, jnp.float32)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * jnp.cos(ang) - x2 * jnp.sin(ang), x2 * jnp.cos(ang) + x1 * jnp.sin(ang)], -1)


def _rotate_np(x, at):
    """float64 numpy RoPE of `x [..., D]` at scalar position `at`."""
    ang = at * INV_FREQ
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)


# -------------------------------------------------------------------------------- the definition --
def _numpy_view_attention(q, positions, k_raw, v, blocks, offsets, seg):
    """`[R, L, H, D]` float64: per query, the view's visible keys concatenated, one softmax. `k_raw` are the
    keys before RoPE; a key is rotated at its logical position, a query at its own."""
    r, length = positions.shape
    out = np.zeros((r, length, H, D))
    for row in range(r):
        for i in range(length):
            p = positions[row, i]
            keys, vals = [], []
            for b, o in zip(blocks[row], offsets[row]):
                for j in range(S):
                    if b >= 0 and seg[b, j] != 0 and o + j <= p:
                        keys.append(_rotate_np(k_raw[b, j].astype(np.float64), o + j))   # [Hkv, D]
                        vals.append(v[b, j].astype(np.float64))
            if not keys:
                continue
            keys, vals = np.stack(keys), np.stack(vals)                                   # [n, Hkv, D]
            for head in range(H):
                kv_head = head // (H // HKV)
                qh = _rotate_np(q[row, i, head].astype(np.float64), p)
                scores = keys[:, kv_head] @ qh / np.sqrt(D)
                w = np.exp(scores - scores.max())
                out[row, i, head] = (w / w.sum()) @ vals[:, kv_head]
    return out


def _arrays(rng, nb, r, length):
    q = rng.standard_normal((r, length, H, D)).astype(np.float32)
    k_raw = rng.standard_normal((nb, S, HKV, D)).astype(np.float32)
    v = rng.standard_normal((nb, S, HKV, D)).astype(np.float32)
    # the stored blocks: keys rotated at their block-local slot
    k_blocks = np.asarray(_rotate(jnp.asarray(k_raw), jnp.broadcast_to(jnp.arange(S), (nb, S))))
    return q, k_raw, k_blocks, v


# ------------------------------------------------------------------------------------- the views --
def _hogwild(rng, workers):
    """Common history (block 0), then each worker's step (block 1 + w), partly written; worker w's view is
    `[common, the others' steps, own step, unused]`, offsets running sums of the written lengths; each worker
    feeds its newest `length` tokens (worker 0 one fewer: a padding query at the next position)."""
    length = 3
    nb = 1 + workers
    lengths = np.concatenate([[rng.integers(3, S + 1)], rng.integers(length, S, size=workers)])
    seg = (np.arange(S)[None] < lengths[:, None]).astype(np.int32)
    blocks, offsets, positions, valid = [], [], [], []
    for w in range(workers):
        order = [0] + [1 + u for u in range(workers) if u != w] + [1 + w]
        offs = np.concatenate([[0], np.cumsum(lengths[order])[:-1]])
        blocks.append(order + [-1])
        offsets.append(list(offs) + [0])
        n_new = length - (w == 0)
        first = offs[-1] + lengths[1 + w] - n_new
        positions.append(first + np.arange(length))
        valid.append(np.arange(length) < n_new)
        if w == 0:  # the padding query's slot is not written
            seg[1 + w, lengths[1 + w]:] = 0
    return nb, seg, np.asarray(blocks), np.asarray(offsets), np.asarray(positions), np.asarray(valid)


def _multiverse(rng, paths):
    """A prefix (block 0, offset 0), `paths` path blocks all at the prefix's length, one row per path
    feeding its newest tokens, and a conclusion (block 1 + paths) reading the prefix and every path."""
    length = 2
    nb = 2 + paths
    lengths = rng.integers(length, S + 1, size=nb)
    seg = (np.arange(S)[None] < lengths[:, None]).astype(np.int32)
    p = lengths[0]
    conclusion_at = p + lengths[1:1 + paths].max()
    blocks, offsets, positions = [], [], []
    for w in range(paths):
        blocks.append([0, 1 + w] + [-1] * paths)
        offsets.append([0, p] + [0] * paths)
        positions.append(p + lengths[1 + w] - length + np.arange(length))
    blocks.append([0] + [1 + w for w in range(paths)] + [1 + paths])
    offsets.append([0] + [p] * paths + [conclusion_at])
    positions.append(conclusion_at + lengths[1 + paths] - length + np.arange(length))
    valid = np.ones((paths + 1, length), bool)
    return nb, seg, np.asarray(blocks), np.asarray(offsets), np.asarray(positions), valid


def _random(rng, rows=3):
    """Random blocks (shared between rows), random written slots, offsets anywhere (entries wholly after the
    queries too), unused entries, and a last row whose entries all lie after its queries (no visible key)."""
    length, v, nb = 3, 4, 5
    seg = (rng.random((nb, S)) < 0.7).astype(np.int32) * rng.integers(1, 3, size=(nb, S))
    blocks = rng.integers(-1, nb, size=(rows, v))
    offsets = rng.integers(0, 3 * S, size=(rows, v))
    positions = rng.integers(0, 3 * S, size=(rows, 1)) + np.arange(length)[None]
    offsets[-1] = positions[-1, -1] + 1 + rng.integers(0, S, size=v)
    valid = np.ones((rows, length), bool)
    valid[0, -1] = False
    return nb, seg, blocks, offsets, positions, valid


VIEWS = {"hogwild2": lambda rng: _hogwild(rng, 2), "hogwild3": lambda rng: _hogwild(rng, 3),
         "hogwild4": lambda rng: _hogwild(rng, 4), "multiverse": lambda rng: _multiverse(rng, 3),
         "random": _random}


def _case(name, seed):
    rng = np.random.default_rng(seed)
    nb, seg, blocks, offsets, positions, valid = VIEWS[name](rng)
    r, length = positions.shape
    q, k_raw, k_blocks, v = _arrays(rng, nb, r, length)
    view = SharedView(view_blocks=jnp.asarray(blocks, jnp.int32), view_offsets=jnp.asarray(offsets, jnp.int32),
                      write_block=jnp.zeros((r,), jnp.int32), write_slot=jnp.full((r,), S, jnp.int32),
                      q_valid=jnp.asarray(valid), kv_segment_ids=jnp.asarray(seg, jnp.int32))
    want = _numpy_view_attention(q, positions, k_raw, v, blocks, offsets, seg)
    args = (jnp.asarray(q), jnp.asarray(positions, jnp.int32), jnp.asarray(k_blocks), jnp.asarray(v), view, _rotate)
    return args, want


def _jit(fn, **kw):
    """`fn(q, positions, k, v, view, rotate, **kw)` compiled once (eager op-by-op dispatch is the slow part here)."""
    return jax.jit(lambda q, pos, k, v, view: fn(q, pos, k, v, view, _rotate, **kw))


# ------------------------------------------------------------------------------------------ tests --
@pytest.mark.parametrize("name", list(VIEWS))
@pytest.mark.parametrize("seed", [0, 1])
def test_merge_on_reference_lse_and_dense_match_definition(name, seed):
    args, want = _case(name, seed)
    merged = _jit(view_attention_merged, impl="reference")(*args[:5])
    np.testing.assert_allclose(np.asarray(merged), want, atol=2e-5)
    np.testing.assert_allclose(np.asarray(_jit(view_attention_dense)(*args[:5])), want, atol=2e-5)


@pytest.mark.parametrize("impl", ["pallas", "splash"])
@pytest.mark.parametrize("name", ["hogwild3", "multiverse", "random"])
def test_merge_on_kernels_matches_definition(impl, name):
    args, want = _case(name, 2)
    got = _jit(view_attention, impl=impl, **KERNEL_OPTIONS[impl])(*args[:5])
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


def test_merge_with_keys_rotated_by_offset():
    """A wide forward (more query values than an entry's keys) rotates the gathered keys instead."""
    rng = np.random.default_rng(5)
    nb, r, length = 3, 2, 12
    seg = np.ones((nb, S), np.int32)
    blocks, offsets = np.array([[0, 1], [0, 2]]), np.array([[0, S], [0, 2]])
    positions = np.array([3, 1])[:, None] + np.arange(length)[None]
    q, k_raw, k_blocks, v = _arrays(rng, nb, r, length)
    view = SharedView(view_blocks=jnp.asarray(blocks), view_offsets=jnp.asarray(offsets),
                      write_block=jnp.zeros((r,), jnp.int32), write_slot=jnp.full((r,), S, jnp.int32),
                      q_valid=jnp.ones((r, length), bool), kv_segment_ids=jnp.asarray(seg))
    want = _numpy_view_attention(q, positions, k_raw, v, blocks, offsets, seg)
    got = _jit(view_attention_merged, impl="reference")(jnp.asarray(q), jnp.asarray(positions),
                                                        jnp.asarray(k_blocks), jnp.asarray(v), view)
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


def _numpy_lse(q, k, mask_dense, scale):
    scores = np.einsum("bqhd,bkd->bqhk", q.astype(np.float64), k[:, :, 0].astype(np.float64)) * scale
    scores = np.where(mask_dense[:, :, None, :], scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (np.where(np.isfinite(top), top, 0) + np.log(np.exp(scores - np.where(np.isfinite(top), top, 0))
                                                           .sum(-1, keepdims=True)))[..., 0]


@pytest.mark.parametrize("fn", [reference_attention_lse, lambda *a, **kw: flash_attention_lse(*a, block_sizes=TILES, **kw),
                                lambda *a, **kw: splash_attention_lse(*a, min_query_block=1, **kw)],
                         ids=["reference", "pallas", "splash"])
def test_lse_equals_numpy_logsumexp(fn):
    """Causal with a negative offset (the first queries see nothing) and unwritten slots."""
    rng = np.random.default_rng(7)
    lq, lk = 5, 7
    q = rng.standard_normal((2, lq, H, D)).astype(np.float32)
    k = rng.standard_normal((2, lk, HKV, D)).astype(np.float32)
    v = rng.standard_normal((2, lk, HKV, D)).astype(np.float32)
    kv_seg = np.array([[1, 1, 0, 1, 1, 0, 1], [0, 1, 1, 1, 1, 1, 1]], np.int32)
    mask = MaskSpec(kind="causal", q_offset=-2, q_segment_ids=jnp.ones((2, lq), jnp.int32),
                    kv_segment_ids=jnp.asarray(kv_seg))
    out, lse = fn(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), mask, scale=0.3)
    dense = (np.arange(lk)[None, None] <= (np.arange(lq) - 2)[None, :, None]) & (kv_seg[:, None] != 0)
    want = _numpy_lse(q, k, dense, 0.3)
    assert lse.shape == (2, lq, H) and lse.dtype == jnp.float32
    np.testing.assert_array_equal(np.isneginf(np.asarray(lse)), np.isneginf(want))
    np.testing.assert_allclose(np.where(np.isfinite(want), np.asarray(lse), 0), np.where(np.isfinite(want), want, 0),
                               atol=1e-5)
    assert np.all(np.asarray(out)[~dense.any(-1)] == 0)


def test_merge_partials_empty_parts():
    outs = jnp.asarray(np.random.default_rng(0).standard_normal((3, 2, 4)), jnp.float32)
    lses = jnp.asarray([[1.0, -jnp.inf], [-jnp.inf, -jnp.inf], [3.0, -jnp.inf]])
    got = np.asarray(jax.jit(merge_partials)(outs, lses))  # eager: a compile per op on CPU
    w = np.exp(np.array([1.0, 3.0]) - 3.0)
    np.testing.assert_allclose(got[0], (w[0] * outs[0, 0] + w[1] * outs[2, 0]) / w.sum(), rtol=1e-6)
    assert np.all(got[1] == 0)
    grad = jax.jit(jax.grad(lambda o, l: merge_partials(o, l).sum(), argnums=(0, 1)))(outs, lses)
    assert all(np.isfinite(np.asarray(g)).all() for g in grad)


def test_merge_path_is_differentiable_on_reference():
    args, _ = _case("hogwild2", 3)
    q, rest = args[0], args[1:]
    g_merged = jax.jit(jax.grad(lambda q: (view_attention_merged(q, *rest, impl="reference") ** 2).sum()))(q)
    g_dense = jax.jit(jax.grad(lambda q: (view_attention_dense(q, *rest) ** 2).sum()))(q)
    np.testing.assert_allclose(np.asarray(g_merged), np.asarray(g_dense), atol=1e-4)


def test_kernel_path_needs_consecutive_positions():
    args, _ = _case("hogwild2", 0)
    q, positions, *rest = args
    shuffled = positions.at[1, 0].add(5)
    with pytest.raises(ConfigError, match="consecutive"):
        view_attention_merged(q, shuffled, *rest, impl="reference")
    with pytest.raises(ConfigError, match="cudnn"):
        view_attention(q, positions, *rest, impl="cudnn")


def test_merge_path_gradients_on_the_tile_kernel():
    """The tile kernel's lse variant is differentiable (the lse cotangent enters its backward kernels):
    gradients of the merged attention in q, k and v equal the reference lse path's."""
    args, _ = _case("hogwild2", 4)
    q, pos, k, v, view, _ = args

    def loss(impl, q, k, v):
        out = view_attention_merged(q, pos, k, v, view, _rotate, impl=impl, **KERNEL_OPTIONS[impl])
        return (out * jnp.cos(out)).sum()

    grads = {impl: jax.jit(jax.grad(lambda *a, impl=impl: loss(impl, *a), argnums=(0, 1, 2)))(q, k, v)
             for impl in ("pallas", "reference")}
    for got, want in zip(grads["pallas"], grads["reference"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4)
