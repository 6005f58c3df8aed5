"""Token-for-token parity of the compiled sampler with two references on the same weights:

1. the PyTorch eager port of the published algorithms (`sampling/torch_reference/torch_port.py`) running the
   test-local torch LLaDA forward (`support/llada_reference.py`), and
2. the same port's Python loop driving jaxdllm's own (jitted) forward: a Python-loop
   reference that isolates the policy logic from model numerics.

Each row of a batch of different prompt lengths must match the reference run on that row
alone: tokens, NFE and the step at which each token was committed.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxdllm
from support.forward import forward
from support.llada_reference import llada_forward
from support.optional import lazy, torch
from support.sampler_fixtures import EOS_ID, MASK_ID, prompts, tiny_llada


torch_port = lazy("sampling.torch_reference.torch_port")

EOT_ID = 125


def _no_mask_prediction(logits):
    logits = logits.clone()
    logits[..., MASK_ID] = -1e30  # finite so CFG (u + s(c - u)) stays finite; jaxdllm's documented rule: MASK is never predicted
    return logits


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("llada")
    _, weights, cfg = tiny_llada(path)
    torch_fn = lambda x: _no_mask_prediction(llada_forward(weights, cfg, x))
    return path, torch_fn


def _jax_fn(model):
    return lambda x: _no_mask_prediction(torch.from_numpy(np.array(forward(model, jnp.asarray(x.numpy())).logits)))


def _assert_row_matches(out, ref, i, width, prompt_len, where):
    """Row i of a padded batch (prompt width `width`) equals a reference run on that row alone."""
    np.testing.assert_array_equal(out.tokens[i, width:], ref["tokens"][0, prompt_len:].numpy(), err_msg=where)
    assert int(out.nfe[i]) == int(ref["nfe"]), where
    np.testing.assert_array_equal(out.commit_step[i, width:], ref["commit_step"][0, prompt_len:].numpy(),
                                  err_msg=where)


PORT_NAMES = {"llada": "low_confidence"}
CASES = [
    # (policy, gen_length, block_length, steps, extra SamplerConfig fields)
    ("llada", 16, 8, 8, {}),
    ("llada", 24, 8, 12, {}),
    ("llada", 16, 16, 5, {}),
    ("llada", 16, 8, 16, {"confidence_eos_eot_inf": True}),
    ("llada", 16, 8, 8, {"cfg_scale": 1.5}),
    ("threshold", 24, 8, 24, {}),
    ("threshold", 16, 16, 16, {"threshold": 0.7}),
    ("factor", 24, 8, 24, {}),
    ("entropy", 24, 8, 24, {}),
    ("entropy", 16, 8, 16, {"entropy_threshold": 1.0}),
    ("local_leap", 24, 8, 24, {}),
    ("credit", 24, 8, 24, {}),
    ("credit", 16, 8, 16, {"credit_threshold": 0.8, "credit_alpha": 0.9}),
    ("prophet", 24, 8, 24, {}),
    ("prophet", 24, 8, 24, {"prophet_thresholds": (40.0, 30.0, 20.0)}),
    ("llada", 24, 8, 24, {"stop_at_eos": True}),
]


def _port_kwargs(policy, gen, block, steps, extra):
    kw = dict(gen_length=gen, block_length=block, steps=steps, mask_id=MASK_ID,
              policy=PORT_NAMES.get(policy, policy), eos_id=EOS_ID, eot_id=EOT_ID)
    names = {"entropy_threshold": "entropy_threshold", "threshold": "threshold", "cfg_scale": "cfg_scale",
             "confidence_eos_eot_inf": "confidence_eos_eot_inf", "credit_threshold": "credit_threshold",
             "credit_alpha": "credit_alpha", "prophet_thresholds": "prophet_thresholds",
             "stop_at_eos": "stop_at_eos"}
    kw.update({names[k]: v for k, v in extra.items()})
    return kw


def first_of_each(cases: list[tuple]) -> list:
    """The first case of each policy as it is; the policy's other cases in the slow run (the default
    run's 6-minute budget)."""
    seen: set = set()
    out = []
    for case in cases:
        out.append(case if case[0] not in seen else pytest.param(*case, marks=pytest.mark.slow))
        seen.add(case[0])
    return out


