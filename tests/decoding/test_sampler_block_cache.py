"""Block-causal (block diffusion) decoding: the exact KV cache of finished blocks (`cache="block"`)
equals the full-canvas block-causal forward (`cache="none"`) token for token, its cached K/V equal
the model's own forward over the final canvas, and bad combinations fail before compiling.

NFE relation: `nfe` counts decoding forwards only, so it is equal for both caches; `cache="block"`
additionally runs one prompt prefill and one window-sized write per finished window but the last."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxdllm
from jaxdllm import ConfigError, MaskSpec, ModelConfig, SamplerConfig
from jaxdllm.decoding import loop, sampler
from support.forward import forward
from support.models import tiny_model
from support.sampler_fixtures import prompts

HEAD_SCALE = 60.0  # random weights give flat logits; scaled, the threshold policy commits several per step
LENGTHS = [3, 11, 6]  # left-padded to 16: the 11-token prompt spans two model blocks, the others one


@pytest.fixture(scope="module")
def model():
    return tiny_model("tiny-block-diffusion", head_scale=HEAD_SCALE, shared=True)  # block_size 8


cfg = functools.partial(SamplerConfig, gen_length=32, block_length=8, steps=16, policy="threshold",
                        prompt_bucket=8)  # any may be overridden


def assert_same(a, b):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.nfe, b.nfe)
    np.testing.assert_array_equal(a.commit_step, b.commit_step)


@pytest.mark.parametrize("policy,block_length", [
    ("llada", 8),  # block_length == the model's block_size (threshold: also in test_published_block_layout.py)
    pytest.param("threshold", 8, marks=pytest.mark.slow),  # the default run's 6-minute budget
    ("threshold", 4),                # Fast-dLLM v2 sub-blocks: each step feeds the whole model block
    ("llada", 16),                   # a decoding block of two model blocks
    ("entropy_bound", 8),            # the EB-sampler's bound (0.1) commits several per step here too
])
def test_block_cache_equals_full_block_causal_forward(model, policy, block_length):
    ids, mask, _ = prompts(LENGTHS, seed=1)
    config = cfg(policy=policy, block_length=block_length)
    full = jaxdllm.generate(model, ids, config, attention_mask=mask)
    cached = jaxdllm.generate(model, ids, config.replace(cache="block"), attention_mask=mask)
    assert_same(cached, full)
    assert not (full.tokens == model.config.mask_token_id).any()
    if policy in ("threshold", "entropy_bound"):  # parallel commits happen: the comparison covers them
        unit = max(block_length, model.config.block_size)
        decoded = [32 + (-n % unit) for n in LENGTHS]  # to the end of the block holding the 32nd answer token
        assert (full.nfe < np.array(decoded)).any()


def test_cached_kv_of_finished_blocks_equal_the_models_forward(model):
    """Independent of the sampler: K/V of the prompt and every finished window, as the loop left
    them in the cache, equal a block-causal forward of the model over the final canvas."""
    ids, mask, _ = prompts(LENGTHS, seed=2)
    config = cfg(cache="block")
    prep = sampler.prepare(model.config, ids, mask, config)
    ids, seg_prompt, lay = prep.ids, prep.seg, prep.lay
    graphdef, params = nnx.split(model)
    state = loop.decode(graphdef, params, ids, seg_prompt, prep.valid, jax.random.PRNGKey(0),
                        canvas=config.canvas, lay=lay, config=config)
    Lp, T, G = lay.prompt_len, lay.total, config.gen_length
    seg = np.concatenate([seg_prompt, np.ones((len(ids), G), np.int32)], 1)  # every row has a prompt tail here
    assert lay.lead and (prep.answer_start > lay.decode_start).all()
    positions = np.maximum(np.cumsum(seg, 1) - 1, 0)
    spec = MaskSpec(kind="block_causal", block_size=model.config.block_size, q_segment_ids=seg)
    ref = forward(model, state.canvas, jnp.asarray(positions), spec, model.init_cache(len(ids), T)).cache
    window = max(config.block_length, model.config.block_size)
    written = T - window  # the last window is never written back: nothing reads it
    assert written > Lp
    np.testing.assert_array_equal(np.asarray(state.cache.segment_ids[:, :written]), seg[:, :written])
    for layer in range(model.config.num_layers):
        for got, want in ((state.cache.k[layer], ref.k[layer]), (state.cache.v[layer], ref.v[layer])):
            np.testing.assert_allclose(np.asarray(got[:, :written]), np.asarray(want[:, :written]),
                                       rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # the default run's 6-minute budget; LLaDA2's rows alone: test_published_block_layout.py
def test_block_cache_rows_decode_as_alone(model):
    """Padding invariance; bucket 4 is rounded up to the model's block_size 8 (else the rows'
    generations would start at different offsets inside a model block)."""
    ids, mask, rows = prompts(LENGTHS, seed=1)
    config = cfg(cache="block", prompt_bucket=4)
    batch = jaxdllm.generate(model, ids, config, attention_mask=mask)
    width = ids.shape[1]
    for i, row in enumerate(rows):
        alone = jaxdllm.generate(model, row[None], config)
        np.testing.assert_array_equal(batch.tokens[i, width:], alone.tokens[0, len(row):])
        np.testing.assert_array_equal(batch.commit_step[i, width:], alone.commit_step[0, len(row):])
        assert int(batch.nfe[i]) == int(alone.nfe[0])


def test_no_cache_earlier_blocks_never_see_later_ones(model):
    """Block causality of the full-canvas path: a longer generation starts with the shorter one."""
    ids, mask, _ = prompts(LENGTHS, seed=1)
    short = jaxdllm.generate(model, ids, cfg(gen_length=16), attention_mask=mask)
    long = jaxdllm.generate(model, ids, cfg(gen_length=32), attention_mask=mask)
    end = ids.shape[1] + 16
    np.testing.assert_array_equal(long.tokens[:, :end], short.tokens)
    np.testing.assert_array_equal(long.commit_step[:, :end], short.commit_step)


@pytest.mark.parametrize("block_length", [4, 8])
def test_any_gen_length_decodes_to_the_end_of_its_block(model, block_length):
    """Block diffusion (Fast-dLLM v2's shifted logits; decoding blocks of 4 in model blocks of 8, and
    of 8) with a gen_length that is not whole blocks: a row decodes to the end of the model block
    that holds its last answer position, so its 20 tokens are the first 20 of a 24-token run (earlier
    blocks never see later ones) with at most as many forwards, fewer where 24 tokens reach one
    block further; the block cache decodes the same."""
    ids, mask, _ = prompts(LENGTHS, seed=1)
    short = jaxdllm.generate(model, ids, cfg(gen_length=20, block_length=block_length), attention_mask=mask)
    long = jaxdllm.generate(model, ids, cfg(gen_length=24, block_length=block_length), attention_mask=mask)
    end = ids.shape[1] + 20
    assert short.tokens.shape == (len(LENGTHS), end)
    np.testing.assert_array_equal(long.tokens[:, :end], short.tokens)
    np.testing.assert_array_equal(long.commit_step[:, :end], short.commit_step)
    tails = [n % 8 for n in LENGTHS]  # each prompt's tokens in its first decoded block (model blocks of 8)
    further = np.array([-(-(t + 24) // 8) > -(-(t + 20) // 8) for t in tails])
    assert further.any() and not further.all()
    assert (short.nfe <= long.nfe).all() and (short.nfe[further] < long.nfe[further]).all()
    assert_same(jaxdllm.generate(model, ids, cfg(gen_length=20, block_length=block_length, cache="block"),
                                 attention_mask=mask), short)


def test_block_cache_stepwise_equals_compiled_loop(model):
    ids, mask, _ = prompts(LENGTHS[:2], seed=3)
    config = cfg(cache="block", block_length=4, gen_length=16)
    assert_same(jaxdllm.generate_stepwise(model, ids, config, attention_mask=mask),
                jaxdllm.generate(model, ids, config, attention_mask=mask))


@pytest.mark.parametrize("preset,kwargs,message", [
    ("tiny-block-diffusion", dict(gen_length=24, block_length=6, cache="block"),
     r"block_length \(6\) to be a multiple or a divisor of the model's block_size \(8\)"),
    ("tiny-block-diffusion", dict(cache="dual"), "approximate cache for bidirectional models"),
    ("tiny-llada", dict(cache="block"), "this model is bidirectional"),
    ("tiny-qwen2", dict(), "the model's attention is 'causal'"),
])
def test_bad_combinations_fail_before_compiling(monkeypatch, preset, kwargs, message):
    def must_not_compile(*args, **kw):
        raise AssertionError("validation must happen before compiling")

    monkeypatch.setattr(sampler, "decode", must_not_compile)
    bad = jaxdllm.Transformer(ModelConfig.preset(preset, mask_token_id=255), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match=message):
        jaxdllm.generate(bad, np.zeros((1, 4), np.int32), cfg(**kwargs))
