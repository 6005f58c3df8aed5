"""FreeDave (policy `freedave`, `jaxdllm/decoding/freedave_canvas.py`): the output of the greedy
reference it verifies against, in fewer forwards.

Each case decodes a ragged batch (left-padded prompts of different lengths) and checks, row by row:
the tokens equal jaxdllm's reference sampler (`FreeDave.reference_config`: `llada` at one token per
step, or `threshold`) on the same batch and the PyTorch port of the published algorithm
(`sampling/torch_reference/torch_freedave.py`) run on the row alone; NFE is strictly lower than the
reference's and at most the port's (the port pays a forward at every block start; here a draft that
completes a block also seeds the next one). Models: the sharpened tiny LLaDA checkpoint
(bidirectional), the same weights token-shifted (Dream's convention), and a tiny block-causal
token-shifted model with the exact block cache (`cache="block"`) in both draft layouts.

Ties: drafts and targets rank with the reference's own `rank_among` (ties to the lower position),
and the batch layout gives every draft the reference's forward shapes, so the comparisons are exact.
"""

import functools

import numpy as np
import pytest

import jaxdllm
from jaxdllm import ConfigError, SamplerConfig
from jaxdllm.decoding import sampler
from support.llada_reference import llada_forward
from support.models import tiny_model
from support.optional import lazy, torch
from support.sampler_fixtures import MASK_ID, prompts, shared_tiny_llada


torch_freedave = lazy("sampling.torch_reference.torch_freedave")

cfg = functools.partial(SamplerConfig, gen_length=32, block_length=8, policy="freedave", prompt_bucket=8)


@pytest.fixture(scope="module")
def llada():
    model, weights, config, path = shared_tiny_llada()

    def torch_fn(x):
        logits = llada_forward(weights, config, x).clone()
        logits[..., MASK_ID] = -1e30  # jaxdllm's rule: MASK is never predicted
        return logits

    return model, path, torch_fn


def assert_reference_output(model, ids, mask, config, fewer=True):
    """FreeDave's tokens equal the reference's on the batch, with fewer forwards per row; returns both."""
    out = jaxdllm.generate(model, ids, config, attention_mask=mask)
    ref = jaxdllm.generate(model, ids, config.policy.reference_config(config), attention_mask=mask)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    assert not (out.tokens == model.config.mask_token_id).any()
    if fewer:
        assert (out.nfe < ref.nfe).all(), (out.nfe, ref.nfe)
    if model.config.attention == "bidirectional":  # (a block-causal row's last block may pass G: dropped)
        assert (out.commit_step.max(1) == out.nfe).all()  # the last forward commits
    return out, ref


@pytest.mark.parametrize("shift", [False, True], ids=["llada", "dream-shifted"])
def test_ragged_batch_equals_one_token_per_step_and_the_torch_port(llada, shift):
    model, path, torch_fn = llada
    if shift:
        model = jaxdllm.from_pretrained(path, shift_logits=True)
    ids, mask, rows = prompts([3, 7, 5], seed=11)
    out, ref = assert_reference_output(model, ids, mask, cfg(drafts=4))
    assert (ref.nfe == 32).all() and out.nfe.mean() < 24  # 4 blocks of 8, one token per step
    width = ids.shape[1]
    for i, row in enumerate(rows):
        port = torch_freedave.generate(torch_fn, torch.as_tensor(row[None], dtype=torch.long), gen_length=32,
                                       block_length=8, mask_id=MASK_ID, drafts=4, shift_logits=shift)
        np.testing.assert_array_equal(out.tokens[i, width:], port["tokens"][0, len(row):].numpy(), err_msg=f"row {i}")
        assert int(out.nfe[i]) <= port["nfe"], i


def test_a_row_decodes_as_alone(llada):
    ids, mask, rows = prompts([3, 7, 5], seed=11)
    batch = jaxdllm.generate(llada[0], ids, cfg(), attention_mask=mask)
    alone = jaxdllm.generate(llada[0], rows[1][None], cfg())
    np.testing.assert_array_equal(batch.tokens[1, ids.shape[1]:], alone.tokens[0, len(rows[1]):])
    np.testing.assert_array_equal(batch.commit_step[1, ids.shape[1]:], alone.commit_step[0, len(rows[1]):])
    assert int(batch.nfe[1]) == int(alone.nfe[0])


@pytest.mark.slow
def test_the_threshold_reference_is_reproduced(llada):
    """Fast-dLLM's threshold rule as the reference, exact match: its output, in fewer forwards."""
    model, _, torch_fn = llada
    ids, mask, rows = prompts([3, 7, 5], seed=11)
    out, _ = assert_reference_output(model, ids, mask, cfg(reference="threshold", threshold=0.9))
    for i, row in enumerate(rows):
        port = torch_freedave.generate(torch_fn, torch.as_tensor(row[None], dtype=torch.long), gen_length=32,
                                       block_length=8, mask_id=MASK_ID, drafts=4, threshold=0.9)
        np.testing.assert_array_equal(out.tokens[i, ids.shape[1]:], port["tokens"][0, len(row):].numpy())


