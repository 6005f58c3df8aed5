"""WeDLM's training objective (`wedlm`) against its published definition written out here independently
(Tencent WeDLM `finetune/src/{masking,batch,loss,trainer}.py`; arXiv 2512.22737 §4): per block a
ratio gamma_b, exactly round(n_b * gamma_b) answer tokens masked, the block laid out observed-first
with its logical positions kept, the 2-D mask of `build_2d_attention_mask` over `[x0 ; xt]`, the MLM
loss weighted by 1 / gamma_b and normalised over the batch, the clean stream's shifted AR loss, and
`(mlm + ar) / 2`. The reference forward is transformers' `Qwen2ForCausalLM` with an explicit 4-D mask
and position_ids; the noise draw (`objective.noise`) is shared, everything after it is rebuilt here.
"""

import json

import jax
import numpy as np
import pytest
from flax import nnx

import jaxdllm
from jaxdllm import ModelConfig
from jaxdllm.data import BatchConfig, build_char_tokenizer, make_batch_iterator, make_mixture
from jaxdllm.errors import ConfigError
from jaxdllm.train.objectives import Views, make_objective
from support.hf_models import make_hf_model
from support.mask_rules import brute_force
from support.optional import torch

MASK = 126  # unused by the char tokenizer (ids < 101); the tiny model's vocabulary is 128
TASKS = ("copy", "reverse", "sort", "add")
BLOCK = 6   # rows of 32: five blocks of 6 and a last one of 2; blocks straddle the prompt's end


def task_batch(seq_len=32, rows=4, seed=0):
    it = make_batch_iterator(make_mixture(TASKS, 20, seed), build_char_tokenizer(),
                             BatchConfig(seq_len=seq_len, batch_size=rows, seed=seed, pack=False, fill_with_eos=True))
    return {k: np.asarray(v) for k, v in next(it).items()}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    hf = make_hf_model("qwen2", "gqa", seed=5)
    with torch.no_grad():
        hf.lm_head.weight.mul_(10.0)  # peaked logits: the cross-entropy differs from slot to slot
    path = tmp_path_factory.mktemp("wedlm_objective")
    hf.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "mask_token_id": MASK}))
    return jaxdllm.from_pretrained(path), hf


def published_layout(tokens, masked, block):
    """One row's xt stream as the published `reorder_block` lays it out: per block, the observed
    columns ascending, then the masked ones ascending. Returns (xt tokens, logical column per slot)."""
    n = len(tokens)
    order = []
    for start in range(0, n, block):
        cols = list(range(start, min(start + block, n)))
        order += [c for c in cols if not masked[c]] + [c for c in cols if masked[c]]
    order = np.array(order)
    return np.where(masked[order], MASK, tokens[order]), order


def test_loss_equals_the_published_losses_over_transformers_qwen2(checkpoint):
    model, hf = checkpoint
    objective = make_objective("wedlm", {"block_size": BLOCK}, model.config)
    b = task_batch()
    key = jax.random.PRNGKey(11)
    graphdef, state = nnx.split(model)
    student = jax.jit(lambda t, p, m: nnx.merge(graphdef, state)(t, positions=p, attention=m).logits)
    loss, metrics = objective(Views(student=student, config=model.config), b, key)

    masked, gamma = (np.asarray(x) for x in objective.noise(b, key))
    tokens, target = b["tokens"], b["target_mask"].astype(bool)
    rows, n = tokens.shape
    assert (b["segment_ids"] == 1).all() and (b["positions"] == np.arange(n)).all()  # whole rows, positions 0..n-1
    assert masked.sum() > 10 and (masked.sum(1) < target.sum(1)).any()
    ids, pos = [], []
    for r in range(rows):
        xt, order = published_layout(tokens[r], masked[r], BLOCK)
        ids.append(np.concatenate([tokens[r], xt]))
        pos.append(np.concatenate([np.arange(n), order]))   # logical positions kept
    visible = torch.as_tensor(brute_force("wedlm", 2 * n, 2 * n, block=BLOCK))
    bias = torch.zeros(2 * n, 2 * n).masked_fill(~visible, torch.finfo(torch.float32).min)[None, None]
    with torch.no_grad():
        logits = hf(torch.as_tensor(np.array(ids)), attention_mask=bias.expand(rows, 1, -1, -1),
                    position_ids=torch.as_tensor(np.array(pos))).logits.double()
    logp = torch.log_softmax(logits, -1).numpy()

    # MLM (loss.py compute_mlm_loss, "weighted"): the masked xt slots' own logits, w = 1/(gamma+1e-8) normalised
    ce, w = [], []
    for r in range(rows):
        for slot in range(n):
            col = pos[r][n + slot]
            if masked[r, col]:
                ce.append(-logp[r, n + slot, tokens[r, col]])
                w.append(1.0 / (float(gamma[r, col]) + 1e-8))
    w = np.array(w) / np.sum(w)
    mlm = float(np.sum(np.array(ce) * w))
    # AR (compute_ar_loss): logits[:-1] of the clean stream against labels[1:], the prompt's labels -100
    ar = np.mean([-logp[r, i - 1, tokens[r, i]] for r in range(rows) for i in range(1, n) if target[r, i]])
    np.testing.assert_allclose(float(metrics["mlm_loss"]), mlm, rtol=1e-4)
    np.testing.assert_allclose(float(metrics["ar_loss"]), ar, rtol=1e-4)
    np.testing.assert_allclose(float(loss), (mlm + 1.0 * ar) / (1.0 + 1.0), rtol=1e-4)
    assert int(metrics["masked_tokens"]) == masked.sum()
    hits = [np.argmax(logp[r, n + s]) == tokens[r, pos[r][n + s]] for r in range(rows) for s in range(n)
            if masked[r, pos[r][n + s]]]
    np.testing.assert_allclose(float(metrics["masked_accuracy"]), np.mean(hits), atol=1e-6)


