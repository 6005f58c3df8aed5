"""The K/V cache serves each published scheme: exact causal and block-causal caches equal the
no-cache forward; Fast-dLLM prefix/dual cache steps equal it when the cache is fresh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdllm import MaskSpec, ModelConfig, Transformer
from support.forward import forward

TOL = 1e-5


def _model(preset, **kw):
    return Transformer(ModelConfig.preset(preset, **kw), rngs=nnx.Rngs(0))


def _ids(b, l, seed=0):
    return jnp.asarray(np.random.RandomState(seed).randint(0, 250, (b, l)))


@pytest.fixture(scope="module")
def step():
    def run(m, ids, spec, cache):  # (logits, updated cache)
        out = forward(m, ids, attention=spec, cache=cache)
        return out.logits, out.cache
    return run


def test_exact_causal_cache_prefill_then_decode(step):
    model = _model("tiny-qwen2")
    ids = _ids(2, 12)
    full = np.asarray(forward(model, ids).logits)
    cache = model.init_cache(2, 16)
    logits, cache = step(model, ids[:, :5], MaskSpec(kind="causal"), cache)
    got = [np.asarray(logits)]
    for t in range(5, 12):  # one token at a time, offset traced: no recompile per position
        logits, cache = step(model, ids[:, t:t + 1], MaskSpec(kind="causal", q_offset=jnp.int32(t)), cache)
        got.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(got, 1), full, atol=TOL, rtol=0)


def test_exact_cache_with_left_padding_and_truncate(step):
    """Jacobi-style: write a speculative chunk, keep a prefix, drop the rest, go on."""
    model = _model("tiny-llama")
    ids = _ids(2, 10, seed=1)
    pad = jnp.array([0, 3])
    seg = (jnp.arange(10)[None] >= pad[:, None]).astype(jnp.int32)
    positions = jnp.clip(jnp.arange(10)[None] - pad[:, None], 0)
    full = np.asarray(forward(model, ids, positions,
                              MaskSpec(kind="causal", q_segment_ids=seg, kv_segment_ids=seg)).logits)
    cache = model.init_cache(2, 12)
    spec = MaskSpec(kind="causal", q_segment_ids=seg[:, :6])
    first = forward(model, ids[:, :6], positions[:, :6], spec, cache)
    wrong = jnp.full((2, 3), 7)  # speculative tokens, all rejected
    cache = forward(model, wrong, positions[:, 6:9], MaskSpec(kind="causal", q_offset=6), first.cache).cache
    cache = cache.truncate(6)
    rest = forward(model, ids[:, 6:], positions[:, 6:], MaskSpec(kind="causal", q_offset=6), cache)
    got = np.concatenate([np.asarray(first.logits), np.asarray(rest.logits)], 1)
    real = np.asarray(seg).astype(bool)
    np.testing.assert_allclose(got[real], full[real], atol=TOL, rtol=0)


def test_block_causal_cache_appends_finished_blocks(step):
    model = _model("tiny-block-diffusion")  # block size 8
    ids = _ids(2, 24, seed=2)
    full = np.asarray(forward(model, ids).logits)
    cache = model.init_cache(2, 24)
    got = []
    for start in range(0, 24, 8):
        spec = MaskSpec(kind="block_causal", block_size=8, q_offset=jnp.int32(start))
        logits, cache = step(model, ids[:, start:start + 8], spec, cache)
        got.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(got, 1), full, atol=TOL, rtol=0)


def test_fast_dllm_prefix_and_dual_cache_are_exact_when_fresh(step):
    model = _model("tiny-llada")
    ids = _ids(2, 20, seed=3)
    full = np.asarray(forward(model, ids).logits)
    cache = model.init_cache(2, 20)
    logits, cache = step(model, ids, MaskSpec(kind="bidirectional"), cache)  # block step 0 fills every slot
    np.testing.assert_allclose(np.asarray(logits), full, atol=TOL, rtol=0)
    start, end = 8, 12
    prefix_step, _ = step(model, ids[:, start:], MaskSpec(kind="bidirectional", q_offset=jnp.int32(start)), cache)
    np.testing.assert_allclose(np.asarray(prefix_step), full[:, start:], atol=TOL, rtol=0)
    dual_step, _ = step(model, ids[:, start:end], MaskSpec(kind="bidirectional", q_offset=jnp.int32(start)), cache)
    np.testing.assert_allclose(np.asarray(dual_step), full[:, start:end], atol=TOL, rtol=0)


def test_dual_cache_is_approximate_after_the_block_changes(step):
    """After a commit, the stale prefix/suffix K/V make a dual-cache step differ from a fresh
    forward; refreshing (a full forward) restores exactness. Documented as approximate."""
    model = _model("tiny-llada")
    ids = _ids(1, 16, seed=4)
    cache = model.init_cache(1, 16)
    _, cache = step(model, ids, MaskSpec(kind="bidirectional"), cache)
    new = ids.at[:, 8:12].set(5)
    spec = MaskSpec(kind="bidirectional", q_offset=jnp.int32(8))
    stale, _ = step(model, new[:, 8:12], spec, cache)
    fresh_full = np.asarray(forward(model, new).logits)
    assert np.abs(np.asarray(stale) - fresh_full[:, 8:12]).max() > 1e-4
    _, refreshed = step(model, new, MaskSpec(kind="bidirectional"), cache)
    again, _ = step(model, new[:, 8:12], spec, refreshed)
    np.testing.assert_allclose(np.asarray(again), fresh_full[:, 8:12], atol=TOL, rtol=0)


def test_cache_step_compiles_once_for_new_offsets(step):
    model = _model("tiny-qwen2")
    cache = model.init_cache(1, 8)
    compiled = jax.jit(lambda s, ids, off, c: nnx.merge(*s)(ids, attention=MaskSpec(kind="causal", q_offset=off),
                                                            cache=c)).lower(
        nnx.split(model), _ids(1, 1), jnp.int32(0), cache).compile()
    for off in range(3):
        cache = compiled(nnx.split(model), _ids(1, 1, seed=off), jnp.int32(off), cache).cache
    assert np.asarray(cache.segment_ids).tolist() == [[1, 1, 1, 0, 0, 0, 0, 0]]
