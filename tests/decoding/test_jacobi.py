"""Jacobi decoding (the loop's second method) equals greedy autoregressive decoding, the published
property, checked against transformers' `generate(do_sample=False)` on the same tiny random Qwen2
and Llama checkpoints: batches of different prompt lengths, windows that do not divide the
length, EOS inside the generation."""

import jax
import numpy as np
import pytest

import jaxdllm
from jaxdllm import ConfigError, SamplerConfig
from support.hf_models import make_hf_model
from support.optional import torch
from support.sampler_fixtures import prompts

PAD = 0


# Llama runs every test again in the slow run; the default run checks Qwen2.
@pytest.fixture(scope="module", params=[("qwen2", "gqa"), pytest.param(("llama", "mha"), marks=pytest.mark.slow)],
                ids=["qwen2", "llama"])
def saved(request, tmp_path_factory):
    kind, shape = request.param
    hf = make_hf_model(kind, shape)
    path = tmp_path_factory.mktemp(kind)
    hf.save_pretrained(path)
    return hf, path


def hf_greedy(hf, ids, mask, gen, eos=None):
    with torch.no_grad():
        out = hf.generate(input_ids=torch.as_tensor(ids, dtype=torch.long),
                          attention_mask=torch.as_tensor(mask, dtype=torch.long), max_new_tokens=gen,
                          do_sample=False, pad_token_id=PAD, eos_token_id=eos)
    return out[:, ids.shape[1]:].numpy()


def assert_greedy_up_to_eos(got, want, eos):
    """Each row of `got [B, G]` equals transformers' `want [B, G]` up to and including its first
    EOS, and is EOS after it (where `generate` pads)."""
    for row in range(len(want)):
        hit = np.nonzero(want[row] == eos)[0]
        end = int(hit[0]) + 1 if len(hit) else want.shape[1]
        np.testing.assert_array_equal(got[row, :end], want[row, :end])
        assert (got[row, end:] == eos).all()


VARIANTS = {"sliding": {}, "blocks": {"blocks": 1}, "multi_block": {"blocks": 2, "spawn_ratio": 0.5},
            "recycle": {"recycle": 3, "recycle_capacity": 8},
            "multi_block_recycle": {"blocks": 2, "spawn_ratio": 0.85, "recycle": 4}}


# The combined variant runs by default; each option alone is a slow test.
CASES = [(gen, window, "sliding") for gen, window in ((14, 4), (12, 16), (13, 5))] + \
        [(gen, window, "multi_block_recycle") for gen, window in ((14, 4), (13, 5))] + \
        [pytest.param(gen, window, v, marks=pytest.mark.slow) for v in ("blocks", "multi_block", "recycle")
         for gen, window in ((14, 4), (13, 5))]


