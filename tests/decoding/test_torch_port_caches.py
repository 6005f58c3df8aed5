"""Fast-dLLM's prefix and dual K/V caches in the PyTorch eager port (`sampling/torch_reference/torch_port.py` on
`sampling/torch_reference/torch_llada.py`), checked against jaxdllm's compiled caches on the same weights.

Each row of a left-padded batch decoded by `jaxdllm.generate(..., cache=...)` must equal the port
run on that row alone with the same cache: tokens, NFE and the step that committed each token.
The model is sharpened (`HEAD_SCALE`) so the parallel policies commit several tokens per step,
which makes the cached steps (not only the refreshing first step of a block) decide tokens.
"""

import json

import numpy as np
import pytest

import jaxdllm
from support.llada_reference import llada_forward, make_llada_checkpoint
from support.optional import lazy, torch
from support.sampler_fixtures import HEAD_SCALE, MASK_ID, prompts, tiny_llada


torch_llada = lazy("sampling.torch_reference.torch_llada")
torch_port = lazy("sampling.torch_reference.torch_port")


def _no_mask_prediction(logits):
    logits = logits.clone()
    logits[..., MASK_ID] = -1e30  # jaxdllm's rule: MASK is never predicted (as in test_sampler_parity.py)
    return logits


class NoMaskModel:
    """A `KVModel` (and logits function) that never predicts MASK, wrapping a TorchLLaDA."""

    def __init__(self, model):
        self.model = model

    def __call__(self, ids):
        return _no_mask_prediction(self.model(ids))

    def full(self, ids):
        logits, kv = self.model.full(ids)
        return _no_mask_prediction(logits), kv

    def window(self, ids, start, kv, logits_len=None):
        return _no_mask_prediction(self.model.window(ids, start, kv, logits_len))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("llada")
    jax_model, weights, cfg = tiny_llada(path)
    return path, jax_model, NoMaskModel(torch_llada.TorchLLaDA.from_pretrained(path).eval()), weights, cfg


# ----------------------------------------------------------------------------- model forwards

