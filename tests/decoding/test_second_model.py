"""Two models in one compiled loop: a masked-diffusion drafter for a causal model (`spec_diffusion`:
SpecDiff / DiffuSpec) and a small causal model steering a diffusion model (`apd`).

Checked against independent references: transformers' greedy `generate` (greedy speculative
decoding; APD at R = 0 is the small model's greedy decoding), the target's own next-token
distribution computed by a plain forward (a chi-squared test of speculative sampling, which the
drafter's own samples fail), and one plain forward's argmax (APD at R = 1 accepts each window whole).
"""

from __future__ import annotations

import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

import jaxdllm
from jaxdllm.attention import MaskSpec
from jaxdllm.data import make_mixture
from jaxdllm.decoding import SamplerConfig
from jaxdllm.decoding.second_model import check_pair
from jaxdllm.errors import ConfigError
from jaxdllm.eval.runner import left_pad
from jaxdllm.shipped import checkpoint_dir
from jaxdllm.tokenizer import Tokenizer
from support.forward import forward
from support.models import tiny_model
from support.optional import torch, transformers
from test_jacobi import assert_greedy_up_to_eos
from test_tree_drafts import hf_greedy_eos

CAUSAL = checkpoint_dir("tasks-qwen2-small")
DIFFUSION = checkpoint_dir("tasks-llada-small")


@pytest.fixture(scope="module")
def pair():
    tok = Tokenizer.from_pretrained(CAUSAL)
    hf = transformers.AutoModelForCausalLM.from_pretrained(CAUSAL, dtype=torch.float32).eval()
    examples = make_mixture(["copy_long", "reverse", "sort", "add"], 2, 98, split="test")
    ids, mask = left_pad([tok.encode(e.prompt) for e in examples], 0)
    return jaxdllm.from_pretrained(CAUSAL), jaxdllm.from_pretrained(DIFFUSION, dtype="float32"), hf, ids, mask


@pytest.mark.parametrize("preset", ["specdiff", pytest.param("diffuspec", marks=pytest.mark.slow)])
def test_speculative_decoding_with_the_shipped_drafter_equals_transformers_greedy(pair, preset):
    target, _, hf, ids, mask = pair
    gen, eos = 24, target.config.eos_token_id
    config = SamplerConfig.preset(preset, gen_length=gen)
    drafter = jaxdllm.policy_params(CAUSAL, config)  # companions.json names it; tokenizers checked
    out = jaxdllm.generate(target, ids, config, attention_mask=mask, policy_params=drafter)
    assert_greedy_up_to_eos(np.asarray(out.tokens)[:, ids.shape[1]:], hf_greedy_eos(hf, ids, mask, gen, eos, 0), eos)
    answer = (np.asarray(out.tokens)[:, ids.shape[1]:] != eos).sum(1) + 1
    # the shipped drafter writes what the causal model writes on the one-answer tasks (4.06 tokens
    # per forward on these 8 rows, 4.64 with the beams; the card's tables: 50 prompts per task)
    assert answer.sum() / np.asarray(out.nfe).sum() >= 4.0


def test_apd_at_the_ends_of_the_mixture(pair):
    """R = 0: the small causal model's greedy output (transformers); R = 1: every window accepted whole,
    the diffusion model's argmax of one forward over the masked answer."""
    causal, diffusion, hf, ids, mask = pair
    gen, eos = 16, causal.config.eos_token_id
    small = jaxdllm.generate(diffusion, ids, SamplerConfig.preset("apd", gen_length=gen, mix=0.0),
                             attention_mask=mask, policy_params=causal)
    assert_greedy_up_to_eos(np.asarray(small.tokens)[:, ids.shape[1]:], hf_greedy_eos(hf, ids, mask, gen, eos, 0), eos)
    whole = jaxdllm.generate(diffusion, ids, SamplerConfig.preset("apd", gen_length=gen, mix=1.0, draft_window=gen,
                                                                   kv_window=64, stop_at_eos=False),
                             attention_mask=mask, policy_params=causal)
    assert (np.asarray(whole.nfe) == 1).all()
    canvas = np.concatenate([ids, np.full((len(ids), gen), diffusion.config.mask_token_id, np.int32)], 1)
    seg = np.concatenate([mask, np.ones((len(ids), gen), np.int32)], 1)
    positions = np.maximum(np.cumsum(seg, 1) - 1, 0)
    logits = forward(diffusion, jnp.asarray(canvas), jnp.asarray(positions), MaskSpec.from_padding(jnp.asarray(seg))).logits
    np.testing.assert_array_equal(np.asarray(whole.tokens)[:, ids.shape[1]:],
                                  np.argmax(np.asarray(logits)[:, ids.shape[1]:], -1))


