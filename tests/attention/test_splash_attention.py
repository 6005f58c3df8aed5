"""The TPU backend (`splash`: JAX's splash attention kernel, run here in the Pallas TPU interpreter)
against the dense reference: every mask kind with padding segments, GQA and lengths that are not
tile multiples, forward and dq/dk/dv; traced query offsets and per-row prompt lengths; rows with no
visible key; bf16; the whole model; and the kernel sharded under `shard_map` on a (2, 2, 2) mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdllm import ModelConfig, Transformer, sharding
from jaxdllm.attention import MaskSpec, attend, reference_attention, resolve_impl, splash_attention
from jaxdllm.attention.tpu_splash import MIN_QUERY_BLOCK
from support.mask_rules import FOREST, MEDUSA

RNG = np.random.default_rng(0)


def _inputs(b, lq, lk, h, hkv, d=64, dtype=jnp.float32):
    return tuple(jnp.asarray(RNG.normal(size=shape), dtype)
                 for shape in ((b, lq, h, d), (b, lk, hkv, d), (b, lk, hkv, d), (b, lq, h, d)))


def _padding(b, length, pad):
    """Segment ids: row r's last `pad[r]` positions are padding (0)."""
    seg = np.ones((b, length), np.int32)
    for row, n in enumerate(pad):
        if n:
            seg[row, length - n:] = 0
    return seg


def _check(mask, q, k, v, ct, atol=1e-5):
    def loss(fn):
        return lambda q, k, v: (fn(q, k, v, mask) * ct).sum()

    out = jax.jit(lambda q, k, v: splash_attention(q, k, v, mask))(q, k, v)
    ref = jax.jit(lambda q, k, v: reference_attention(q, k, v, mask))(q, k, v)  # eager: a compile per op on CPU
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=atol, rtol=0)
    got = jax.jit(jax.grad(loss(splash_attention), argnums=(0, 1, 2)))(q, k, v)
    want = jax.jit(jax.grad(loss(reference_attention), argnums=(0, 1, 2)))(q, k, v)
    for name, a, b in zip("qkv", got, want):
        assert np.isfinite(np.asarray(a)).all(), name
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=0, err_msg=f"d{name}")


CASES = {  # kind, block size, length (not a multiple of 128)
    "bidirectional": (MaskSpec(kind="bidirectional"), 200),
    "causal": (MaskSpec(kind="causal"), 200),
    "block_causal": (MaskSpec(kind="block_causal", block_size=32), 170),
    "block_diffusion": (MaskSpec(kind="block_diffusion", block_size=16), 260),
    "jacobi_forcing": (MaskSpec(kind="jacobi_forcing", block_size=16, prefix_len=37), 165),
    "wedlm": (MaskSpec(kind="wedlm", block_size=32), 260),
    "lookahead": (MaskSpec(kind="lookahead", window_shape=(4, 15, 4), prefix_len=60), 60 + 1 + 4 * 15 + 15 * 4),
    "sliding_window": (MaskSpec(kind="causal", window=50), 200),
    "tree": (MaskSpec(kind="tree", tree=MEDUSA, block_size=8, prefix_len=50), 160),  # 14 tokens past the tree
}


# Two kinds in the default run, the rest in the slow run (the default run's 6-minute budget).
@pytest.mark.parametrize("kind", [k if k in ("bidirectional", "block_causal") else pytest.param(k, marks=pytest.mark.slow)
                                  for k in CASES])