@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_full_forward_is_unchanged_and_windows_on_fresh_kv_equal_it(tmp_path, kv_heads):
    """`forward(ids)` equals the K/V-returning `full` bitwise (and the test-local reference); a
    window on K/V stored from the same canvas reproduces the full forward's rows."""
    weights = make_llada_checkpoint(tmp_path, head_scale=HEAD_SCALE, n_kv_heads=kv_heads)
    model = torch_llada.TorchLLaDA.from_pretrained(tmp_path).eval()
    cfg = json.loads((tmp_path / "config.json").read_text())
    ids = torch.randint(0, 120, (2, 19))
    with torch.no_grad():
        plain = model(ids)
        logits, kv = model.full(ids)
        assert torch.equal(plain, logits)
        torch.testing.assert_close(plain, llada_forward(weights, cfg, ids), rtol=0, atol=1e-4)
        assert len(kv) == cfg["n_layers"]
        assert all(k.shape == v.shape == (2, kv_heads, 19, cfg["d_model"] // cfg["n_heads"]) for k, v in kv)
        for start, end in ((6, 19), (6, 14), (0, 19), (18, 19)):  # prefix, dual, whole, last position
            window = model.window(ids[:, start:end], start, kv)
            torch.testing.assert_close(window, plain[:, start:end], rtol=0, atol=1e-4)
            head = model.window(ids[:, start:end], start, kv, logits_len=1)
            torch.testing.assert_close(head, window[:, :1], rtol=0, atol=1e-5)


def test_window_reads_the_stored_kv_not_the_new_tokens(setup):
    """Outside the window only the stored K/V count: a window on stale K/V differs from the full
    forward of the changed canvas, and equals the window on a canvas whose change it cannot see."""
    _, _, model, _, _ = setup
    ids = torch.randint(0, 120, (1, 16))
    changed = ids.clone()
    changed[0, 2] = (ids[0, 2] + 1) % 120  # before the window [8, 16)
    with torch.no_grad():
        _, kv = model.full(ids)
        stale = model.window(changed[:, 8:], 8, kv)
        assert torch.equal(stale, model.window(ids[:, 8:], 8, kv))
        assert not torch.allclose(stale, model.full(changed)[0][:, 8:], atol=1e-4)


# ----------------------------------------------------------------------------- parity with jaxdllm

PORT_NAMES = {"llada": "low_confidence"}
CASES = [
    # (cache, policy, gen_length, steps, token-shifted), block_length 8. The first four hold every
    # pair of (cache, policy), (cache, G) and (policy, G) values once (each case is one compile);
    # the default run takes three of them and the shifted case, the slow run the rest.
    ("prefix", "threshold", 32, 32, False),
    ("prefix", "entropy", 24, 24, False),
    ("dual", "threshold", 24, 24, False),
    pytest.param("dual", "entropy", 32, 32, False, marks=pytest.mark.slow),
    pytest.param("dual", "llada", 24, 12, False, marks=pytest.mark.slow),  # LLaDA's fixed schedule
    ("prefix", "threshold", 24, 24, True),  # Dream-style logits: the window starts one token early
]


def _cached_step_commits_several(commit_step, prompt_len, gen, block) -> bool:
    """Whether a cached step (not a block's first, refreshing forward) committed 2+ tokens at once.

    A block's first forward always commits, so it is the smallest commit step in the block.
    """
    for steps in commit_step[prompt_len:].reshape(gen // block, block):
        later = steps[steps > steps.min()]
        if len(later) and int(torch.bincount(later).max()) >= 2:
            return True
    return False


@pytest.mark.parametrize("cache,policy,gen,steps,shift", CASES,
                         ids=[f"{c}-{p}-G{g}-S{s}" + ("-shifted" if sh else "")
                              for c, p, g, s, sh in (getattr(x, "values", x) for x in CASES)])
def test_cached_port_matches_jaxdllm(setup, cache, policy, gen, steps, shift):
    path, jax_model, model, _, _ = setup
    block = 8
    if shift:
        jax_model = jaxdllm.from_pretrained(path, shift_logits=True)
    config = jaxdllm.SamplerConfig(gen_length=gen, block_length=block, steps=steps, policy=policy, cache=cache,
                                   prompt_bucket=8)
    ids, mask, rows = prompts([3, 7, 5], seed=11)
    out = jaxdllm.generate(jax_model, ids, config, attention_mask=mask)
    width = ids.shape[1]
    several = []
    for i, row in enumerate(rows):
        where = f"{cache} {policy} G{gen}, row {i}"
        ref = torch_port.generate(model, torch.as_tensor(row[None], dtype=torch.long), gen_length=gen,
                                  block_length=block, steps=steps, mask_id=MASK_ID,
                                  policy=PORT_NAMES.get(policy, policy), cache=cache, shift_logits=shift)
        assert ref["nfe"] < gen, where  # several tokens per step
        several.append(_cached_step_commits_several(ref["commit_step"][0], len(row), gen, block))
        np.testing.assert_array_equal(out.tokens[i, width:], ref["tokens"][0, len(row):].numpy(), err_msg=where)
        assert int(out.nfe[i]) == ref["nfe"], where
        np.testing.assert_array_equal(out.commit_step[i, width:], ref["commit_step"][0, len(row):].numpy(),
                                      err_msg=where)
    # not trivial: the steps on stale K/V decide tokens too, not only the refreshing first steps
    assert any(several), f"{cache} {policy} G{gen}: no cached step committed several tokens"


# ----------------------------------------------------------------------------- batch form, errors

@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_generate_batch_with_cache_equals_generate_per_row(setup, cache):
    _, _, model, _, _ = setup
    batch = torch.as_tensor(np.random.RandomState(3).randint(0, 120, (3, 5)), dtype=torch.long)
    kw = dict(gen_length=24, block_length=8, steps=24, mask_id=MASK_ID, policy="threshold", cache=cache)
    out = torch_port.generate_batch(model, batch, **kw)
    for i in range(len(batch)):
        ref = torch_port.generate(model, batch[i:i + 1], **kw)
        torch.testing.assert_close(out["tokens"][i], ref["tokens"][0], rtol=0, atol=0)
        assert int(out["nfe"][i]) == ref["nfe"]


def test_unsupported_combinations_raise(setup):
    _, _, model, _, _ = setup
    prompt = torch.tensor([[1, 2, 3]])
    kw = dict(gen_length=8, block_length=8, steps=8, mask_id=MASK_ID, policy="threshold")
    with pytest.raises(ValueError, match="cfg_scale"):
        torch_port.generate(model, prompt, **kw, cache="prefix", cfg_scale=1.0)
    with pytest.raises(ValueError, match="shift_logits"):
        torch_port.generate(model, prompt, **kw, cache="dual", shift_logits=True)
    with pytest.raises(ValueError, match="prophet"):
        torch_port.generate(model, prompt, **(kw | {"policy": "prophet"}), cache="dual")
    with pytest.raises(ValueError, match="unknown cache"):
        torch_port.generate(model, prompt, **kw, cache="full")
    with pytest.raises(TypeError, match="KVModel"):
        torch_port.generate(lambda x: model(x), prompt, **kw, cache="prefix")
    assert isinstance(model.model, torch_port.KVModel) and not isinstance(lambda x: x, torch_port.KVModel)
    with pytest.raises(ValueError):
        torch_port.CachedForward(model, "none")
