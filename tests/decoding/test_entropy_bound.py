"""The EB-sampler's acceptance rule (`entropy_bound_accept`) against a loop written here from the
paper's statement, and the `entropy_bound` policy / `eb` preset on the tiny models: a tiny bound
is one-token-per-step decoding in entropy order; the preset decodes LLaDA- and Dream-style models.
(Its `cache="block"` exactness: tests/decoding/test_sampler_block_cache.py.)"""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxdllm
from jaxdllm import ConfigError, SamplerConfig
from jaxdllm.decoding.policies import entropy_bound_accept, token_entropy
from support.models import tiny_model
from support.sampler_fixtures import prompts, shared_tiny_llada


def accept_by_loop(entropy, candidates, bound):
    """Per row: sort the candidates by entropy (stable: lower position first on ties) and accept
    rank k iff the entropies of ranks 0..k sum, less rank k's own, to at most `bound`."""
    out = np.zeros(candidates.shape, bool)
    bounds = np.broadcast_to(np.asarray(bound, np.float64).reshape(-1, 1), (len(entropy), 1))
    for row in range(len(entropy)):
        where = np.flatnonzero(candidates[row])
        ranked = where[np.argsort(entropy[row, where].astype(np.float64), kind="stable")]
        total = 0.0
        for pos in ranked:
            h = float(entropy[row, pos])
            total += h
            out[row, pos] = total - h <= bounds[row, 0]
    return out


def test_accept_equals_a_sorted_cumulative_sum_loop():
    rng = np.random.default_rng(0)
    B, L = 7, 12
    candidates = rng.random((B, L)) < 0.7
    candidates[0] = False  # a row with no candidate accepts nothing
    candidates[1] = True
    # multiples of 1/8 up to 2 nats: exact float32 sums, ties, and sums landing exactly on a bound
    quantised = (rng.integers(0, 17, (B, L)) / 8).astype(np.float32)
    continuous = rng.exponential(0.3, (B, L)).astype(np.float32)
    for entropy in (quantised, continuous):
        for bound in (1e-9, 0.1, 0.25, 0.5, 1.0, 3.0, 1e6):
            got = np.asarray(entropy_bound_accept(jnp.asarray(entropy), jnp.asarray(candidates), bound))
            np.testing.assert_array_equal(got, accept_by_loop(entropy, candidates, bound), err_msg=f"bound {bound}")
            assert not got[0].any() and (got.sum(1)[1:] >= 1).all()  # progress on every row with a candidate
        # a bound per row ([B, 1]); a huge bound accepts every candidate
        bounds = np.linspace(0.05, 2.0, B, dtype=np.float32)[:, None]
        got = np.asarray(entropy_bound_accept(jnp.asarray(entropy), jnp.asarray(candidates), jnp.asarray(bounds)))
        np.testing.assert_array_equal(got, accept_by_loop(entropy, candidates, bounds))
        everything = entropy_bound_accept(jnp.asarray(entropy), jnp.asarray(candidates), 1e6)
        np.testing.assert_array_equal(np.asarray(everything), candidates)
    # ties: the lower position goes first (0.25 each, bound 0.3: ranks 0 and 1 pass, rank 2 does not)
    tied = entropy_bound_accept(jnp.full((1, 4), 0.25), jnp.array([[False, True, True, True]]), 0.3)
    np.testing.assert_array_equal(np.asarray(tied), [[False, True, True, False]])


def test_token_entropy_is_finite_with_minus_inf_logits():
    logits = jnp.array([[[0.0, 0.0, -jnp.inf, -jnp.inf], [5.0, -jnp.inf, -jnp.inf, -jnp.inf]]])
    np.testing.assert_allclose(np.asarray(token_entropy(logits)), [[np.log(2), 0.0]], atol=1e-6)


def test_a_tiny_bound_decodes_one_token_per_step_in_entropy_order():
    """Bound 1e-9 accepts only the lowest-entropy candidate: the `entropy` policy at threshold 0
    (its lowest-entropy candidate alone, while no entropy is exactly 0) decodes the same tokens in
    the same steps, one per step."""
    model = shared_tiny_llada()[0]
    ids, mask, _ = prompts([3, 7, 5], seed=1)
    config = SamplerConfig.preset("eb", gen_length=16, block_length=8, prompt_bucket=8, entropy_bound=1e-9)
    eb = jaxdllm.generate(model, ids, config, attention_mask=mask)
    ref = jaxdllm.generate(model, ids, config.replace(policy="entropy", entropy_threshold=0.0), attention_mask=mask)
    np.testing.assert_array_equal(np.asarray(eb.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(eb.commit_step), np.asarray(ref.commit_step))
    assert (np.asarray(eb.nfe) == 16).all()
    steps = np.asarray(eb.commit_step)[:, ids.shape[1]:]
    assert all((np.bincount(row, minlength=17)[1:] == 1).all() for row in steps)  # exactly one per step


def test_the_eb_preset_decodes_a_dream_style_model():
    """Dream-style logits (`shift_logits`: position i's prediction is read at i - 1); the LLaDA
    style is the shared model of the test above and of test_sampler.py's policy contract."""
    model = tiny_model("tiny-dream", head_scale=15.0, shared=True)
    assert model.config.shift_logits
    ids, mask, _ = prompts([3, 7], seed=2)
    config = SamplerConfig.preset("eb", gen_length=16, prompt_bucket=8)
    assert (config.policy.name, config.entropy_bound, config.block_length) == ("entropy_bound", 0.1, 16)
    out = jaxdllm.generate(model, ids, config, attention_mask=mask)
    tokens, steps, nfe = np.asarray(out.tokens), np.asarray(out.commit_step), np.asarray(out.nfe)
    assert not (tokens == model.config.mask_token_id).any()
    assert (steps[:, ids.shape[1]:] >= 1).all() and (steps.max(1) == nfe).all() and (nfe <= 16).all()


def test_a_bound_that_is_not_positive_is_refused():
    for bad in (0.0, -0.1, float("nan")):
        with pytest.raises(ConfigError, match="entropy_bound must be > 0"):
            SamplerConfig.preset("eb", entropy_bound=bad)
