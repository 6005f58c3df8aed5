"""The tile-skipping Pallas kernel (Pallas interpreter on CPU) against the dense reference:
outputs and dq/dk/dv for every mask kind, ragged lengths, GQA, padding and cached prefixes,
then the whole model forward and a loss gradient with `attention_impl="pallas"`."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdllm.attention import BlockSizes, MaskSpec, attend, flash_attention, reference_attention, resolve_impl
from jaxdllm.attention import tiles
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.transformer import Transformer
from support.mask_rules import FOREST, MEDUSA

SMALL = BlockSizes(16, 16, 16, 16)  # several tiles even at test sizes
SEG = np.array([[0] * 7 + [1] * 30, [1] * 20 + [2] * 17])  # left padding; two packed segments
PAD = (SEG > 0).astype(np.int32)                            # left padding only

# (mask, q_len, kv_len, q heads, kv heads); lengths are not tile multiples.
CASES = {
    "bidirectional": (MaskSpec(), 37, 37, 4, 4),
    "causal_gqa": (MaskSpec(kind="causal"), 37, 37, 4, 2),
    "block_causal_cached_prefix": (MaskSpec(kind="block_causal", block_size=8, q_offset=21), 16, 45, 4, 1),
    "block_diffusion": (MaskSpec(kind="block_diffusion", block_size=4), 42, 42, 2, 2),
    "block_diffusion_offset": (MaskSpec(kind="block_diffusion", block_size=5, q_offset=20), 9, 40, 2, 1),
    "set_block_per_row_anchor": (MaskSpec(kind="set_block", block_size=3, prefix_len=jnp.array([5, 11])), 42, 42, 2, 1),
    "wedlm": (MaskSpec(kind="wedlm", block_size=5), 42, 42, 2, 1),
    "jacobi_forcing_per_row_prefix": (MaskSpec(kind="jacobi_forcing", block_size=4, prefix_len=jnp.array([5, 11])), 39, 39, 4, 2),
    "causal_segments": (MaskSpec(kind="causal", q_segment_ids=SEG, kv_segment_ids=SEG), 37, 37, 2, 2),
    "bidirectional_padding": (MaskSpec.from_padding(SEG > 0), 37, 37, 4, 2),
    "lookahead_over_a_cache": (MaskSpec(kind="lookahead", window_shape=(4, 5, 4), q_offset=9, prefix_len=9),
                               1 + 4 * 5 + 5 * 4, 9 + 1 + 4 * 5 + 5 * 4, 4, 2),
    # 2-token nodes after per-row prompts (row 1's first queries are prompt), padded rows, tokens past the tree
    "tree_per_row_prefix_over_a_cache": (MaskSpec(kind="tree", tree=MEDUSA, block_size=2, q_offset=9,
                                                  prefix_len=jnp.array([9, 13]), q_segment_ids=PAD[:, 9:],
                                                  kv_segment_ids=PAD), 28, 37, 2, 1),
    "tree_without_prefix": (MaskSpec(kind="tree", tree=FOREST), 21, 21, 1, 1),  # rows past the tree see nothing
    "sliding_window_causal": (MaskSpec(kind="causal", window=11), 37, 37, 4, 2),
    "sliding_window_canvas_over_a_cache": (MaskSpec(window=11, q_offset=29), 16, 45, 4, 1),
    "denoise_canvas_per_row_prompt": (MaskSpec(kind="denoise_canvas", block_size=8, prefix_len=jnp.array([5, 11]),
                                               window=13), 37, 74, 4, 2),
}


def _inputs(seed, q_len, kv_len, h, hkv, d=16, dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (2, q_len, h, d), dtype)
    k = jax.random.normal(ks[1], (2, kv_len, hkv, d), dtype)
    v = jax.random.normal(ks[2], (2, kv_len, hkv, d), dtype)
    do = jax.random.normal(ks[3], (2, q_len, h, d), dtype)
    return q, k, v, do


def _value_and_grads(fn, q, k, v, do):
    out, vjp = jax.vjp(fn, q, k, v)
    return (out, *vjp(do))


@pytest.mark.parametrize("name", list(CASES))
def test_outputs_and_gradients_match_dense_reference(name):
    mask, q_len, kv_len, h, hkv = CASES[name]
    q, k, v, do = _inputs(len(name), q_len, kv_len, h, hkv)
    ours = jax.jit(lambda *a: _value_and_grads(lambda q, k, v: flash_attention(q, k, v, mask, block_sizes=SMALL), *a))
    ref = jax.jit(lambda *a: _value_and_grads(lambda q, k, v: reference_attention(q, k, v, mask), *a))
    for got, want, what in zip(ours(q, k, v, do), ref(q, k, v, do), ("out", "dq", "dk", "dv")):
        assert got.shape == want.shape, what
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=2e-5, err_msg=what)


def test_rows_without_visible_keys_are_zero_with_zero_gradients():
    # Query segment 3 appears in no key: those rows see nothing.
    q_seg = jnp.array([[1] * 10 + [3] * 6])
    kv_seg = jnp.ones((1, 16), jnp.int32)
    mask = MaskSpec(kind="causal", q_segment_ids=q_seg, kv_segment_ids=kv_seg)
    q, k, v, do = (x[:1] for x in _inputs(3, 16, 16, 2, 2))
    ours = jax.jit(lambda *a: _value_and_grads(lambda q, k, v: flash_attention(q, k, v, mask, block_sizes=SMALL), *a))
    out, dq, dk, dv = ours(q, k, v, do)
    assert all(np.isfinite(np.asarray(x)).all() for x in (out, dq, dk, dv))
    np.testing.assert_array_equal(np.asarray(out[0, 10:]), 0.0)
    np.testing.assert_array_equal(np.asarray(dq[0, 10:]), 0.0)
    ref = reference_attention(q, k, v, mask)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-5)


def test_traced_query_offset_under_jit_reuses_one_compile():
    # A sampler step: the block's queries sit at a traced offset in a longer cache.
    q, k, v, _ = _inputs(5, 8, 40, 2, 2)
    calls = []

    @jax.jit
    def step(offset, q, k, v):
        calls.append(1)
        return flash_attention(q, k, v, MaskSpec(kind="block_causal", block_size=8, q_offset=offset), block_sizes=SMALL)

    for offset in (0, 8, 24, 32):
        want = reference_attention(q, k, v, MaskSpec(kind="block_causal", block_size=8, q_offset=offset))
        np.testing.assert_allclose(np.asarray(step(jnp.int32(offset), q, k, v)), np.asarray(want), atol=2e-5)
    assert len(calls) == 1


def test_bf16_inputs_accumulate_in_float32():
    mask = MaskSpec(kind="jacobi_forcing", block_size=8, prefix_len=9)
    q, k, v, _ = _inputs(7, 57, 57, 4, 2, d=32, dtype=jnp.bfloat16)
    got = jax.jit(lambda q, k, v: flash_attention(q, k, v, mask, block_sizes=SMALL))(q, k, v)
    assert got.dtype == jnp.bfloat16
    want = reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)), mask)
    rel = np.linalg.norm(np.asarray(got, np.float32) - np.asarray(want)) / np.linalg.norm(np.asarray(want))
    assert rel < 1e-2


def test_tile_map_skips_exactly_the_tiles_above_the_causal_diagonal():
    # 64 x 64 causal with 16-tiles: tile (i, j) is empty iff j > i, full iff j < i.
    classes = np.asarray(tiles.tile_classes(MaskSpec(kind="causal"), 64, 64, 16, 16))[0]
    i, j = np.indices(classes.shape)
    np.testing.assert_array_equal(classes == tiles.EMPTY, j > i)
    np.testing.assert_array_equal(classes == tiles.FULL, j < i)
    order, counts = (np.asarray(x)[0] for x in tiles.schedule(jnp.asarray(classes)[None]))
    for row in range(4):
        n_full, n_partial = counts[row]
        assert (n_full, n_partial) == (row, 1)
        assert sorted(order[row, :n_full]) == list(range(row)) and order[row, n_full] == row


def test_tile_map_of_a_lookahead_forward_skips_the_tiles_no_token_sees():
    """Lookahead decoding's layout (N 5, W 15, G 15) after a 64-token prefix, 16-tiles: a tile is
    empty exactly where the per-element rule shows nothing, and most of the window's tiles are."""
    from support.mask_rules import brute_force

    shape, prefix = (4, 15, 4), 64
    q_len = 1 + 4 * 15 + 15 * 4
    spec = MaskSpec(kind="lookahead", window_shape=shape, q_offset=prefix, prefix_len=prefix)
    classes = np.asarray(tiles.tile_classes(spec, q_len, prefix + q_len, 16, 16))[0]
    dense = brute_force("lookahead", q_len, prefix + q_len, q_offset=prefix, prefix=prefix, window_shape=shape)
    padded = np.zeros((classes.shape[0] * 16, classes.shape[1] * 16), bool)
    padded[:q_len, :prefix + q_len] = dense
    any_visible = padded.reshape(classes.shape[0], 16, classes.shape[1], 16).any(axis=(1, 3))
    np.testing.assert_array_equal(classes == tiles.EMPTY, ~any_visible)
    window_tiles = classes[:, prefix // 16:]
    assert (window_tiles == tiles.EMPTY).mean() > 0.5


def test_tree_rule_in_the_kernels_lowers_to_triton():
    """The tree rule is evaluated inside the forward, dq and dk/dv kernels: it must lower natively
    (no table captured by the kernel, no gather)."""
    from jaxdllm.attention.platform import exporter, lowering_for
    from jaxdllm.lowering import program_facts

    mask = MaskSpec(kind="tree", tree=MEDUSA, block_size=2, prefix_len=jnp.array([5, 9]))
    grads = jax.jit(jax.grad(lambda q, k, v: flash_attention(q, k, v, mask).astype(jnp.float32).sum(), argnums=(0, 1, 2)))
    shape = jax.ShapeDtypeStruct((2, 64, 2, 32), jnp.bfloat16)
    try:
        with lowering_for("cuda"):
            facts = program_facts(exporter(grads, "cuda")(shape, shape, shape))
    except RuntimeError as e:  # newer JAX lowers Pallas Triton only with a GPU device present
        if "No supported GPU devices found" not in str(e):
            raise
        pytest.skip(f"jax {jax.__version__} cannot lower the Triton kernel without a GPU")
    assert facts["triton_kernels"] == 3, facts  # forward, dq, dk/dv


def test_block_sizes_follow_coarse_mask_blocks_and_dtype():
    assert BlockSizes.for_mask(MaskSpec(kind="jacobi_forcing", block_size=64)).block_q == 64
    assert BlockSizes.for_mask(MaskSpec(kind="causal")).block_q == 128
    assert BlockSizes.for_mask(MaskSpec(kind="causal"), jnp.float32).block_k == 64
    with pytest.raises(ValueError, match="power of two"):
        BlockSizes(block_q=48)


def test_dispatcher_per_backend_and_bad_names():
    assert resolve_impl("auto", "cpu") == "reference"
    assert resolve_impl("auto", "gpu") == "pallas"   # no call to look at: the structured-mask kernel
    assert resolve_impl("auto", "tpu") == "splash"
    assert resolve_impl("pallas", "cpu") == "pallas"
    assert resolve_impl("pallas", "tpu") == "splash"  # the Triton kernel does not lower to Mosaic
    with pytest.raises(ValueError, match="attention impl must be one of"):
        resolve_impl("flash")
    q, k, v, _ = _inputs(9, 21, 21, 2, 2)
    mask = MaskSpec(kind="causal")
    pallas = jax.jit(lambda q, k, v: attend(q, k, v, mask, impl="pallas", block_sizes=SMALL))
    np.testing.assert_allclose(np.asarray(pallas(q, k, v)),
                               np.asarray(attend(q, k, v, mask, impl="reference")), atol=2e-5)


@pytest.mark.parametrize("preset", ["tiny-llada", "tiny-block-diffusion"])
def test_model_forward_and_loss_gradient_equal_reference(preset):
    config = dataclasses.replace(ModelConfig.preset(preset), num_layers=1)
    model = Transformer(config, rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(1), (2, 24), 0, config.vocab_size - 1)
    attention = dataclasses.replace(model.default_mask(), q_segment_ids=jnp.asarray(SEG[:, :24] > 0, jnp.int32),
                                    kv_segment_ids=jnp.asarray(SEG[:, :24] > 0, jnp.int32))

    @nnx.jit
    def loss_and_grads(model):
        def loss(model):  # a masked-diffusion style CE on every position
            logits = model(ids, attention=attention).logits
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), ids[..., None], -1))
        return nnx.value_and_grad(loss)(model)

    results = []
    for impl in ("reference", "pallas"):
        results.append(loss_and_grads(model.with_options(attention_impl=impl)))
    (loss_ref, grads_ref), (loss_ours, grads_ours) = results
    np.testing.assert_allclose(float(loss_ours), float(loss_ref), rtol=1e-6)
    flat_ref, flat_ours = jax.tree.leaves(grads_ref), jax.tree.leaves(grads_ours)
    assert len(flat_ref) == len(flat_ours) > 0
    for g_ref, g_ours in zip(flat_ref, flat_ours):
        np.testing.assert_allclose(np.asarray(g_ours), np.asarray(g_ref), atol=1e-5, rtol=1e-4)