@pytest.fixture(scope="module")
def block_model():
    return tiny_model("tiny-block-diffusion", head_scale=60.0, shared=True)  # block_size 8, token-shifted


@pytest.mark.parametrize("layout,block_length", [
    ("batch", 8),
    ("tree", 16),                                              # a window of two model blocks: a chain per draft
    pytest.param("tree", 8, marks=pytest.mark.slow),
    pytest.param("batch", 4, marks=pytest.mark.slow),          # sub-blocks: a draft seeds the next sub-block
    pytest.param("batch", 16, marks=pytest.mark.slow),
])
def test_block_causal_with_the_block_cache(block_model, layout, block_length):
    ids, mask, _ = prompts([3, 11, 6], seed=1)
    config = cfg(cache="block", block_length=block_length, draft_layout=layout)
    assert_reference_output(block_model, ids, mask, config)


@pytest.mark.slow
def test_the_sequential_layout_is_the_reference(block_model, llada):
    """The determinism layout: each draft a forward of the reference's shapes, one after another."""
    ids, mask, _ = prompts([3, 7, 5], seed=11)
    batch = jaxdllm.generate(llada[0], ids, cfg(), attention_mask=mask)
    sequential, _ = assert_reference_output(llada[0], ids, mask, cfg(draft_layout="sequential"))
    np.testing.assert_array_equal(sequential.nfe, batch.nfe)
    ids, mask, _ = prompts([3, 11, 6], seed=1)
    assert_reference_output(block_model, ids, mask, cfg(cache="block", draft_layout="sequential"))


@pytest.mark.slow
def test_block_causal_without_a_cache_and_the_subset_rule(block_model, llada):
    ids, mask, _ = prompts([3, 11, 6], seed=1)
    assert_reference_output(block_model, ids, mask, cfg(drafts=8))
    model = llada[0]
    ids, mask, _ = prompts([3, 7, 5], seed=11)
    # with the llada reference an agreeing draft decides exactly the target's positions: subset == exact
    exact = jaxdllm.generate(model, ids, cfg(), attention_mask=mask)
    subset = jaxdllm.generate(model, ids, cfg(match_rule="subset"), attention_mask=mask)
    np.testing.assert_array_equal(exact.tokens, subset.tokens)
    np.testing.assert_array_equal(exact.nfe, subset.nfe)


@pytest.mark.slow
def test_stop_at_eos_stops_where_the_reference_stops(llada):
    """EOS = the token the model emits most: the chain stops at the draft where the reference stops,
    so the EOS filling after it is the reference's too."""
    model, path, _ = llada
    ids, mask, _ = prompts([4, 6], seed=7)
    plain = jaxdllm.generate(model, ids, cfg(), attention_mask=mask)
    eos = int(np.bincount(plain.tokens[:, ids.shape[1]:].ravel()).argmax())
    model = jaxdllm.from_pretrained(path, eos_token_id=eos)
    for stop in (True, "block"):
        out, ref = assert_reference_output(model, ids, mask, cfg(stop_at_eos=stop), fewer=False)
        assert (out.nfe <= ref.nfe).all() and (ref.nfe < 32).all()


@pytest.mark.parametrize("kwargs,message", [
    (dict(cache="dual"),
     r"cache='dual' is approximate: use an exact cache: cache='none' .*cache='block' \(block_causal models\)"),
    (dict(cache="prefix"), r"cache='prefix' is approximate"),
    (dict(cfg_scale=1.5), "use cfg_scale=0"),
    (dict(temperature=0.7), "use temperature=0"),
    (dict(draft_layout="tree"), r"draft_layout='tree' shares the cached prefix .* use draft_layout='batch'"),
    (dict(drafts=0), "drafts must be an integer >= 1"),
    (dict(match_rule="prefix"), "match_rule must be one of"),
    (dict(reference="entropy"), "reference must be one of"),
])
def test_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        cfg(**kwargs)


def test_preset_and_model_errors_before_compiling(monkeypatch, llada):
    preset = SamplerConfig.preset("freedave", gen_length=64)
    assert (preset.drafts, preset.block_length, preset.match_rule, preset.reference) == (4, 32, "exact_match", "llada")
    ref = preset.policy.reference_config(preset)
    assert (ref.policy.name, ref.steps, ref.block_length) == ("llada", 64, 32)

    def must_not_compile(*args, **kw):
        raise AssertionError("validation must happen before compiling")

    monkeypatch.setattr(sampler, "decode", must_not_compile)
    with pytest.raises(ConfigError, match="this model is bidirectional"):
        jaxdllm.generate(llada[0], np.zeros((1, 4), np.int32), cfg(cache="block"))
    with pytest.raises(ConfigError, match="the model's attention is 'causal'"):
        jaxdllm.generate(tiny_model("tiny-qwen2", shared=True, mask_token_id=255), np.zeros((1, 4), np.int32), cfg())
