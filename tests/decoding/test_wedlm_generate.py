"""WeDLM's streaming decoding in jaxdllm's compiled loop (`wedlm_canvas.py`, preset `wedlm`) against the
published procedure written independently as a PyTorch loop with NO cache over transformers' Qwen3
(`sampling/torch_reference/wedlm.py`: every forward recomputes the prompt, the committed text and the
reordered window from scratch), on a tiny random checkpoint in WeDLM's released format
(`tests/support/sdar_checkpoint.py`: `model_type` "wedlm", `mask_token_id` null, the mask named by
its tokenizer_config.json).

Prompts of 5, 8, 11 and 14 tokens, 22 generated, in one ragged batch (and each alone for one setting).
Equal per row: the tokens up to and including EOS, the forward that filled each token
(jaxdllm's `commit_step`: every step's selection, which reads entropies against the threshold, so a
prefix cache that drifted from the uncached forward would show), and `nfe` = the reference's
forwards - 1 (its last forward only commits). The settings cover steps that fill several masks,
one mask per step, and rows that stop at EOS.
"""

import numpy as np
import pytest

import jaxdllm
from support.optional import lazy
from support.sampler_fixtures import prompts
from support.sdar_checkpoint import EOS, MASK, PROMPT_VOCAB, make_wedlm_checkpoint

wedlm_reference = lazy("sampling.torch_reference.wedlm")

LENGTHS = [5, 8, 11, 14]
GEN = 22
CHECKPOINT = dict(seed=7, weight_std=0.8, head_scale=7.0, eos_scale=1.0)
# (window, entropy threshold, distance penalty): the preset's rule on a small window, one mask per step,
# and a high threshold (many masks per step)
SETTINGS = [(8, 0.4, 0.02), (4, 0.0, 0.1), (6, 1.5, 0.02)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("wedlm")
    hf = make_wedlm_checkpoint(path, **CHECKPOINT)
    return jaxdllm.from_pretrained(path), hf, path


@pytest.fixture(scope="module")
def batch():
    return prompts(LENGTHS, seed=3, vocab=PROMPT_VOCAB)


def decode(model, ids, mask, window, tau, penalty):
    config = jaxdllm.SamplerConfig.preset("wedlm", gen_length=GEN, window=window, entropy_threshold=tau,
                                          pos_penalty=penalty)
    return jaxdllm.generate(model, ids, attention_mask=mask, config=config)


def test_mask_token_comes_from_the_tokenizer(checkpoint):
    model, _, path = checkpoint
    assert model.config.model_type == "wedlm" and model.config.mask_token_id == MASK
    assert jaxdllm.sampler_defaults(path).policy.name == "wedlm"


@pytest.mark.parametrize("window,tau,penalty", SETTINGS)
def test_decodes_as_the_published_procedure_without_a_cache(checkpoint, batch, window, tau, penalty):
    model, hf, _ = checkpoint
    ids, mask, rows = batch
    out = decode(model, ids, mask, window, tau, penalty)
    want = wedlm_reference.generate(hf, [list(map(int, r)) for r in rows], mask_id=MASK, eos_id=EOS,
                                    gen_length=GEN, window=window, threshold=tau, pos_penalty=penalty)
    fills = []
    for i in range(len(rows)):
        n = len(want.tokens[i])
        answer = np.asarray(out.tokens)[i, out.prompt_len:]
        assert answer[:n].tolist() == want.tokens[i], f"row {i}"
        steps = np.asarray(out.commit_step)[i, out.prompt_len:out.prompt_len + n]
        assert steps.tolist() == want.fill_forward[i], f"row {i}"
        assert int(out.nfe[i]) == want.forwards[i] - 1, f"row {i}"
        fills.append(np.bincount(steps, minlength=int(out.nfe[i]) + 1)[1:])
    most = max(int(f.max()) for f in fills)
    if tau == 0.0:
        assert most == 1  # one mask per step
    else:
        assert most >= 3  # the comparison covers steps that fill several masks
    if (window, tau) == SETTINGS[0][:2]:
        assert any(len(t) < GEN for t in want.tokens) and any(len(t) == GEN for t in want.tokens)


def test_rows_decode_as_alone(checkpoint, batch):
    model, _, _ = checkpoint
    ids, mask, rows = batch
    window, tau, penalty = SETTINGS[2]
    together = decode(model, ids, mask, window, tau, penalty)
    for i, row in enumerate(rows):
        alone = decode(model, np.asarray(row)[None].astype(np.int32), None, window, tau, penalty)
        np.testing.assert_array_equal(np.asarray(alone.tokens)[0, alone.prompt_len:],
                                      np.asarray(together.tokens)[i, together.prompt_len:])
        assert int(alone.nfe[0]) == int(together.nfe[i])
