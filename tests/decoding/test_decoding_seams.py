"""The decoding seams: a policy and a cache defined here, outside the package, plug into the
compiled loop without touching it; and `Sampler` holds the parameters once, swaps them safely,
and decodes a batch sharded over a mesh's data axes with the same tokens as one device."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxdllm
from jaxdllm import SamplerConfig
from jaxdllm.decoding import Cache, Commit, Policy, loop, register_cache, register_policy, sampler
from support.forward import forward
from support.sampler_fixtures import MASK_ID, prompts, shared_tiny_llada


@dataclasses.dataclass(frozen=True)
class LeftToRight(Policy):
    """Decide the leftmost undecided position of the block with its argmax: autoregressive order."""

    name = "test_left_to_right"

    def commit(self, logits, candidates, ctx):
        first = jnp.argmax(candidates, axis=-1)
        commit = candidates & (jnp.arange(candidates.shape[1])[None] == first[:, None])
        return Commit(commit, jnp.argmax(logits, -1).astype(jnp.int32), ctx.state)


@dataclasses.dataclass(frozen=True)
class CountingFullCache(Cache):
    """Runs the whole canvas with no logits slicing and cuts the block out itself; its state counts
    the after-commit calls, to show all three hooks run."""

    name = "test_counting"
    attentions = ("bidirectional",)

    def init(self, model, canvas, view, lay, config):
        return jnp.int32(0)

    def forward(self, model, state, view, lay, config, span):
        logits = model(state.canvas, view.positions, lay.mask(view.seg, view.seg)).logits
        start = lay.prompt_len + state.block * config.block_length
        return jax.lax.dynamic_slice_in_dim(logits, start, config.block_length, axis=1), state.cache, 1

    def after_commit(self, model, state, view, lay, config, block_full):
        return state.cache + 1


register_policy(LeftToRight)
register_cache(CountingFullCache)


@pytest.fixture(scope="module")
def model():
    return shared_tiny_llada()[0]


def left_to_right_reference(model, prompt, gen):
    """The same rule as a plain Python loop over the model: one argmax per forward, left to right."""
    canvas = np.concatenate([prompt, np.full(gen, MASK_ID)])[None].astype(np.int32)
    for i in range(len(prompt), len(prompt) + gen):
        logits = np.array(forward(model, jnp.asarray(canvas)).logits)[0, i]
        logits[MASK_ID] = -np.inf
        canvas[0, i] = int(np.argmax(logits))
    return canvas[0, len(prompt):]


@pytest.mark.parametrize("by", ["name", "object"])
def test_a_policy_and_a_cache_defined_outside_plug_into_the_loop(model, by):
    ids, mask, rows = prompts([4, 7], seed=21)
    policy, cache = ("test_left_to_right", "test_counting") if by == "name" else (LeftToRight(), CountingFullCache())
    config = SamplerConfig(gen_length=8, block_length=4, prompt_bucket=8, policy=policy, cache=cache)
    out = jaxdllm.generate(model, ids, config, attention_mask=mask)
    width = ids.shape[1]
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(out.tokens[i, width:], left_to_right_reference(model, row, 8))
    assert (out.nfe == 8).all()
    np.testing.assert_array_equal(out.commit_step[:, width:], np.tile(np.arange(1, 9), (2, 1)))
    # the same tokens with the built-in cache; the custom cache's own state saw every step
    builtin = jaxdllm.generate(model, ids, config.replace(cache="none"), attention_mask=mask)
    np.testing.assert_array_equal(builtin.tokens, out.tokens)
    prep = sampler.prepare(model.config, ids, mask, config)
    graphdef, params = nnx.split(model)
    state = loop.decode(graphdef, params, prep.ids, prep.seg, prep.valid, jax.random.PRNGKey(0),
                        canvas=config.canvas, lay=prep.lay, config=config)
    assert int(state.cache) == int(state.step) == 8


def test_sampler_params_setter_checks_the_tree_and_keeps_placement(model):
    s = jaxdllm.Sampler(model)
    ids, mask, _ = prompts([5, 3], seed=22)
    config = SamplerConfig(gen_length=8, block_length=8, steps=8, prompt_bucket=8)
    before = s(ids, config, attention_mask=mask)
    s.params = jax.tree.map(lambda x: -x, s.params)  # a different model: different tokens
    assert not np.array_equal(s(ids, config, attention_mask=mask).tokens, before.tokens)
    with pytest.raises(ValueError, match="same tree structure"):
        s.params = {"embed": s.params["embed"]}
    with pytest.raises(ValueError, match="shapes and dtypes"):
        s.params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), s.params)


def test_batch_sharded_over_the_mesh_data_axes_equals_one_device():
    from jaxdllm.sharding import make_mesh

    path = shared_tiny_llada()[3]
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded = jaxdllm.Sampler(jaxdllm.from_pretrained(path, mesh=mesh))
    single = jaxdllm.Sampler(jaxdllm.from_pretrained(path))
    assert sharded._row_multiple == 4  # batch over data x fsdp
    ids, mask, _ = prompts([3, 6, 5, 2, 7, 4], seed=23)  # 6 rows: padded to 8 with idle rows
    config = SamplerConfig(gen_length=8, block_length=4, policy="threshold", prompt_bucket=8)
    a, b = sharded(ids, config, attention_mask=mask), single(ids, config, attention_mask=mask)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.nfe, b.nfe)
    placed = sharded._place(np.zeros((8, 8), np.int32))
    assert placed.sharding.spec[0] == ("data", "fsdp") and len(placed.sharding.device_set) == 8