@pytest.mark.parametrize("policy,gen,block,steps,extra", first_of_each(CASES),
                         ids=[f"{c[0]}-G{c[1]}-B{c[2]}-S{c[3]}-{'-'.join(c[4]) or 'default'}" for c in CASES])
def test_generate_matches_torch_port_and_python_loop(setup, policy, gen, block, steps, extra):
    path, torch_fn = setup
    model = jaxdllm.from_pretrained(path, eot_token_id=EOT_ID)
    config = jaxdllm.SamplerConfig(gen_length=gen, block_length=block, steps=steps, policy=policy,
                                   prompt_bucket=8, **extra)
    ids, mask, rows = prompts([3, 7, 5], seed=11)
    width = ids.shape[1]
    eos = EOS_ID
    if config.stop_at_eos:  # declare a token this model emits often EOS, so rows really stop early
        plain = jaxdllm.generate(model, ids, config.replace(stop_at_eos=False), attention_mask=mask)
        eos = int(np.bincount(plain.tokens[:, width:].ravel()).argmax())
        model = jaxdllm.from_pretrained(path, eot_token_id=EOT_ID, eos_token_id=eos)
    out = jaxdllm.generate(model, ids, config, attention_mask=mask)
    if config.stop_at_eos:
        assert (out.nfe < steps).all()
    kw = _port_kwargs(policy, gen, block, steps, extra) | {"eos_id": eos}
    jax_fn = _jax_fn(model)
    for i, row in enumerate(rows):
        prompt = torch.as_tensor(row[None], dtype=torch.long)
        for name, fn in (("torch port", torch_fn), ("python loop", jax_fn)):
            _assert_row_matches(out, torch_port.generate(fn, prompt, **kw), i, width, len(row), f"{name}, row {i}")


def test_dream_timesteps_equal_torch_linspace_bitwise():
    from jaxdllm.decoding.policies import dream_timesteps

    for steps in (1, 2, 7, 16, 64, 255, 256, 512):
        ours = dream_timesteps(steps, 1e-3)
        ref = torch.linspace(1, 1e-3, steps + 1).numpy()
        np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32), err_msg=str(steps))


DREAM_CASES = [("maskgit_plus", 16, 16), ("topk_margin", 16, 16), ("entropy", 16, 16), ("entropy", 24, 8),
               ("maskgit_plus", 24, 5)]


@pytest.mark.parametrize("alg,gen,steps", first_of_each(DREAM_CASES), ids=[f"{a}-G{g}-S{s}" for a, g, s in DREAM_CASES])
def test_dream_matches_torch_port_and_python_loop(setup, alg, gen, steps):
    """Dream's sampler (token-shifted logits, timestep schedule) on a shifted model."""
    path, torch_fn = setup
    model = jaxdllm.from_pretrained(path, shift_logits=True)
    config = jaxdllm.SamplerConfig(gen_length=gen, block_length=gen, steps=steps, policy="dream",
                                   dream_alg=alg, prompt_bucket=8)
    ids, mask, rows = prompts([3, 7, 5], seed=12)
    out = jaxdllm.generate(model, ids, config, attention_mask=mask)
    width = ids.shape[1]
    for i, row in enumerate(rows):
        prompt = torch.as_tensor(row[None], dtype=torch.long)
        for name, fn in (("torch port", torch_fn), ("python loop", _jax_fn(jaxdllm.from_pretrained(path)))):
            ref = torch_port.generate_dream(fn, prompt, gen_length=gen, steps=steps, mask_id=MASK_ID, alg=alg)
            _assert_row_matches(out, ref, i, width, len(row), f"{name}, row {i}")