def test_every_kind_with_padding_and_gqa_matches_reference(kind):
    base, length = CASES[kind]
    q, k, v, ct = _inputs(2, length, length, 4, 2)
    seg = _padding(2, length, [0, 23])
    _check(base.replace(q_segment_ids=seg, kv_segment_ids=seg), q, k, v, ct)


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_traced_query_offset_over_a_longer_cache_compiles_once():
    q, k, v, ct = _inputs(2, 130, 300, 4, 4)
    cache = _padding(2, 300, [60, 0])                               # unwritten slots of the first row
    fn = jax.jit(lambda q, k, v, off: splash_attention(q, k, v, MaskSpec(kind="block_causal", block_size=32,
                                                                         q_offset=off,
                                                                         q_segment_ids=np.ones((2, 130), np.int32),
                                                                         kv_segment_ids=cache)))
    for offset in (0, 96, 170):
        mask = MaskSpec(kind="block_causal", block_size=32, q_offset=offset, q_segment_ids=np.ones((2, 130), np.int32),
                        kv_segment_ids=cache)
        np.testing.assert_allclose(np.asarray(fn(q, k, v, offset)), np.asarray(reference_attention(q, k, v, mask)),
                                   atol=1e-5, rtol=0)
    assert fn._cache_size() == 1
    _check(MaskSpec(kind="causal", q_offset=jnp.asarray(120)), q, k, v, ct)   # traced under jit.grad too


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_per_row_prompt_lengths():
    q, k, v, ct = _inputs(3, 200, 200, 2, 1)
    _check(MaskSpec(kind="jacobi_forcing", block_size=16, prefix_len=jnp.asarray([40, 23, 57])), q, k, v, ct)


def test_static_tree_mask_lowers_for_tpu_under_jit():
    """A static tree's numpy mask is built while tracing (the rule's selects evaluated then, not
    staged), and the forward and backward lower to Mosaic."""
    from jaxdllm.attention.platform import exporter, lowering_for
    from jaxdllm.lowering import program_facts

    mask = MaskSpec(kind="tree", tree=MEDUSA, block_size=8, prefix_len=50)
    step = jax.jit(jax.value_and_grad(lambda q, k, v: splash_attention(q, k, v, mask).astype(jnp.float32).sum(),
                                      argnums=(0, 1, 2)))
    shape = jax.ShapeDtypeStruct((1, 160, 2, 64), jnp.bfloat16)
    with lowering_for("tpu"):
        facts = program_facts(exporter(step, "tpu")(shape, shape, shape))
    assert facts["mosaic_kernels"] == 3, facts  # forward, dq, dk/dv


@pytest.mark.slow  # about 6 s in the interpreter: the default run's 6-minute budget
def test_tree_static_without_prefix_and_per_row_prefix():
    """A static tree over no prefix (the queries past it see nothing: zero rows, zero gradients), then
    per-row prompt lengths (the dynamic mask)."""
    q, k, v, ct = _inputs(2, 130, 130, 2, 1, d=32)
    mask = MaskSpec(kind="tree", tree=FOREST, block_size=4)
    assert not np.asarray(splash_attention(q, k, v, mask)[:, 40:]).any()
    _check(mask, q, k, v, ct)
    _check(MaskSpec(kind="tree", tree=MEDUSA, block_size=3, prefix_len=jnp.asarray([70, 91])), q, k, v, ct)


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_rows_with_no_visible_key_are_zero_with_zero_gradients():
    q, k, v, ct = _inputs(2, 140, 140, 2, 2)
    q_seg = np.ones((2, 140), np.int32)
    q_seg[0, 130:] = 5                                              # a segment no key belongs to
    q_seg[1] = 9                                                    # a whole row of them
    kv_seg = np.ones((2, 140), np.int32)
    mask = MaskSpec(kind="causal", q_segment_ids=q_seg, kv_segment_ids=kv_seg)
    out = splash_attention(q, k, v, mask)
    assert not np.asarray(out[0, 130:]).any() and not np.asarray(out[1]).any()
    dq = jax.grad(lambda q: (splash_attention(q, k, v, mask) * ct).sum())(q)
    assert not np.asarray(dq[1]).any() and np.isfinite(np.asarray(dq)).all()
    _check(mask, q, k, v, ct)


