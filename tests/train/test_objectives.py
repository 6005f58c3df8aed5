"""Every training objective, on a token-shifted and an unshifted tiny model, equals the loss
written out here position by position (numpy, float64) from the model's logits on the same
noisy input. The random draw (`objective.noise`) is shared; which logit predicts which token,
the CE / p weights and the normalisers are computed independently below."""

import functools

import jax
import numpy as np
import pytest
from flax import nnx

from jaxdllm import MaskSpec, ModelConfig
from jaxdllm.data import BatchConfig, build_char_tokenizer, make_batch_iterator, make_mixture
from jaxdllm.train.objectives import Views, make_objective
from support.forward import forward
from support.models import tiny_model

TASKS = ("copy", "reverse", "sort", "add")


# peaked logits (a scaled head): CE differs from position to position
tiny = functools.partial(tiny_model, seed=1, head_scale=20.0, shared=True)


def batch(pack, seq_len=32, rows=4, seed=0):
    it = make_batch_iterator(make_mixture(TASKS, 20, seed), build_char_tokenizer(),
                             BatchConfig(seq_len=seq_len, batch_size=rows, seed=seed, pack=pack,
                                         fill_with_eos=not pack))
    return {k: np.asarray(v) for k, v in next(it).items()}


def log_probs(logits):
    x = np.asarray(logits, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def views(model):
    return Views(student=lambda t, p, m: forward(model, t, p, m).logits, config=model.config)


MODELS = {
    "unshifted": lambda: tiny("tiny-llada"),
    "shifted": lambda: tiny("tiny-dream"),
}


@pytest.mark.parametrize("shift", ["unshifted", "shifted"])
@pytest.mark.parametrize("kind", ["mdm_pretrain", "mdm_sft"])
def test_masked_diffusion_losses_equal_a_dense_computation(kind, shift):
    model = MODELS[shift]()
    config = model.config
    objective = make_objective(kind, {"eps": 1e-3}, config)
    b = batch(pack=True, rows=8)  # several examples per row: segment starts have no predictor when shifted
    key = jax.random.PRNGKey(3)
    loss, metrics = objective(views(model), b, key)

    masked, p = (np.asarray(x) for x in objective.noise(b, key, config))
    tokens, seg = b["tokens"], b["segment_ids"]
    noisy = np.where(masked, config.mask_token_id, tokens)
    spec = MaskSpec(kind=config.attention, q_segment_ids=seg, kv_segment_ids=seg)
    logp = log_probs(forward(model, noisy, b["positions"], spec).logits)
    rows, length = tokens.shape
    assert masked.sum() >= 4 and len(set(masked.nonzero()[0])) > 1
    total, wrong_alignment = 0.0, 0.0
    for r in range(rows):
        for i in range(length):
            if not masked[r, i]:
                continue
            assert seg[r, i] > 0 and (not kind.endswith("sft") or b["target_mask"][r, i])
            if config.shift_logits:  # the logit at i-1 predicts token i, inside one example only
                assert i > 0 and seg[r, i - 1] == seg[r, i]
                src = i - 1
            else:
                src = i
            weight = 1.0 / p[r, 0]
            if kind == "mdm_sft":  # per example: divided by its number of answer tokens
                answer = ((seg[r] == seg[r, i]) & b["target_mask"][r]).sum()
                if config.shift_logits:
                    starts = [j for j in range(length) if seg[r, j] == seg[r, i] and
                              (j == 0 or seg[r, j - 1] != seg[r, j]) and b["target_mask"][r, j]]
                    answer -= len(starts)
                weight /= answer
            total += -logp[r, src, tokens[r, i]] * weight
            wrong_alignment += -logp[r, i, tokens[r, i]] * weight
    if kind == "mdm_sft":
        examples = {(r, s) for r in range(rows) for s in set(seg[r][b["target_mask"][r]])}
        norm = len(examples)
    else:
        norm = (seg > 0).sum()
    np.testing.assert_allclose(float(loss), total / norm, rtol=2e-5)
    assert int(metrics["masked_tokens"]) == masked.sum()
    if config.shift_logits:  # the loss before the fix compared each logit with the wrong token
        assert abs(wrong_alignment / norm - float(loss)) > 1e-2 * float(loss)


@pytest.mark.parametrize("shift", [False, True])
def test_block_diffusion_loss_equals_a_dense_computation(shift):
    model = tiny("tiny-block-diffusion", shift_logits=shift)  # block-causal, block_size 8
    config, bs = model.config, 8
    objective = make_objective("block_diffusion", {}, config)
    b = batch(pack=False)
    key = jax.random.PRNGKey(5)
    loss, _ = objective(views(model), b, key)

    masked, p = (np.asarray(x) for x in objective.noise(b, key, config))
    tokens, seg = b["tokens"], b["segment_ids"]
    rows, n = tokens.shape
    both = np.concatenate([np.where(masked, config.mask_token_id, tokens), tokens], 1)
    seg2 = np.concatenate([seg, seg], 1)
    spec = MaskSpec(kind="block_diffusion", block_size=bs, q_segment_ids=seg2, kv_segment_ids=seg2)
    logp = log_probs(forward(model, both, np.concatenate([b["positions"]] * 2, 1), spec).logits)
    total = 0.0
    for r in range(rows):
        for i in range(n):
            if not masked[r, i]:
                continue
            if shift:
                assert i > 0
                # inside a block: the noisy stream's previous token; at a block start: the clean
                # stream's last token of the previous block (what the block-causal sampler reads)
                src = i - 1 if i % bs else n + i - 1
            else:
                src = i
            total += -logp[r, src, tokens[r, i]] / p[r, i]
    assert masked.sum() > 8
    np.testing.assert_allclose(float(loss), total / (seg > 0).sum(), rtol=2e-5)


@pytest.mark.parametrize("shift", [False, True])
def test_causal_lm_loss_equals_a_dense_computation(shift):
    model = tiny("tiny-qwen2", shift_logits=shift)  # a causal model predicts i + 1 from i either way
    objective = make_objective("causal_lm", {}, model.config)
    b = batch(pack=True)
    loss, _ = objective(views(model), b, jax.random.PRNGKey(0))
    tokens, seg, target = b["tokens"], b["segment_ids"], b["target_mask"]
    spec = MaskSpec(kind="causal", q_segment_ids=seg, kv_segment_ids=seg)
    logp = log_probs(forward(model, tokens, b["positions"], spec).logits)
    terms = [-logp[r, i - 1, tokens[r, i]] for r in range(tokens.shape[0]) for i in range(1, tokens.shape[1])
             if target[r, i] and seg[r, i] == seg[r, i - 1]]
    np.testing.assert_allclose(float(loss), np.mean(terms), rtol=2e-5)


def test_objective_settings_are_checked_by_name():
    from jaxdllm import ConfigError
    with pytest.raises(ConfigError, match=r"kind = 'causal_lm' takes no key\(s\) \['eps'\]"):
        make_objective("causal_lm", {"eps": 0.1})
    with pytest.raises(ConfigError, match="kind must be one of"):
        make_objective("mdm", {})
    with pytest.raises(ConfigError, match="needs the model's mask_token_id"):
        make_objective("mdm_sft", {}, ModelConfig.preset("tiny-qwen2"))


@pytest.mark.parametrize("kind", ["mdm_pretrain", "mdm_sft"])
def test_every_token_with_a_predictor_can_be_masked(kind):
    """With the masking probability at ~1 the drawn mask is exactly the eligible set, written out
    here: real tokens (SFT: answer tokens); for a shifted model, not the first token of an example."""
    b = batch(pack=True, rows=8)
    seg = b["segment_ids"]
    for preset in ("tiny-llada", "tiny-dream"):
        config = ModelConfig.preset(preset)
        objective = make_objective(kind, {"eps": 1 - 1e-7}, config)
        masked = np.asarray(objective.noise(b, jax.random.PRNGKey(0), config)[0])
        eligible = (seg > 0) & (b["target_mask"] if kind == "mdm_sft" else True)
        if config.shift_logits:
            eligible[:, 0] = False
            eligible[:, 1:] &= seg[:, 1:] == seg[:, :-1]
        np.testing.assert_array_equal(masked, eligible)


def test_sdar_loss_equals_a_dense_computation():
    """SDAR's conversion loss: the BD3-LM layout and mask, one masking probability per row on the
    answer tokens only, CE / p at the masked slots' own logits, over the number of answer tokens."""
    model = tiny("tiny-block-diffusion", shift_logits=False)  # block-causal, block_size 8
    config, bs = model.config, 8
    objective = make_objective("sdar", {}, config)
    b = batch(pack=False)
    key = jax.random.PRNGKey(5)
    loss, _ = objective(views(model), b, key)

    masked, p = (np.asarray(x) for x in objective.noise(b, key, config))
    tokens, seg, target = b["tokens"], b["segment_ids"], b["target_mask"]
    assert not (masked & ~target).any() and masked.any(1).all()  # answers only; every row has a masked token
    assert (p == p[:, :1]).all() and len(set(p[:, 0])) == len(p)   # one probability per row
    both = np.concatenate([np.where(masked, config.mask_token_id, tokens), tokens], 1)
    seg2 = np.concatenate([seg, seg], 1)
    spec = MaskSpec(kind="block_diffusion", block_size=bs, q_segment_ids=seg2, kv_segment_ids=seg2)
    logp = log_probs(forward(model, both, np.concatenate([b["positions"]] * 2, 1), spec).logits)
    total = sum(-logp[r, i, tokens[r, i]] / p[r, i] for r, i in zip(*masked.nonzero()))
    np.testing.assert_allclose(float(loss), total / target.sum(), rtol=2e-5)
    with pytest.raises(ValueError, match="block_causal"):
        make_objective("sdar", {}, tiny("tiny-qwen2").config.replace(mask_token_id=255))


def test_set_block_loss_equals_the_papers_equation():
    """Set Block Decoding's Eq. 14 written out: over `[x_hat ; x]` at repeated positions under the
    paper's Fig. 9 mask, the clean half's next-token terms on the answer plus the masked slots' own
    tokens, weight 1 each, one mean over all of them."""
    from support.mask_rules import brute_force

    model = tiny("tiny-qwen2")
    config = model.config.replace(mask_token_id=255)
    objective = make_objective("set_block", {"min_block": 2, "max_block": 3}, config)
    b = batch(pack=False)
    key = jax.random.PRNGKey(7)
    graphdef, state = nnx.split(model)  # a pure function of the weights: the objective calls it in lax.switch
    student = jax.jit(lambda t, p, m: nnx.merge(graphdef, state)(t, positions=p, attention=m).logits)
    loss, metrics = objective(Views(student=student, config=config), b, key)

    masked, k = objective.noise(b, key)
    masked, k = np.asarray(masked), int(k)
    tokens, seg, target = b["tokens"], b["segment_ids"], b["target_mask"]
    rows, n = tokens.shape
    assert 2 <= k <= 3 and not (masked & ~target).any() and masked.sum() > 8
    both = np.concatenate([np.where(masked, 255, tokens), tokens], 1)
    seg2 = np.concatenate([seg, seg], 1)
    # the blocks of each row start at its first answer token (where decoding puts them)
    answer = np.array([int(np.nonzero(target[r])[0][0]) for r in range(rows)])
    assert len(set(answer)) > 1
    spec = MaskSpec(kind="set_block", block_size=k, prefix_len=answer, q_segment_ids=seg2, kv_segment_ids=seg2)
    dense = np.asarray(spec.dense(2 * n, 2 * n))
    for r in range(rows):
        other = seg2[r][:, None] != seg2[r][None]
        np.testing.assert_array_equal(dense[r] | other, brute_force("set_block", 2 * n, 2 * n, block=k,
                                                                    prefix=answer[r]) | other)
    logp = log_probs(forward(model, both, np.concatenate([b["positions"]] * 2, 1), spec).logits)
    terms = [-logp[r, n + i - 1, tokens[r, i]] for r in range(rows) for i in range(1, n)
             if target[r, i] and seg[r, i] == seg[r, i - 1]]                       # NTP: x_i from x_<i
    terms += [-logp[r, i, tokens[r, i]] for r, i in zip(*masked.nonzero())]        # masked slots: their own token
    np.testing.assert_allclose(float(loss), np.mean(terms), rtol=2e-5)
    assert int(metrics["masked_tokens"]) == masked.sum()
    with pytest.raises(ValueError, match="causal"):
        make_objective("set_block", {}, tiny("tiny-block-diffusion").config)
