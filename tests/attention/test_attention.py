"""Structured masks against per-element rules written out from the published papers (BD3-LM, Jacobi Forcing), and the
reference attention against a naive numpy softmax loop."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdllm.attention import MaskSpec, attend
from support.forward import forward
from support.mask_rules import CHAIN, FOREST, MEDUSA, brute_force


CASES = [
    ("bidirectional", 7, 7, {}),
    ("causal", 9, 9, {}),
    ("causal", 3, 11, {"q_offset": 5}),
    ("block_causal", 12, 12, {"block": 4}),
    ("block_causal", 5, 13, {"block": 4, "q_offset": 6}),
    ("block_diffusion", 16, 16, {"block": 2}),
    ("block_diffusion", 24, 24, {"block": 4}),
    ("block_diffusion", 6, 20, {"block": 5, "q_offset": 10}),
    ("set_block", 24, 24, {"block": 3}),
    ("set_block", 8, 20, {"block": 4, "q_offset": 10}),
    ("set_block", 26, 26, {"block": 4, "prefix": 5}),
    ("wedlm", 24, 24, {"block": 4}),
    ("wedlm", 26, 26, {"block": 5}),                     # a shorter last block in each stream
    ("wedlm", 9, 22, {"block": 3, "q_offset": 13}),
    ("jacobi_forcing", 5 + 4 * 3, 5 + 4 * 3, {"block": 3, "prefix": 5}),
    ("jacobi_forcing", 23, 23, {"block": 4, "prefix": 7}),
    ("lookahead", 1 + 4 * 3 + 2 * 4, 6 + 1 + 4 * 3 + 2 * 4, {"prefix": 6, "q_offset": 6, "window_shape": (4, 3, 4)}),
    ("lookahead", 6 + 1 + 2 * 5 + 3 * 2, 6 + 1 + 2 * 5 + 3 * 2, {"prefix": 6, "window_shape": (2, 5, 2)}),
    ("lookahead", 1 + 3 * 4, 9 + 1 + 3 * 4, {"prefix": 9, "q_offset": 9, "window_shape": (0, 0, 4)}),
    ("causal", 13, 13, {"window": 4}),
    ("causal", 5, 17, {"q_offset": 12, "window": 6}),
    ("bidirectional", 6, 20, {"q_offset": 14, "window": 5}),
    ("denoise_canvas", 13, 26, {"block": 4, "prefix": 3}),
    ("denoise_canvas", 14, 28, {"block": 3, "prefix": 5, "window": 4}),
    ("tree", 5 + 5, 5 + 5, {"prefix": 5, "tree": CHAIN}),
    ("tree", 12 + 2, 4 + 12 + 2, {"prefix": 4, "q_offset": 4, "tree": MEDUSA}),  # two queries past the tree
    ("tree", 14, 14, {"tree": MEDUSA}),                                             # no prefix: those see nothing
    ("tree", 2 * 10, 6 + 2 * 10, {"block": 2, "prefix": 6, "q_offset": 6, "tree": FOREST}),
    ("tree", 3 + 3 * 5, 3 + 3 * 5, {"block": 3, "prefix": 3, "tree": CHAIN}),
]


@pytest.mark.parametrize("kind,q_len,kv_len,kw", CASES)
def test_dense_mask_matches_published_rules(kind, q_len, kv_len, kw):
    spec = MaskSpec(kind=kind, block_size=kw.get("block"), q_offset=kw.get("q_offset", 0),
                    prefix_len=kw.get("prefix", 0), window_shape=kw.get("window_shape"), window=kw.get("window"),
                    tree=kw.get("tree"))
    expected = brute_force(kind, q_len, kv_len, q_offset=kw.get("q_offset", 0), block=kw.get("block"),
                           prefix=kw.get("prefix", 0), window_shape=kw.get("window_shape"), window=kw.get("window"),
                           tree=kw.get("tree"))
    np.testing.assert_array_equal(np.asarray(spec.dense(q_len, kv_len))[0], expected)


def test_jacobi_forcing_per_row_prefix():
    spec = MaskSpec(kind="jacobi_forcing", block_size=3, prefix_len=jnp.array([2, 5]))
    dense = np.asarray(spec.dense(17, 17))
    for row, prefix in enumerate([2, 5]):
        np.testing.assert_array_equal(dense[row], brute_force("jacobi_forcing", 17, 17, block=3, prefix=prefix))


def test_tree_per_row_prefix_with_padding():
    """Trees of 2-token nodes after per-row prompts, queries over a cache, rows left-padded."""
    prefix, q_offset, kv_len = [3, 6], 2, 6 + 2 * len(MEDUSA) + 1
    seg = np.ones((2, kv_len), np.int32)
    seg[0, :2] = 0                                            # row 0: two padding slots before its prompt
    spec = MaskSpec(kind="tree", tree=MEDUSA, block_size=2, q_offset=q_offset, prefix_len=jnp.array(prefix),
                    q_segment_ids=jnp.asarray(seg[:, q_offset:]), kv_segment_ids=jnp.asarray(seg))
    dense = np.asarray(spec.dense(kv_len - q_offset, kv_len))
    assert dense.shape == (2, kv_len - q_offset, kv_len)
    for row, p in enumerate(prefix):
        rule = brute_force("tree", kv_len - q_offset, kv_len, q_offset=q_offset, block=2, prefix=p, tree=MEDUSA)
        np.testing.assert_array_equal(dense[row], rule & (seg[row, q_offset:, None] == seg[row, None, :]))


def test_tree_preorder_intervals_hold_exactly_the_ancestors():
    """The kernels' form of the tree rule (k's node is q's or an ancestor iff q's node lies in the
    preorder interval of k's subtree) against the ancestor table, for random parent tuples."""
    from jaxdllm.attention.mask import tree_ancestry, tree_preorder

    rng = np.random.default_rng(0)
    for n in list(range(1, 30)) + [80] * 5:
        tree = tuple(int(rng.integers(-1, i)) if i else -1 for i in range(n))
        start, end = map(np.asarray, tree_preorder(tree))
        assert sorted(start) == list(range(n))
        inside = (start[None, :] <= start[:, None]) & (start[:, None] < end[None, :])   # [a, b]: a in b's subtree
        np.testing.assert_array_equal(inside, tree_ancestry(tree), err_msg=str(tree))


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
    with pytest.raises(ValueError, match="window_shape"):
        MaskSpec(kind="lookahead", window_shape=(2, 0, 3))
    for tree in (None, (), (0,), (-1, 1), (-1, -2), [-1, 0]):
        with pytest.raises(ValueError, match="parent indices"):
            MaskSpec(kind="tree", tree=tree)
    with pytest.raises(ValueError, match="sliding window"):
        MaskSpec(kind="block_causal", block_size=4, window=8)
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
                                     ("block_causal", {"block_size": 4, "q_offset": 4}),
                                     ("tree", {"tree": FOREST, "block_size": 2, "prefix_len": 4, "q_offset": 4})])
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