@pytest.mark.slow  # one more compiled loop; the default run's budget
def test_apd_at_r_1_and_a_temperature_accepts_each_window_whole(pair):
    """The draft and the target share their Gumbel noise: at R = 1 they are the same sample."""
    causal, diffusion, _, ids, mask = pair
    sampled = jaxdllm.generate(diffusion, ids, SamplerConfig.preset("apd", gen_length=16, mix=1.0, draft_window=16,
                                                                     stop_at_eos=False, temperature=0.8),
                               attention_mask=mask, policy_params=causal)
    assert (np.asarray(sampled.nfe) == 1).all()


@pytest.mark.slow  # 4,000 sampled rows (~12 s): the default run's 6-minute budget; it checks greedy speculative decoding
def test_speculative_sampling_follows_the_target_distribution():
    """The first and second generated tokens of 4,000 rows, each against the target's own
    distribution (plain forwards); the drafter's own samples fail the same test. The drafter is the
    target's weights run as a bidirectional Dream model (shifted logits): its draws differ from the
    target's (overlap 0.42 on the first token), so drafts are accepted and rejected."""
    target = tiny_model("tiny-qwen2", head_scale=10.0)
    drafter = tiny_model("tiny-dream")
    nnx.update(drafter, nnx.state(target, nnx.Param))
    n, v = 4000, target.config.vocab_size
    prompt = np.asarray([[5, 17, 42]], np.int32)
    config = SamplerConfig(gen_length=2, policy="spec_diffusion", gamma=2, tokens_per_step=1, adaptive=False,
                           temperature=1.0)
    out = jaxdllm.generate(target, np.repeat(prompt, n, 0), config, policy_params=drafter, key=jax.random.PRNGKey(7))
    tokens = np.asarray(out.tokens)[:, 3:5]
    assert 1.3 < np.asarray(out.nfe).mean() < 1.9  # some first drafts accepted (2 tokens a forward), some not

    def next_probs(ids):
        return np.asarray(jax.nn.softmax(forward(target, jnp.asarray(ids)).logits[:, -1], -1), np.float64)

    first = next_probs(prompt)[0]                                                              # [V]
    second = first @ next_probs(np.concatenate([np.repeat(prompt, v, 0), np.arange(v)[:, None]], 1))  # [V]

    def chi2_pvalue(samples, probs):
        expected = probs * n
        cells = np.flatnonzero(expected >= 5)                 # the rest pooled into one cell
        obs, exp = np.bincount(samples, minlength=v)[cells], expected[cells]
        obs, exp = np.append(obs, n - obs.sum()), np.append(exp, max(n - exp.sum(), 1e-9))
        return stats.chisquare(obs, exp * n / exp.sum()).pvalue

    assert chi2_pvalue(tokens[:, 0], first) > 1e-3 and chi2_pvalue(tokens[:, 1], second) > 1e-3
    # The drafter's own draws of the first token (what a draft is before verification) fail.
    canvas = jnp.asarray(np.concatenate([prompt, [[drafter.config.mask_token_id] * 2]], 1))
    q = np.asarray(jax.nn.softmax(forward(drafter, canvas, attention=MaskSpec()).logits[0, 2]), np.float64)  # shifted
    drafts = np.random.default_rng(0).choice(v, size=n, p=q / q.sum())
    assert chi2_pvalue(drafts, first) < 1e-6


def test_a_pair_must_share_a_tokenizer(tmp_path):
    check_pair(CAUSAL, DIFFUSION, "drafter")  # the shipped models share one
    other = tmp_path / "other"
    shutil.copytree(DIFFUSION, other)
    raw = json.loads((other / "tokenizer.json").read_text())
    vocab = raw["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=re.escape(f"token {a!r} is id")):
        check_pair(CAUSAL, other, "drafter")
    with pytest.raises(ConfigError, match="shared one tokenizer|share one tokenizer"):
        jaxdllm.policy_params(CAUSAL, SamplerConfig.preset("specdiff", drafter=str(other)))


def test_second_model_errors(pair):
    target, diffusion, _, ids, mask = pair
    with pytest.raises(ConfigError, match="masked-diffusion"):
        jaxdllm.generate(target, ids, SamplerConfig.preset("specdiff", gen_length=8), attention_mask=mask,
                         policy_params=target)
    with pytest.raises(ConfigError, match="verifier must be a causal model"):
        jaxdllm.generate(diffusion, ids, SamplerConfig.preset("apd", gen_length=8), attention_mask=mask,
                         policy_params=diffusion)
    with pytest.raises(ConfigError, match="beams > 1 verifies"):
        SamplerConfig.preset("diffuspec", temperature=0.5)
    with pytest.raises(ConfigError, match="mix"):
        SamplerConfig.preset("apd", mix=1.5)
