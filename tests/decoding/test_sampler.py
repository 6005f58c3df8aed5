"""Properties of the compiled sampler that need no external reference: padding invariance,
every registered policy fills the canvas, one compiled loop, stepwise equality, EOS stop,
trajectories, errors. (Each cache's exactness: tests/test_contracts.py.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxdllm
from jaxdllm import ConfigError, SamplerConfig
from jaxdllm.decoding.canvases import canvas_class
from jaxdllm.decoding.policies import policy_class
from support import registries
from support.forward import forward
from support.models import tiny_model, two_layer_diffusiongemma
from support.sampler_fixtures import MASK_ID, prompts, shared_tiny_llada


@pytest.fixture(scope="module")
def model():
    return shared_tiny_llada()[0]


SMALL_TREE = ((0,), (1,), (0, 0), (1, 0), (0, 0, 0))  # a draft tree of rank paths (Medusa, Token Recycling)
cfg = functools.partial(SamplerConfig, gen_length=16, block_length=8, steps=8, prompt_bucket=8)  # any may be overridden


@pytest.mark.parametrize("policy", ["llada", "threshold", "entropy", "credit"])
def test_batch_of_different_prompt_lengths_equals_each_row_alone(model, policy):
    ids, mask, rows = prompts([3, 7, 5], seed=1)
    config = cfg(policy=policy)
    batch = jaxdllm.generate(model, ids, config, attention_mask=mask)
    width = ids.shape[1]
    for i, row in enumerate(rows):
        alone = jaxdllm.generate(model, row[None], config)
        np.testing.assert_array_equal(np.asarray(batch.tokens[i, width:]), np.asarray(alone.tokens[0, len(row):]))
        assert int(batch.nfe[i]) == int(alone.nfe[0])
        np.testing.assert_array_equal(np.asarray(batch.commit_step[i, width:]),
                                      np.asarray(alone.commit_step[0, len(row):]))


# What each registered policy needs beyond the shared LLaDA model and `cfg(gen_length=32, steps=16)`:
# "config": more SamplerConfig settings; "model": "causal" for the draft-and-verify policies (a
# causal model, no MASK token); "params": a builder of its `policy_params`; "idle_forwards": a forward
# may commit nothing (so `nfe` may exceed the last commit step). A newly registered policy fails the
# test below until it has an entry here ({} when nothing extra is needed).
POLICY_SETUP = {
    "llada": {}, "threshold": {}, "factor": {}, "entropy": {}, "entropy_bound": {}, "local_leap": {}, "credit": {},
    "prophet": {},
    "token_editing": {"idle_forwards": True},  # its post-steps re-read a full block and may edit nothing
    "dream": {"config": {"block_length": 32}},  # Dream decodes the whole canvas as one block
    "learn2pd": {"params": lambda: jaxdllm.decoding.Learn2PDFilter(8, 8, rngs=nnx.Rngs(0))},
    "jacobi": {"model": "causal"},
    "lookahead": {"model": "causal"},
    # small trees: the published ones decode the shipped model in tests/decoding/test_tree_drafts.py
    "medusa": {"model": "causal", "params": lambda: random_heads(3, 64), "config": {"choices": SMALL_TREE}},
    "bpd": {"model": "causal", "params": lambda: random_heads(2, 64), "config": {"choices": ((0,), (0, 0))}},
    "token_recycling": {"model": "causal", "config": {"choices": SMALL_TREE}},
    # uniform-noise canvases of the model's 8 tokens, at most 3 denoising steps each
    "diffusiongemma": {"model": "diffusiongemma", "config": {"block_length": 8, "max_denoising_steps": 3}},
    "freedave": {},  # llada's output in fewer forwards (tests/decoding/test_freedave.py)
    # second models in the loop (tests/decoding/test_second_model.py): a masked-diffusion drafter of the
    # causal model's vocabulary; a small causal verifier of the LLaDA model's
    "spec_diffusion": {"model": "causal", "params": lambda: tiny_model("tiny-llada", seed=1, shared=True),
                       "config": {"gamma": 3, "tokens_per_step": 2}},
    "apd": {"params": lambda: tiny_model("tiny-qwen2", vocab_size=130, eos_token_id=127, pad_token_id=127,
                                         bos_token_id=127, shared=True),
            "config": {"draft_window": 4, "kv_window": 2}},
    # a causal model whose masks read their own logits (tests/decoding/test_wedlm_generate.py: the published procedure)
    "wedlm": {"model": "wedlm", "config": {"window": 8}},
    # an any-order model (XLNet's two streams), its MASK id outside the prompts' ids (tests/decoding/test_assd.py)
    "assd": {"model": "xlnet", "config": {"drafts": 3}},
    # rows that read each other's text over shared K/V pages; a random model writes no tags (it decodes on, one
    # row per request) and ends no step: the fork/merge and step-end mechanics are in
    # tests/decoding/test_multiverse_fork_merge.py and test_hogwild_generate.py
    "multiverse": {"model": "causal", "config": {"tag_base": 40, "digit_ids": tuple(range(20, 30)), "colon_id": 30,
                                                 "newline_id": 31, "page_size": 4}},
    "hogwild": {"model": "causal", "config": {
        "first_steps": ((10, 11), (12, 13)), "header_prefixes": ((14,), (15,)), "header_suffix": (16,),
        "digit_ids": tuple(range(20, 30)), "others_header": (17,), "own_header": (18,), "check_ids": (19,),
        "finisher_ids": (30, 31), "finisher_tokens": 2, "newline_start_ids": (5,), "newline_end_ids": (5,),
        "page_size": 4}},
    # GenMol's sampler with context guidance (two forwards a step); its given canvases, the published loop and
    # the presets: tests/decoding/test_genmol_sampler.py
    "genmol": {"config": {"temperature": 1.2, "randomness": 2.0, "guidance_gamma": 0.3}},
}


def random_heads(num_heads, width, seed=0):
    """Medusa heads with random weights (trained heads start at zero: every head the model's own)."""
    from jaxdllm.models.medusa import MedusaHeads

    heads = MedusaHeads(num_heads, width)
    keys = jax.random.split(jax.random.PRNGKey(seed), 2)
    heads.kernel.set_value(0.3 * jax.random.normal(keys[0], heads.kernel.get_value().shape))
    heads.bias.set_value(0.3 * jax.random.normal(keys[1], heads.bias.get_value().shape))
    return heads


@pytest.fixture(scope="module")
def causal_model():
    return tiny_model("tiny-qwen2", shared=True)


@pytest.mark.parametrize("policy", registries.policies())
def test_every_policy_fills_the_canvas_and_counts(model, causal_model, policy):
    if policy not in POLICY_SETUP:
        pytest.fail(f"policy {policy!r} is registered but has no entry in POLICY_SETUP (tests/decoding/test_sampler.py): "
                    "add one ({} if the shared LLaDA model and config suffice)")
    setup = POLICY_SETUP[policy]
    net = {"causal": lambda: causal_model, "diffusiongemma": two_layer_diffusiongemma,
           "wedlm": lambda: tiny_model("tiny-wedlm", shared=True),
           "xlnet": lambda: tiny_model("tiny-xlnet", mask_token_id=250, shared=True),
           }.get(setup.get("model"), lambda: model)()
    params = setup["params"]() if "params" in setup else None
    ids, mask, _ = prompts([5, 5], seed=3)
    # a canvas without diffusion blocks takes no block_length (cfg's 8): the loop's default stands
    blocks = {} if canvas_class(policy_class(policy).canvas).diffusion_blocks else {
        "block_length": SamplerConfig().block_length}
    config = cfg(gen_length=32, steps=16, policy=policy, **{**blocks, **setup.get("config", {})})
    r = jaxdllm.generate(net, ids, config, attention_mask=mask, policy_params=params)
    tokens, steps, nfe = np.asarray(r.tokens), np.asarray(r.commit_step), np.asarray(r.nfe)
    if net.config.mask_token_id is not None:
        assert not (tokens == net.config.mask_token_id).any(), policy
    assert (steps[:, :5] == 0).all() and (steps[:, 5:] >= 1).all(), policy
    if setup.get("idle_forwards"):
        assert (steps.max(1) <= nfe).all(), policy
    else:
        assert (steps.max(1) == nfe).all(), policy
    if policy == "llada":
        assert (nfe == 16).all()
        per_step = [np.bincount(s[5:], minlength=17)[1:] for s in steps]
        assert all((c == 2).all() for c in per_step)  # 8-token blocks, 4 steps each: 2 per step
    if policy == "prophet":
        assert (nfe <= 16).all()


def test_one_compiled_loop_and_no_recompile_in_the_same_bucket(model, compiles):
    config = cfg(policy="threshold")
    ids_a, mask_a, _ = prompts([5, 7], seed=4)
    ids_b, mask_b, _ = prompts([2, 8], seed=5)  # different lengths, same 8-token bucket
    graphdef, params = nnx.split(model)
    jaxdllm.generate(model, ids_a, config, attention_mask=mask_a)
    compiles.clear()
    jaxdllm.generate(model, ids_b, config, attention_mask=mask_b)
    assert not compiles, compiles
    # the whole generation is one jitted computation holding a single while loop, no host callbacks
    from jaxdllm.decoding import loop, sampler
    prep = sampler.prepare(model.config, ids_b, mask_b, config)
    jaxpr = jax.make_jaxpr(lambda p, i, m, v: loop.decode(
        graphdef, p, i, m, v, jax.random.PRNGKey(0), canvas=config.canvas, lay=prep.lay, config=config))(
        params, prep.ids, prep.seg, prep.valid)
    prims = [str(e.primitive) for e in jaxpr.jaxpr.eqns]
    inner = [p for p in prims if p == "pjit" or p == "jit"]
    assert len(inner) == 1
    text = str(jaxpr)
    assert text.count("while[") == 1 and "callback" not in text


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_stepwise_python_loop_equals_compiled_loop(model):
    ids, mask, _ = prompts([3, 6], seed=6)
    for config in (cfg(policy="threshold", cache="dual"), cfg(policy="llada")):
        a = jaxdllm.generate(model, ids, config, attention_mask=mask)
        b = jaxdllm.generate_stepwise(model, ids, config, attention_mask=mask)
        np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
        np.testing.assert_array_equal(np.asarray(a.nfe), np.asarray(b.nfe))


def test_stop_at_eos():
    """Declare the token the model emits most as EOS: rows stop at its first commit with
    nothing undecided before it, and the rest of the row is EOS."""
    model, _, _, path = shared_tiny_llada()
    ids, mask, _ = prompts([4, 6], seed=7)
    width = ids.shape[1]
    plain = jaxdllm.generate(model, ids, cfg(gen_length=32, steps=32), attention_mask=mask)
    assert (plain.nfe == 32).all()
    eos = int(np.bincount(plain.tokens[:, width:].ravel()).argmax())
    model = jaxdllm.from_pretrained(path, eos_token_id=eos)
    stopped = jaxdllm.generate(model, ids, cfg(gen_length=32, steps=32, stop_at_eos=True), attention_mask=mask)
    assert (stopped.nfe < 32).all()
    for row in range(2):
        gen, steps = stopped.tokens[row, width:], stopped.commit_step[row, width:]
        ref = plain.tokens[row, width:]
        stop = int(stopped.nfe[row])
        assert not (gen == MASK_ID).any() and steps.max() == stop
        # identical to the full run before the stop; at the stop, undecided positions became EOS
        np.testing.assert_array_equal(gen[steps < stop], ref[steps < stop])
        at_stop = steps == stop
        assert ((gen[at_stop] == ref[at_stop]) | (gen[at_stop] == eos)).all()
        first = int(np.argmax(gen == eos))
        assert (gen == eos).any() and (steps[:first] <= stop).all()


def test_trajectory_records_each_step(model):
    ids, mask, _ = prompts([5], seed=8)
    r = jaxdllm.generate(model, ids, cfg(policy="llada", max_trajectory=8))
    traj = np.asarray(r.trajectory)
    assert traj.shape == (1, 8, ids.shape[1] + 16)
    masks = (traj == MASK_ID).sum(-1)[0]
    np.testing.assert_array_equal(masks, 16 - 2 * np.arange(1, 9))
    np.testing.assert_array_equal(traj[0, -1], np.asarray(r.tokens[0]))
    short = jaxdllm.generate(model, ids, cfg(policy="llada", max_trajectory=3))
    np.testing.assert_array_equal(np.asarray(short.trajectory[0]), traj[0, :3])


def test_temperature_samples_follow_the_softmax(model):
    """One masked token, T = 1: Gumbel-max sampling frequencies match softmax(logits)."""
    prompt = np.asarray(prompts([6], seed=9)[0])
    n = 4000
    config = cfg(gen_length=1, block_length=1, steps=1, temperature=1.0)
    r = jaxdllm.generate(model, np.repeat(prompt, n, 0), config, key=jax.random.PRNGKey(3))
    canvas = np.concatenate([prompt, [[MASK_ID]]], 1)
    probs = np.asarray(jax.nn.softmax(forward(model, jnp.asarray(canvas)).logits[0, -1]))
    counts = np.bincount(np.asarray(r.tokens[:, -1]), minlength=probs.size) / n
    assert np.abs(counts - probs).max() < 4 * np.sqrt(probs.max() * (1 - probs.max()) / n) + 1e-3
    greedy = jaxdllm.generate(model, prompt, config.replace(temperature=0.0))
    assert int(greedy.tokens[0, -1]) == int(probs.argmax())


def test_random_remasking_keeps_the_schedule(model):
    ids, _, _ = prompts([5], seed=10)
    a = jaxdllm.generate(model, ids, cfg(remasking="random"), key=jax.random.PRNGKey(0))
    b = jaxdllm.generate(model, ids, cfg(remasking="random"), key=jax.random.PRNGKey(1))
    for r in (a, b):
        assert (np.bincount(np.asarray(r.commit_step[0, 5:]))[1:] == 2).all()
    assert not np.array_equal(np.asarray(a.commit_step), np.asarray(b.commit_step))


@pytest.mark.parametrize("kwargs,message", [
    (dict(steps=7), r"steps \(7\) must be a multiple of the number of blocks"),
    (dict(cache="paged"), "cache must be one of"),
    (dict(policy="greedy"), "policy must be one of"),
    (dict(policy="threshold", threshold=1.5), r"threshold must be in \(0, 1\]"),
    (dict(threshold=0.9), r"'threshold' is a setting of policy 'threshold' / 'local_leap' / 'token_editing' / 'freedave', not of 'llada'"),
    (dict(policy="entropy", remasking="random"), r"'remasking' is a setting of policy 'llada' / 'prophet'"),
    (dict(cfg_scale=1.0, cache="dual"), "cfg_scale > 0 is supported with cache='none' only"),
])
def test_invalid_sampler_configs(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        cfg(**kwargs)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown sampler preset 'fast'"):
        SamplerConfig.preset("fast")
    assert SamplerConfig.preset("fast-dllm-dual").cache.name == "dual"


def test_bad_prompts_fail_before_compiling(model):
    with pytest.raises(ConfigError, match=r"exceeds the model's max_position \(256\)"):
        jaxdllm.generate(model, np.zeros((1, 250), np.int32), cfg(gen_length=16))
    no_mask = jaxdllm.Transformer(jaxdllm.ModelConfig.preset("tiny-llada", mask_token_id=None),
                                  rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match=r"gen_length \(20\) must be a multiple of block_length \(8\)"):
        jaxdllm.generate(model, np.zeros((1, 4), np.int32), cfg(gen_length=20, block_length=8, steps=24))
    with pytest.raises(ConfigError, match="has no mask_token_id"):
        jaxdllm.generate(no_mask, np.zeros((1, 4), np.int32), cfg())
    with pytest.raises(ValueError, match="attention_mask shape"):
        jaxdllm.generate(model, np.zeros((1, 4), np.int32), cfg(), attention_mask=np.ones((1, 3)))


class _ConstantFilter(nnx.Module):
    """Accepts everything (bias > 0) or nothing (bias < 0)."""

    def __init__(self, bias):
        self.bias = nnx.Param(jnp.float32(bias))

    def __call__(self, p):
        return jnp.zeros_like(p) + self.bias[...]


def test_learn2pd_filter_bounds(model):
    ids, mask, _ = prompts([4, 6], seed=13)
    base = jaxdllm.generate(model, ids, cfg(), attention_mask=mask)
    reject = jaxdllm.generate(model, ids, cfg(policy="learn2pd"), attention_mask=mask,
                              policy_params=_ConstantFilter(-20.0))
    np.testing.assert_array_equal(reject.tokens, base.tokens)  # nothing accepted: the LLaDA baseline
    np.testing.assert_array_equal(reject.commit_step, base.commit_step)
    accept = jaxdllm.generate(model, ids, cfg(policy="learn2pd", eot_prediction=False), attention_mask=mask,
                              policy_params=_ConstantFilter(20.0))
    assert (accept.nfe == 2).all()  # every block in one forward
    learned = jaxdllm.decoding.Learn2PDFilter(8, 8, rngs=nnx.Rngs(0))
    out = jaxdllm.generate(model, ids, cfg(policy="learn2pd"), attention_mask=mask, policy_params=learned)
    assert not (out.tokens == MASK_ID).any() and (out.nfe <= 8).all()


def test_learn2pd_end_of_text_prediction():
    model, _, _, path = shared_tiny_llada()
    ids, mask, _ = prompts([4, 6], seed=14)
    width = ids.shape[1]
    first = jaxdllm.generate(model, ids, cfg(policy="learn2pd", eot_prediction=False), attention_mask=mask,
                             policy_params=_ConstantFilter(20.0))
    eos = int(first.tokens[0, width + 3])  # a token row 0 emits in its first block
    model = jaxdllm.from_pretrained(path, eos_token_id=eos)
    out = jaxdllm.generate(model, ids, cfg(policy="learn2pd"), attention_mask=mask,
                           policy_params=_ConstantFilter(20.0))
    gen = out.tokens[0, width:]
    cut = int(np.argmax(gen == eos))
    assert cut <= 3 and (gen[cut:] == eos).all() and int(out.nfe[0]) == 1  # later block never decoded


def test_learn2pd_needs_a_filter(model):
    with pytest.raises(ConfigError, match=r"policy 'learn2pd' reads its trained filter \(learn2pd_filter.safetensors "
                                          r"beside the model\): load it with params = "
                                          r"jaxdllm.policy_params\(model_dir, config\)"):
        jaxdllm.generate(model, np.zeros((1, 4), np.int32), cfg(policy="learn2pd"))
    with pytest.raises(ConfigError, match="policy 'llada' has no parameters of its own: drop policy_params"):
        jaxdllm.generate(model, np.zeros((1, 4), np.int32), cfg(), policy_params=_ConstantFilter(1.0))


def test_medusa_from_python_says_how_to_load_its_heads():
    """`generate(..., SamplerConfig.preset("medusa"))` without the heads names the call that reads them."""
    causal = tiny_model("tiny-qwen2", shared=True)
    with pytest.raises(ConfigError, match=r"policy 'medusa' reads its draft heads .*: load it with params = "
                                          r"jaxdllm.policy_params\(model_dir, config\) and pass "
                                          r"generate\(\.\.\., policy_params=params\)"):
        jaxdllm.generate(causal, np.ones((1, 4), np.int32), SamplerConfig.preset("medusa", gen_length=8))
