"""GenMol's confidence sampler in the one loop (`jaxdllm/decoding/policies/genmol.py`, `genmol_canvas.py`):
against a plain numpy loop of the published `step_confidence` driven by the same draws, one token per
step and row, guidance against two plain forwards, the annealed noise's law, the presets' constants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdllm
from jaxdllm import SamplerConfig
from jaxdllm.attention import MaskSpec
from jaxdllm.decoding import loop, sampler
from jaxdllm.decoding.genmol_canvas import genmol_canvas, genmol_generate, sample_lengths
from jaxdllm.decoding.policies.base import StepContext
from jaxdllm.decoding.policies.genmol import TASK_MIN_ADD_LEN, Genmol, GenmolState, genmol_draws
from support.forward import forward
from support.models import tiny_model

BOS, EOS, PAD, MASK = 1, 2, 3, 4  # GenMol's special ids
BUCKET = 8


@pytest.fixture(scope="module")
def model():
    return tiny_model("tiny-llada", head_scale=4.0, shared=True, bos_token_id=BOS, eos_token_id=EOS,
                      pad_token_id=PAD, mask_token_id=MASK, eot_token_id=None)


def cfg(preset="genmol", **kw):
    return SamplerConfig.preset(preset, prompt_bucket=BUCKET, **kw)


def canvas(seed=0):
    """Three rows of different prompts and MASK counts (one de novo), right-padded."""
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(10, 200, 5)), [], list(rng.integers(10, 200, 3))]
    return genmol_canvas(prompts, [4, 7, 2], bos=BOS, eos=EOS, pad=PAD, mask=MASK)


def plain_logits(model, x):
    """One forward of right-padded rows `x [B, L]` as GenMol runs it: attention mask `x != PAD`, positions
    0..len-1 (float64 numpy)."""
    seg = (x != PAD).astype(np.int32)
    positions = np.maximum(np.cumsum(seg, 1) - 1, 0)
    spec = MaskSpec(kind="bidirectional", q_segment_ids=jnp.asarray(seg), kv_segment_ids=jnp.asarray(seg))
    return np.asarray(forward(model, jnp.asarray(x), jnp.asarray(positions), spec).logits, np.float64)


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def reference(model, ids, tau, r, n_unmask, key, gen_length=1):
    """The published loop (`Sampler.generate` + `MDLM.step_confidence`, gamma 0) in numpy, with the draws
    the loop takes at step i (`genmol_draws(fold_in(key, i), ...)` over its left-padded canvas).
    Returns (tokens [B, L], commit step [B, L]: i + 1 for a token decided at step i, 0 for given ones)."""
    x = ids.copy()
    b, width = x.shape
    extra = -width % BUCKET
    total = extra + width + gen_length
    n = (x == MASK).sum(1)
    steps = max(-(-int(n.max()) // n_unmask), 2)
    decided = np.zeros_like(x)
    for i in range(steps):
        logits = plain_logits(model, x)
        logits[..., MASK] += -1e6
        logp = log_softmax(logits)
        tok_g, ord_g = genmol_draws(jax.random.fold_in(key, i), (b, total, logits.shape[-1]))
        tok_g = np.asarray(tok_g, np.float64)[:, extra:extra + width]
        ord_g = np.asarray(ord_g, np.float64)[:, extra:extra + width]
        scaled = log_softmax(logp / tau)
        pred = (scaled + tok_g).argmax(-1)
        conf = np.take_along_axis(scaled, pred[..., None], -1)[..., 0] + r * (1 - i / (steps - 1)) * ord_g
        masked = x == MASK
        conf[~masked] = -np.inf
        thr = -np.sort(-conf, axis=1)[:, n_unmask - 1:n_unmask]
        replace = (conf >= thr) & masked
        x[replace] = pred[replace]
        decided[replace] = i + 1
    return x, decided


@pytest.mark.parametrize("tau,r,n_unmask", [(0.5, 0.5, 1), (1.2, 3.0, 1), (1.2, 2.0, 3)])
def test_the_loop_equals_the_published_loop_under_the_same_draws(model, tau, r, n_unmask):
    ids, mask = canvas()
    key = jax.random.PRNGKey(7)
    config = cfg(temperature=tau, randomness=r, tokens_per_step=n_unmask)
    out = genmol_generate(jaxdllm.Sampler(model), ids, mask, config, key=key)
    ref_tokens, ref_steps = reference(model, ids, tau, r, n_unmask, key)
    np.testing.assert_array_equal(out.tokens, ref_tokens)
    np.testing.assert_array_equal(out.commit_step, ref_steps)


def test_one_token_per_step_rows_finish_independently_specials_and_pad_untouched(model):
    ids, mask = canvas(seed=1)
    out = genmol_generate(jaxdllm.Sampler(model), ids, mask, cfg(), key=jax.random.PRNGKey(0))
    masks = (ids == MASK).sum(1)
    np.testing.assert_array_equal(out.nfe, masks)  # one forward per MASK, each row stops at its last
    assert out.steps == masks.max()
    assert not (out.tokens == MASK).any()
    given = ids != MASK
    np.testing.assert_array_equal(out.tokens[given], ids[given])  # BOS, prompt, EOS and PAD untouched
    for row, n in zip(out.commit_step, masks):
        assert sorted(row[row > 0]) == list(range(1, n + 1))  # exactly one commit per step
    # three per step: ceil(n / 3) forwards per row
    three = genmol_generate(jaxdllm.Sampler(model), ids, mask, cfg(tokens_per_step=3), key=jax.random.PRNGKey(0))
    np.testing.assert_array_equal(three.nfe, -(-masks // 3))


def test_a_plain_prompt_gets_gen_length_masks_and_greedy_genmol_is_llada_on_one_block(model):
    """A row without MASK decodes `gen_length` MASK after it; at T = 0 and r = 0 the rule is LLaDA's
    low-confidence remasking, one token per step over one block."""
    ids = np.asarray([[BOS, 20, 30, 40], [BOS, 50, 60, 70]], np.int32)
    g = jaxdllm.generate(model, ids, cfg(gen_length=8, temperature=0.0, randomness=0.0))
    ll = jaxdllm.generate(model, ids, SamplerConfig(gen_length=8, block_length=8, steps=8, prompt_bucket=BUCKET))
    np.testing.assert_array_equal(g.tokens, ll.tokens)
    np.testing.assert_array_equal(g.commit_step, ll.commit_step)
    np.testing.assert_array_equal(g.nfe, ll.nfe)


@pytest.mark.parametrize("rows", ["first", "each"])
def test_guidance_mixes_the_logits_of_two_plain_forwards(model, rows):
    ids, mask = canvas(seed=2)
    config = cfg("genmol-superstructure", guidance_rows=rows)
    prep = sampler.prepare(model.config, ids, mask, config)
    from flax import nnx
    graphdef, params = nnx.split(model)
    key = jax.random.PRNGKey(3)
    # jitted: eager calls dispatch op by op, a compile each on CPU
    state = jax.jit(lambda p, k: loop.init_step(graphdef, p, prep.ids, prep.seg, prep.valid, k, canvas=config.canvas,
                                                lay=prep.lay, config=config))(params, key)
    step_key = jax.random.fold_in(key, 0)
    traced = {}

    def guided_logits(s, k):
        logits, traced["passes"], poor = config.canvas.logits(model, s, prep.lay, config, k)
        return logits, poor

    logits, poor = jax.jit(guided_logits)(state, step_key)
    assert traced["passes"] == 2
    e, width = prep.extra, ids.shape[1]
    poor = np.asarray(poor)[:, e:e + width]
    got = np.asarray(logits, np.float64)[:, e:e + width]
    context = (ids != BOS) & (ids != EOS) & (ids != MASK) & (ids != PAD)
    if rows == "first":  # row 0's columns, floor(0.4 * its context), masked in every row
        assert (poor == poor[:1]).all() and poor[0].sum() == int(0.4 * context[0].sum())
        assert not (poor[0] & ~context[0]).any()
    else:
        assert (poor.sum(1) == np.floor(0.4 * context.sum(1))).all() and not (poor & ~context).any()
    poor_ids = np.where(poor, MASK, ids)
    want = 2.0 * plain_logits(model, ids) + (1 - 2.0) * plain_logits(model, poor_ids)
    want[..., MASK] += -1e6
    real = ids != PAD
    np.testing.assert_allclose(got[real], want[real], atol=2e-4, rtol=1e-4)
    out = genmol_generate(jaxdllm.Sampler(model), ids, mask, config, key=key)
    np.testing.assert_array_equal(out.nfe, 2 * (ids == MASK).sum(1))  # both forwards counted
    assert not (out.tokens == MASK).any()


def test_the_annealed_noise_picks_positions_with_gumbel_max_law():
    """Position j's confidence is -log m_j (uniform over m_j tokens): at step i of S the first commit is j
    with probability softmax(conf / (r (1 - i / (S - 1))))_j; at the last step it is the argmax."""
    vocab, m = 16, np.array([1, 2, 4, 8])
    logits = np.where(np.arange(vocab)[None] < m[:, None], 0.0, -1e4)[None].astype(np.float32)  # [1, 4, V]
    policy, r = Genmol(randomness=1.5), 1.5
    config = SamplerConfig(policy=policy, temperature=1.0, gen_length=1)
    candidates = jnp.ones((1, 4), bool)

    def first(key, step):
        ctx = StepContext(config=config, block=jnp.int32(0), block_step=step, key=key,
                          state=GenmolState(num_steps=jnp.int32(5)))
        return jnp.argmax(policy.commit(jnp.asarray(logits), candidates, ctx).commit[0])

    keys = jax.random.split(jax.random.PRNGKey(0), 4000)
    for step in (0, 2):
        picks = np.asarray(jax.vmap(lambda k: first(k, jnp.int32(step)))(keys))
        scale = r * (1 - step / 4)
        law = np.exp(-np.log(m) / scale)
        law /= law.sum()
        np.testing.assert_allclose(np.bincount(picks, minlength=4) / len(keys), law, atol=0.03)
    assert set(np.asarray(jax.vmap(lambda k: first(k, jnp.int32(4)))(keys[:50])).tolist()) == {0}


def test_presets_carry_the_published_constants():
    table = {  # preset: (T, r, gamma)
        "genmol": (0.5, 0.5, 0.0), "genmol-denovo": (0.5, 0.5, 0.0), "genmol-linker": (1.2, 3.0, 0.0),
        "genmol-motif": (1.2, 1.2, 0.3), "genmol-scaffold": (1.2, 2.0, 0.3),
        "genmol-superstructure": (1.2, 2.0, 0.4), "genmol-remask": (1.2, 2.0, 0.0)}
    for name, (tau, r, gamma) in table.items():
        c = SamplerConfig.preset(name)
        assert (c.temperature, c.randomness, c.guidance_gamma) == (tau, r, gamma), name
        assert (c.tokens_per_step, c.guidance_weight, c.guidance_rows, c.policy.name) == (1, 2.0, "first", "genmol")
    assert TASK_MIN_ADD_LEN["denovo"] == 40 and TASK_MIN_ADD_LEN["linker"] == 30
    assert TASK_MIN_ADD_LEN["motif"] == TASK_MIN_ADD_LEN["scaffold"] == TASK_MIN_ADD_LEN["superstructure"] == 18


def test_the_canvas_helpers():
    ids, mask = genmol_canvas([[BOS, 9, 8, EOS], [7]], [2, 0], bos=BOS, eos=EOS, pad=PAD, mask=MASK)
    np.testing.assert_array_equal(ids, [[BOS, 9, 8, MASK, MASK, EOS], [BOS, 7, EOS, PAD, PAD, PAD]])
    np.testing.assert_array_equal(mask, ids != PAD)
    rng = np.random.default_rng(0)
    counts = sample_lengths([10, 50, 60], 12, 18, rng, num=200)
    assert set(counts) == {18, 38, 48}  # max(choice - 12, 18)
    assert isinstance(sample_lengths([30], 2, 5, rng), int)