def test_bf16_within_tolerance():
    q, k, v, ct = _inputs(2, 256, 256, 4, 2, dtype=jnp.bfloat16)
    mask = MaskSpec(kind="block_diffusion", block_size=32)
    out = splash_attention(q, k, v, mask)
    assert out.dtype == jnp.bfloat16
    ref = reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)), mask)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref), atol=2e-2, rtol=0)  # bf16 rounding


def test_short_query_blocks_take_the_xla_path():
    q, k, v, _ = _inputs(2, MIN_QUERY_BLOCK - 96, 200, 2, 2)        # a 32-token decoding block over a cache
    mask = MaskSpec(kind="bidirectional", q_offset=64)
    np.testing.assert_allclose(np.asarray(splash_attention(q, k, v, mask)),
                               np.asarray(reference_attention(q, k, v, mask)), atol=1e-5, rtol=0)


def test_auto_and_pallas_resolve_to_splash_on_tpu():
    assert resolve_impl("auto", "tpu") == "splash"
    assert resolve_impl("pallas", "tpu") == "splash"
    q, k, v, _ = _inputs(1, 130, 130, 2, 2)
    mask = MaskSpec(kind="causal")
    np.testing.assert_allclose(np.asarray(attend(q, k, v, mask, impl="splash")),
                               np.asarray(attend(q, k, v, mask, impl="reference")), atol=1e-5, rtol=0)


@pytest.mark.parametrize("preset", [pytest.param("tiny-llada", marks=pytest.mark.slow), "tiny-block-diffusion"])
def test_model_forward_and_loss_gradient_equal_reference(preset):
    model = Transformer(ModelConfig.preset(preset, max_position=256), rngs=nnx.Rngs(0))
    ids = jnp.asarray(RNG.integers(0, model.config.vocab_size, (2, 136)), jnp.int32)
    seg = jnp.asarray(_padding(2, 136, [0, 17]))
    mask = MaskSpec(kind=model.config.attention, block_size=model.config.block_size, q_segment_ids=seg,
                    kv_segment_ids=seg)

    def loss(m, impl):
        return m.with_options(attention_impl=impl)(ids, attention=mask).logits.astype(jnp.float32).std()

    graphdef, state = nnx.split(model)
    jaxpr = str(jax.make_jaxpr(lambda st: loss(nnx.merge(graphdef, st), "splash"))(state))
    assert "pallas_call" in jaxpr                                   # the model really runs the kernel
    # jitted: eager calls (the interpreted kernel's body above all) dispatch op by op, a compile each on CPU
    results = {impl: nnx.jit(nnx.value_and_grad(lambda m: loss(m, impl)))(model) for impl in ("reference", "splash")}
    (l_ref, g_ref), (l_spl, g_spl) = results["reference"], results["splash"]
    np.testing.assert_allclose(float(l_spl), float(l_ref), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_spl), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)


@pytest.mark.mesh
@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) for k in ("jax.make_mesh", "sharding.make_mesh")])
def test_sharded_kernel_equals_unsharded(kind):
    mesh = (jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor")) if kind == "jax.make_mesh"
            else sharding.make_mesh(data=2, fsdp=2, tensor=2))
    q, k, v, ct = _inputs(4, 150, 150, 4, 2)
    seg = _padding(4, 150, [0, 10, 0, 31])
    mask = MaskSpec(kind="jacobi_forcing", block_size=16, prefix_len=30, q_segment_ids=seg, kv_segment_ids=seg)

    def loss(q, k, v):
        return (splash_attention(q, k, v, mask) * ct).sum()

    want_out, want_grads = splash_attention(q, k, v, mask), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    with jax.set_mesh(sharding.auto_mesh(mesh)):                    # as the trainer runs its step
        step = jax.jit(lambda q, k, v: (splash_attention(q, k, v, mask), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)))
        assert "manual_computation" in step.lower(q, k, v).as_text()  # the kernel runs under shard_map
        out, grads = step(q, k, v)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), atol=1e-6, rtol=0)
    for a, b in zip(grads, want_grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=0)