def test_a_backend_registered_outside_the_package_serves_attend_and_the_model():
    """The registry seam: a backend defined here (a naive numpy-style loop over the dense mask) is
    selectable by name in `attend` and in `RunOptions.attention_impl`, and agrees with `reference`."""
    from flax import nnx

    import jaxdllm
    from jaxdllm.attention import implementations, register_backend

    calls = []

    def loop_backend(q, k, v, mask, *, scale=None, **_):
        calls.append(mask.kind)
        visible = mask.dense(q.shape[1], k.shape[1])
        group = q.shape[2] // k.shape[2]
        kk, vv = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, kk) * (scale or q.shape[-1] ** -0.5)
        s = jnp.where(visible[:, None], s, -jnp.inf)
        p = jnp.nan_to_num(jnp.exp(s - jnp.max(s, -1, keepdims=True)))
        p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-30)
        return jnp.einsum("bhqk,bkhd->bqhd", p, vv).astype(q.dtype)

    register_backend("test_loop", loop_backend)
    assert "test_loop" in implementations()
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((2, 6, 4, 8), (2, 6, 2, 8), (2, 6, 2, 8)))
    mask = MaskSpec(kind="causal")
    np.testing.assert_allclose(attend(q, k, v, mask, impl="test_loop"), attend(q, k, v, mask, impl="reference"),
                               atol=1e-5)
    config = jaxdllm.ModelConfig.preset("tiny-llama")
    ids = jnp.asarray(rng.integers(0, 200, (1, 7)), jnp.int32)
    ref = forward(jaxdllm.Transformer(config, jaxdllm.RunOptions(attention_impl="reference"), rngs=nnx.Rngs(0)), ids).logits
    ours = forward(jaxdllm.Transformer(config, jaxdllm.RunOptions(attention_impl="test_loop"), rngs=nnx.Rngs(0)), ids).logits
    np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), atol=1e-4)
    assert len(calls) > config.num_layers - 1
