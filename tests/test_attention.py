"""Structured masks against per-element rules written out from algorithms.md §5/§7, and the
reference attention against a naive numpy softmax loop."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdllm.attention import MaskSpec, attend
from mask_rules import brute_force


CASES = [
    ("bidirectional", 7, 7, {}),
    ("causal", 9, 9, {}),
    ("causal", 3, 11, {"q_offset": 5}),
    ("block_causal", 12, 12, {"block": 4}),
    ("block_causal", 5, 13, {"block": 4, "q_offset": 6}),
    ("block_diffusion", 16, 16, {"block": 2}),
    ("block_diffusion", 24, 24, {"block": 4}),
    ("block_diffusion", 6, 20, {"block": 5, "q_offset": 10}),
    ("jacobi_forcing", 5 + 4 * 3, 5 + 4 * 3, {"block": 3, "prefix": 5}),
    ("jacobi_forcing", 23, 23, {"block": 4, "prefix": 7}),
]


@pytest.mark.parametrize("kind,q_len,kv_len,kw", CASES)
def test_dense_mask_matches_published_rules(kind, q_len, kv_len, kw):
    spec = MaskSpec(kind=kind, block_size=kw.get("block"), q_offset=kw.get("q_offset", 0),
                    prefix_len=kw.get("prefix", 0))
    expected = brute_force(kind, q_len, kv_len, q_offset=kw.get("q_offset", 0),
                           block=kw.get("block"), prefix=kw.get("prefix", 0))
    np.testing.assert_array_equal(np.asarray(spec.dense(q_len, kv_len))[0], expected)


def test_jacobi_forcing_per_row_prefix():
    spec = MaskSpec(kind="jacobi_forcing", block_size=3, prefix_len=jnp.array([2, 5]))
    dense = np.asarray(spec.dense(17, 17))
    for row, prefix in enumerate([2, 5]):
        np.testing.assert_array_equal(dense[row], brute_force("jacobi_forcing", 17, 17, block=3, prefix=prefix))


def test_segment_ids_restrict_visibility():
    seg = jnp.array([[0, 0, 1, 1, 1, 2, 2]])
    dense = np.asarray(MaskSpec(kind="causal", q_segment_ids=seg, kv_segment_ids=seg).dense(7, 7))[0]
    expected = brute_force("causal", 7, 7) & (np.asarray(seg)[0][:, None] == np.asarray(seg)[0][None])
    np.testing.assert_array_equal(dense, expected)


def test_mask_spec_validation():
    with pytest.raises(ValueError, match="needs a positive block_size"):
        MaskSpec(kind="block_causal")
    with pytest.raises(ValueError, match="mask kind must be one of"):
        MaskSpec(kind="sliding")
    with pytest.raises(ValueError, match="even"):
        MaskSpec(kind="block_diffusion", block_size=2).dense(5, 5)


def naive_attention(q, k, v, visible):
    """Per-(batch, head, query) numpy loop; rows with no visible key give zeros."""
    b, lq, h, d = q.shape
    group = h // k.shape[2]
    out = np.zeros_like(q, dtype=np.float64)
    for bi, hi, qi in itertools.product(range(b), range(h), range(lq)):
        keys = np.nonzero(visible[min(bi, visible.shape[0] - 1), qi])[0]
        if len(keys) == 0:
            continue
        s = k[bi, keys, hi // group] @ q[bi, qi, hi] / np.sqrt(d)
        p = np.exp(s - s.max())
        out[bi, qi, hi] = (p / p.sum()) @ v[bi, keys, hi // group]
    return out


@pytest.mark.parametrize("impl", ["reference", "xla"])
@pytest.mark.parametrize("kind,kw", [("causal", {}), ("block_diffusion", {"block_size": 3}),
                                     ("jacobi_forcing", {"block_size": 2, "prefix_len": 4}),
                                     ("block_causal", {"block_size": 4, "q_offset": 4})])
def test_attention_matches_naive_loop(impl, kind, kw):
    rng = np.random.RandomState(0)
    b, lq, h, hkv, d = 2, 12, 6, 2, 8
    lk = lq + kw.get("q_offset", 0)
    q = rng.randn(b, lq, h, d).astype(np.float32)
    k, v = (rng.randn(b, lk, hkv, d).astype(np.float32) for _ in range(2))
    seg_k = np.ones((b, lk), np.int32)
    seg_k[1, :3] = 0  # row 1: three padding keys
    seg_q = seg_k[:, lk - lq:]
    spec = MaskSpec(kind=kind, q_segment_ids=jnp.asarray(seg_q), kv_segment_ids=jnp.asarray(seg_k), **kw)
    got = np.asarray(attend(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), spec, impl=impl))
    visible = np.asarray(spec.dense(lq, lk))
    np.testing.assert_allclose(got, naive_attention(q, k, v, visible), atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_rows_without_visible_keys_are_zero_not_nan(impl):
    q = jnp.ones((1, 4, 2, 8))
    k = v = jnp.ones((1, 4, 2, 8))
    spec = MaskSpec(kind="causal", q_segment_ids=jnp.array([[1, 1, 2, 2]]),
                    kv_segment_ids=jnp.array([[1, 1, 3, 3]]))
    out = np.asarray(attend(q, k, v, spec, impl=impl))
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[0, 2:], 0.0)
    np.testing.assert_allclose(out[0, :2], 1.0, atol=1e-6)


def test_unknown_impl_is_refused():
    with pytest.raises(ValueError, match="attention impl must be one of"):
        attend(jnp.ones((1, 2, 2, 4)), jnp.ones((1, 2, 2, 4)), jnp.ones((1, 2, 2, 4)), MaskSpec(), impl="magic")
