"""Fast-dLLM's prefix cache feeds what the published cache feeds: in block b, the block and
everything after it (G - b * block_length tokens, + 1 on token-shifted models), with one static
shape per block index inside the one compiled loop. Its tokens equal those of the fixed-window
formulation it replaced (every step fed G tokens, the part past the canvas invisible)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdllm
from jaxdllm.decoding.caches import PrefixCache, block_start
from jaxdllm.decoding.layout import CanvasView, Layout
from jaxdllm.decoding.state import DecodeState
from jaxdllm.models.cache import KVCache
from support.sampler_fixtures import prompts, tiny_llada


@dataclasses.dataclass(frozen=True)
class FixedWindowPrefix(PrefixCache):
    """The former prefix cache: every cached step feeds a window of G (+ shift) tokens from the
    block's start; the part past the canvas holds invisible MASK tokens (segment 0)."""

    name = "prefix_fixed_window_test"

    def slots(self, lay, config):
        return lay.total + config.gen_length

    def cached(self, model, state, view, lay, config, cache):
        G, b = config.gen_length, state.canvas.shape[0]
        start = block_start(state, lay, config) - lay.shift
        past_end = jnp.full((b, G), lay.mask_id, state.canvas.dtype)
        extended = CanvasView(jnp.concatenate([view.seg, jnp.zeros_like(past_end)], 1),
                              jnp.concatenate([view.positions, view.positions[:, -1:] + 1 + jnp.arange(G)], 1))
        ids, pos, q_seg = extended.window(jnp.concatenate([state.canvas, past_end], 1), start, G + lay.shift)
        return model(ids, pos, lay.mask(q_seg, q_offset=start, kind="bidirectional"), cache,
                     logits_slice=(0, config.block_length))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("llada")
    tiny_llada(path)
    return path


@pytest.mark.parametrize("shift", [False, pytest.param(True, marks=pytest.mark.slow)],  # slow: 6-minute budget
                         ids=["llada", "token-shifted"])
@pytest.mark.parametrize("policy,gen,block,steps", [("threshold", 32, 8, 32),
                                                    pytest.param("llada", 24, 8, 12, marks=pytest.mark.slow),
                                                    pytest.param("entropy", 32, 16, 32, marks=pytest.mark.slow)])
def test_tokens_equal_the_fixed_window_prefix_cache(checkpoint, shift, policy, gen, block, steps):
    model = jaxdllm.from_pretrained(checkpoint, shift_logits=shift)
    ids, mask, _ = prompts([3, 7, 5], seed=21)
    config = jaxdllm.SamplerConfig(gen_length=gen, block_length=block, steps=steps, policy=policy,
                                   prompt_bucket=8, cache="prefix")
    ours = jaxdllm.generate(model, ids, config, attention_mask=mask)
    former = jaxdllm.generate(model, ids, config.replace(cache=FixedWindowPrefix()), attention_mask=mask)
    np.testing.assert_array_equal(np.asarray(ours.tokens), np.asarray(former.tokens))
    np.testing.assert_array_equal(np.asarray(ours.nfe), np.asarray(former.nfe))
    np.testing.assert_array_equal(np.asarray(ours.commit_step), np.asarray(former.commit_step))


@pytest.mark.parametrize("shift", [0, 1])
def test_each_block_index_feeds_the_published_window(shift):
    """Tracing the cached step visits one branch per block index; block b's branch feeds the canvas
    from its block's start (minus the shift) to the end."""
    G, bl, Lp, B = 32, 8, 8, 2
    config = jaxdllm.SamplerConfig(gen_length=G, block_length=bl, steps=G, policy="threshold", cache="prefix")
    lay = Layout(prompt_len=Lp, total=Lp + G, mask_id=5, shift=shift, eos_eot=(), eos_id=None)
    view = CanvasView.of(jnp.ones((B, Lp), jnp.int32), G)
    fed = []

    def model(ids, positions, mask, cache, logits_slice):  # records what each branch feeds
        fed.append((ids.shape[1], int(mask.q_offset)))
        return jnp.zeros((B, logits_slice[1], 7)), cache

    state = DecodeState.start(jnp.zeros((B, Lp + G), jnp.int32), jnp.zeros((B, Lp + G), bool),
                              done=jnp.zeros((B,), bool), key=jax.random.PRNGKey(0), cache=None, policy_state=None,
                              max_trajectory=0)
    slots = jnp.zeros((B, Lp + G, 1, 2))
    cache = KVCache(k=(slots,), v=(slots,), segment_ids=jnp.zeros((B, Lp + G), jnp.int32))
    jax.make_jaxpr(lambda s, c: PrefixCache().cached(model, s, view, lay, config, c))(state, cache)
    assert fed == [(G - b * bl + shift, Lp + b * bl - shift) for b in range(G // bl)]
    # FLOPs of the cached steps: on average (G + block) / 2 tokens fed instead of G
    assert sum(w - shift for w, _ in fed) / len(fed) == (G + bl) / 2


def test_prefix_cache_compiles_once_per_prompt_bucket(checkpoint, compiles):
    model = jaxdllm.from_pretrained(checkpoint)
    config = jaxdllm.SamplerConfig(gen_length=32, block_length=8, steps=32, policy="threshold", prompt_bucket=8,
                                   cache="prefix")
    ids_a, mask_a, _ = prompts([5, 7], seed=4)
    ids_b, mask_b, _ = prompts([2, 8], seed=5)
    jaxdllm.generate(model, ids_a, config, attention_mask=mask_a)
    compiles.clear()
    jaxdllm.generate(model, ids_b, config, attention_mask=mask_b)
    assert not compiles, compiles