def test_each_block_masks_exactly_round_n_gamma_answer_tokens():
    """Per block: one ratio gamma_b >= 1e-8, exactly round(n_b * gamma_b) of its answer tokens masked
    (Python's round, as `sample_mask_indices`), never a prompt token; over draws every answer token is
    masked sometimes and the chosen ones vary (a random order, not the first ones)."""
    objective = make_objective("wedlm", {"block_size": 5}, ModelConfig.preset("tiny-wedlm"))
    b = task_batch(seq_len=32, rows=6, seed=1)
    target = b["target_mask"].astype(bool)
    seen, patterns = np.zeros_like(target), set()
    for seed in range(40):
        masked, gamma = (np.asarray(x) for x in objective.noise(b, jax.random.PRNGKey(seed)))
        assert not (masked & ~target).any()
        for r in range(target.shape[0]):
            for start in range(0, 32, 5):
                cols = slice(start, min(start + 5, 32))
                g = gamma[r, cols]
                assert (g == g[0]).all() and g[0] >= 1e-8 and g[0] <= 1.0
                assert masked[r, cols].sum() == round(float(target[r, cols].sum()) * float(g[0]))
        seen |= masked
        patterns.add(masked[0, 15:20].tobytes())
    np.testing.assert_array_equal(seen, target)
    assert len(patterns) > 4


def test_the_xt_stream_is_reordered_per_block_with_its_logical_positions():
    """What the model is given: `[x0 ; xt]`, each xt block observed-first then masked (each group ascending
    in logical order), every xt token at its own logical position, and the `wedlm` mask."""
    config = ModelConfig.preset("tiny-wedlm")
    objective = make_objective("wedlm", {"block_size": 7}, config)
    b = task_batch(seq_len=32, rows=4, seed=2)
    b["positions"] = b["positions"] + 3  # any logical positions: they travel with their tokens
    calls = []

    def student(tokens, positions, mask):
        calls.append((np.asarray(tokens), np.asarray(positions), mask))
        return jax.random.normal(jax.random.PRNGKey(0), tokens.shape + (config.vocab_size,))

    key = jax.random.PRNGKey(4)
    objective(Views(student=student, config=config), b, key)
    (ids, positions, mask), = calls
    masked = np.asarray(objective.noise(b, key)[0])
    tokens, n = b["tokens"], 32
    assert mask.kind == "wedlm" and mask.block_size == 7
    np.testing.assert_array_equal(ids[:, :n], tokens)
    np.testing.assert_array_equal(positions[:, :n], b["positions"])
    for r in range(tokens.shape[0]):
        cols = positions[r, n:] - 3                                    # logical column of each xt slot
        np.testing.assert_array_equal(ids[r, n:], np.where(masked[r, cols], config.mask_token_id, tokens[r, cols]))
        for start in range(0, n, 7):
            block = cols[start:start + 7]
            assert sorted(block) == list(range(start, min(start + 7, n)))     # the block's own columns
            flags = masked[r, block]
            assert (np.diff(flags.astype(int)) >= 0).all()                   # observed, then masked
            assert (np.diff(block[~flags]) > 0).all() and (np.diff(block[flags]) > 0).all()


def test_bad_settings_and_models_are_refused():
    with pytest.raises(ConfigError, match="block_size"):
        make_objective("wedlm", {"block_size": 0})
    with pytest.raises(ConfigError, match="ar_weight"):
        make_objective("wedlm", {"ar_weight": -1.0})
    with pytest.raises(ConfigError, match="needs the model's mask_token_id"):
        make_objective("wedlm", {}, ModelConfig.preset("tiny-qwen2"))
    with pytest.raises(ConfigError, match="causal"):
        make_objective("wedlm", {}, ModelConfig.preset("tiny-block-diffusion"))