@pytest.mark.parametrize("gen,window,variant", CASES)
def test_jacobi_equals_transformers_greedy(saved, gen, window, variant):
    from jaxdllm.decoding.policies import Jacobi

    hf, path = saved
    model = jaxdllm.from_pretrained(path, pad_token_id=PAD)
    ids, mask, _ = prompts([3, 9, 6], seed=gen, vocab=hf.config.vocab_size)
    want = hf_greedy(hf, ids, mask, gen)
    config = SamplerConfig(policy=Jacobi(**VARIANTS[variant]), gen_length=gen, window=window, prompt_bucket=8)
    out = jaxdllm.generate(model, ids, config, attention_mask=mask, key=jax.random.PRNGKey(gen))
    width = ids.shape[1]
    np.testing.assert_array_equal(out.tokens[:, width:], want)
    np.testing.assert_array_equal(out.tokens[:, :width], ids)
    assert (out.nfe <= gen).all() and (out.nfe >= -(-gen // window)).all()
    steps = out.commit_step[:, width:]
    assert (np.diff(steps, axis=1) >= 0).all() and (steps.max(1) == out.nfe).all()  # decided left to right


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_recycling_accepts_repeated_spans_in_fewer_forwards(saved):
    """Random tiny models fall into loops; the pool offers the loop's continuation back, so the
    same greedy tokens come in fewer forwards (multi-block on top changes no token either)."""
    from jaxdllm.decoding.policies import Jacobi

    hf, path = saved
    model = jaxdllm.from_pretrained(path, pad_token_id=PAD)
    gen = 32
    ids, mask, _ = prompts([3, 9, 6], seed=gen, vocab=hf.config.vocab_size)
    want = hf_greedy(hf, ids, mask, gen)
    nfe = {}
    for name, policy in (("plain", Jacobi()), ("recycle", Jacobi(recycle=4)),
                         ("both", Jacobi(blocks=2, spawn_ratio=0.5, recycle=4))):
        out = jaxdllm.generate(model, ids, SamplerConfig(policy=policy, gen_length=gen, window=4, prompt_bucket=8),
                               attention_mask=mask)
        np.testing.assert_array_equal(out.tokens[:, ids.shape[1]:], want)
        nfe[name] = out.nfe
    assert nfe["recycle"].sum() < 0.8 * nfe["plain"].sum(), nfe
    assert (nfe["both"] <= nfe["plain"]).all(), nfe


def test_jacobi_stops_rows_at_their_eos(saved):
    hf, path = saved
    gen = 16
    ids, mask, _ = prompts([4, 7], seed=3, vocab=hf.config.vocab_size)
    plain = hf_greedy(hf, ids, mask, gen)
    eos = int(plain[0, 5])  # a token row 0 emits mid-answer becomes EOS
    want = hf_greedy(hf, ids, mask, gen, eos=eos)
    model = jaxdllm.from_pretrained(path, pad_token_id=PAD, eos_token_id=eos)
    out = jaxdllm.generate(model, ids, SamplerConfig(policy="jacobi", gen_length=gen, window=6,
                                                     prompt_bucket=8, stop_at_eos=True), attention_mask=mask)
    assert_greedy_up_to_eos(out.tokens[:, ids.shape[1]:], want, eos)
    first = int(np.nonzero(want[0] == eos)[0][0])
    assert out.nfe[0] <= first + 1 < gen  # row 0 stopped at its EOS


def test_jacobi_is_one_compiled_loop_and_refuses_diffusion_models(saved):
    from flax import nnx

    from jaxdllm.decoding import loop, sampler

    _, path = saved
    model = jaxdllm.from_pretrained(path, pad_token_id=PAD)
    config = SamplerConfig(policy="jacobi", gen_length=8, window=4, prompt_bucket=8)
    ids, mask, _ = prompts([3, 5], seed=1, vocab=model.config.vocab_size)
    graphdef, params = nnx.split(model)
    for c in (config, SamplerConfig.preset("jacobi-forcing", gen_length=8, window=4, prompt_bucket=8, stop_at_eos=False)):
        prep = sampler.prepare(model.config, ids, mask, c)
        text = str(jax.make_jaxpr(lambda p: loop.decode(graphdef, p, prep.ids, prep.seg, prep.valid,
                                                        jax.random.PRNGKey(0), canvas=c.canvas, lay=prep.lay,
                                                        config=c))(params))
        assert text.count("while[") == 1 and "callback" not in text
    llada = jaxdllm.Transformer(jaxdllm.ModelConfig.preset("tiny-llada"), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="decodes causal models; the model's attention is 'bidirectional'"):
        jaxdllm.generate(llada, ids, config)
    with pytest.raises(ConfigError, match="greedy"):
        SamplerConfig(policy="jacobi", temperature=0.5)
    with pytest.raises(ConfigError, match="own exact KV cache"):
        SamplerConfig(policy="jacobi", cache="dual")
    from jaxdllm.decoding.policies import Jacobi
    for bad, match in (({"window": 0}, "window must be"), ({"blocks": -1}, "blocks must be"),
                       ({"spawn_ratio": 0.0}, "spawn_ratio"),
                       ({"recycle": 4, "recycle_capacity": 2}, "recycle_capacity")):
        with pytest.raises(ConfigError, match=match):
            SamplerConfig(policy=Jacobi(**bad))


def test_the_draft_window_is_the_policys_own_setting_not_block_length():
    """`block_length` is the diffusion block only: on a draft-and-verify policy it is an error that
    names the policy's setting; Jacobi's window is `window`, which has one owner, and a new
    `gen_length` keeps the published window, at most the canvas."""
    from jaxdllm.decoding.config import setting_owners

    with pytest.raises(ConfigError, match=r"^block_length is the diffusion block; policy 'jacobi' decodes without "
                                          r"blocks: set its draft window with window=16$"):
        SamplerConfig(policy="jacobi", block_length=16)
    with pytest.raises(ConfigError, match="policy 'lookahead' decodes without blocks: drop block_length"):
        SamplerConfig.preset("lookahead", block_length=4)
    with pytest.raises(ConfigError, match="window=4"):
        SamplerConfig.preset("jacobi-forcing", gen_length=8, block_length=4)
    assert setting_owners()["window"] == ("policy", "policy 'jacobi'")
    # `window` is a policy's own setting wherever it appears (WeDLM's streaming window too), never the loop's
    assert [name for name, cls in jaxdllm.decoding.POLICIES.items() if "window" in cls.settings()] == ["jacobi",
                                                                                                      "wedlm"]

    jacobi = SamplerConfig.preset("jacobi")
    assert (jacobi.window, jacobi.block_length) == (16, 128)  # block_length: the loop's default, unused
    assert SamplerConfig.preset("jacobi", gen_length=48).window == 16  # the published window
    assert SamplerConfig.preset("jacobi", gen_length=8).window == 8  # at most the canvas
    assert jacobi.resized(64).window == 16 and jacobi.resized(4).window == 4
    assert SamplerConfig.preset("jacobi-forcing", gen_length=32).window == 32
    assert SamplerConfig.preset("jacobi", gen_length=8, window=4).window == 4  # an explicit window stays
    assert SamplerConfig.preset("jacobi", gen_length=8).resized(64).window == 8  # the window it was given
    assert SamplerConfig.preset("lookahead", gen_length=8).block_length == 128


def test_tokens_accepted_past_eos_in_the_same_window_become_eos(saved):
    """A window can reach its fixed point beyond an EOS. With the greedy answer itself as the first
    draft, one step accepts the whole window, EOS and the tokens after it; with `stop_at_eos` nothing
    after the first EOS may keep another token, and the row ends after that one forward."""
    import dataclasses

    from jaxdllm.decoding.policies import Jacobi

    @dataclasses.dataclass(frozen=True)
    class OracleDraft(Jacobi):  # the first draft is given (a tuple of rows: hashable, static)
        draft: tuple = ()
        name = "test_oracle_draft"

        def initial_draft(self, prompt, seg, length, key):
            return jax.numpy.asarray(self.draft, jax.numpy.int32)

    hf, path = saved
    gen = 12
    ids, mask, _ = prompts([3, 6], seed=7, vocab=hf.config.vocab_size)
    plain = hf_greedy(hf, ids, mask, gen)
    # EOS: a token that first appears in a row with other tokens after it (which must not survive)
    row, eos = next((r, int(t)) for r in range(len(plain)) for i, t in enumerate(plain[r])
                    if t not in plain[r, :i] and (plain[r, i + 1:] != t).any())
    model = jaxdllm.from_pretrained(path, pad_token_id=PAD, eos_token_id=eos)
    policy = OracleDraft(draft=tuple(map(tuple, plain.tolist())))
    out = jaxdllm.generate(model, ids, SamplerConfig(policy=policy, gen_length=gen, window=gen,
                                                     prompt_bucket=8, stop_at_eos=True), attention_mask=mask)
    got = out.tokens[row, ids.shape[1]:]
    end = int(np.argmax(plain[row] == eos)) + 1
    np.testing.assert_array_equal(got[:end], plain[row, :end])
    assert (got[end:] == eos).all(), got
    assert out.nfe[row] == 1


def test_jacobi_compiles_once_per_prompt_bucket(saved, compiles):
    _, path = saved
    model = jaxdllm.from_pretrained(path, pad_token_id=PAD)
    config = SamplerConfig.preset("jacobi-forcing", gen_length=8, window=4, prompt_bucket=8, stop_at_eos=False)
    ids_a, mask_a, _ = prompts([3, 5], seed=4, vocab=model.config.vocab_size)
    ids_b, mask_b, _ = prompts([2, 7], seed=5, vocab=model.config.vocab_size)  # other lengths, the same 8-token bucket
    ids_c, mask_c, _ = prompts([9, 4], seed=6, vocab=model.config.vocab_size)  # the next bucket
    jaxdllm.generate(model, ids_a, config, attention_mask=mask_a)
    compiles.clear()
    jaxdllm.generate(model, ids_b, config, attention_mask=mask_b)
    assert not compiles, compiles
    jaxdllm.generate(model, ids_c, config, attention_mask=mask_c)
    assert compiles  # a new bucket is a new shape


def test_window_one_at_a_temperature_is_ancestral_sampling(saved):
    """Jacobi with a window of 1 samples each token from softmax(logits / T) (transformers' logits of
    the prompt): the first generated token's frequencies over 4096 rows fit that distribution (chi-squared);
    wider windows stay greedy-only."""
    hf, path = saved
    model = jaxdllm.from_pretrained(path, pad_token_id=PAD)
    ids, mask, _ = prompts([5], seed=3, vocab=model.config.vocab_size)
    rows, temperature = 4096, 0.8
    config = SamplerConfig(policy="jacobi", window=1, gen_length=1, temperature=temperature, prompt_bucket=8,
                           stop_at_eos=False)
    out = jaxdllm.generate(model, np.repeat(ids, rows, 0), config, attention_mask=np.repeat(mask, rows, 0),
                           key=jax.random.key(7))
    with torch.no_grad():
        logits = hf(input_ids=torch.as_tensor(ids, dtype=torch.long)).logits[0, -1].double().numpy()
    p = np.exp((logits - logits.max()) / temperature)
    p /= p.sum()
    counts = np.bincount(np.asarray(out.generated)[:, 0], minlength=len(p))
    big = p * rows >= 5  # bins with enough expected counts; the rest pooled
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(p[big] * rows, p[~big].sum() * rows)
    keep = expected > 0
    chi2 = (((observed - expected) ** 2)[keep] / expected[keep]).sum()
    dof = keep.sum() - 1
    assert dof >= 5 and chi2 < dof + 6 * np.sqrt(2 * dof), (chi2, dof)
    with pytest.raises(ConfigError, match="greedy"):
        SamplerConfig(policy="jacobi", window=2, temperature=0.5)
