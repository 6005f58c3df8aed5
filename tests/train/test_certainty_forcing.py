"""dParallel's certainty-forcing loss (`certainty_forcing`): the two views' masks, the blocks
after the active one, where the entropy term's gradient flows, and the loss itself against a
position-by-position numpy computation from two separate forwards (one per view)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdllm import MaskSpec, ModelConfig
from jaxdllm.data import BatchConfig, build_char_tokenizer, make_batch_iterator, make_mixture
from jaxdllm.errors import ConfigError
from jaxdllm.train.objectives import Views, make_objective
from support.forward import forward
from support.models import tiny_model

TASKS = ("copy", "reverse", "sort", "add", "perm", "pick3")


# peaked logits (a scaled head): some argmaxes hit the label
tiny = functools.partial(tiny_model, seed=1, head_scale=20.0, shared=True)


def batch(rows=8, seq_len=32, seed=0):
    it = make_batch_iterator(make_mixture(TASKS, 20, seed), build_char_tokenizer(),
                             BatchConfig(seq_len=seq_len, batch_size=rows, seed=seed))
    return {k: np.asarray(v) for k, v in next(it).items()}


def model_views(model):
    return Views(student=lambda t, p, m: forward(model, t, p, m).logits, config=model.config)


def test_views_are_complements_inside_one_block_per_row():
    config = tiny("tiny-llada").config
    objective = make_objective("certainty_forcing", {"block_length": 4}, config)
    b = batch(rows=16)
    a, bb, later = (np.asarray(x) for x in objective.views(b, jax.random.PRNGKey(0), config))
    response = b["target_mask"]
    chosen = []
    for r in range(len(response)):
        idx = np.flatnonzero(response[r])                       # the row's response, in order
        active = a[r] | bb[r]
        assert not (a[r] & bb[r]).any()                         # complements: no position in both views
        assert not (active & ~response[r]).any() and not (later[r] & ~response[r]).any()
        on = np.flatnonzero(active[idx])                        # offsets of the active tokens in the response
        assert len(on) > 0
        block = on[0] // 4
        assert np.array_equal(on, np.arange(block * 4, min(block * 4 + 4, len(idx))))  # one whole aligned block
        assert np.array_equal(np.flatnonzero(later[r][idx]), np.arange(block * 4 + 4, len(idx)))
        chosen.append(block)
    assert len(set(chosen)) > 1                                 # drawn per row, not once per batch
    assert len({tuple(x) for x in a}) > len(a) // 2             # and the masks inside the block too


def test_whole_response_is_active_for_token_shifted_models():
    config = tiny("tiny-dream").config
    objective = make_objective("certainty_forcing", {}, config)
    b = batch()
    a, bb, later = (np.asarray(x) for x in objective.views(b, jax.random.PRNGKey(1), config))
    np.testing.assert_array_equal(a | bb, b["target_mask"])
    assert not later.any()
    assert objective.resolved(config) == (None, 1.0)
    assert make_objective("certainty_forcing", {}, tiny("tiny-llada").config).resolved(
        tiny("tiny-llada").config) == (32, 2.0)


def test_later_blocks_carry_no_loss():
    model = tiny("tiny-llada")
    config = model.config
    objective = make_objective("certainty_forcing", {"block_length": 4}, config)
    b = batch()
    key = jax.random.PRNGKey(2)
    _, _, later = (np.asarray(x) for x in objective.views(b, key, config))
    assert later.sum() > 10
    loss, _ = objective(model_views(model), b, key)
    changed = dict(b, tokens=np.where(later, (b["tokens"] + 7) % config.vocab_size, b["tokens"]))
    loss2, _ = objective(model_views(model), changed, key)
    np.testing.assert_allclose(float(loss2), float(loss), rtol=1e-6)   # neither their inputs nor their labels count
    seen = []
    probe = Views(student=lambda t, p, m: seen.append(np.asarray(t)) or forward(model, t, p, m).logits,
                  config=config)
    objective(probe, b, key)
    (noisy,) = seen
    assert (noisy[:len(later)][later] == config.mask_token_id).all()  # masked in view A ...
    assert (noisy[len(later):][later] == config.mask_token_id).all()  # ... and in view B


def test_entropy_gradient_flows_only_where_the_argmax_is_right():
    config = ModelConfig.preset("tiny-llada", vocab_size=16, mask_token_id=3, eos_token_id=2, eot_token_id=None,
                                 bos_token_id=1, pad_token_id=0)
    rows, length, vocab = 4, 12, 16
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, vocab, (rows, length)).astype(np.int32)
    target = np.zeros((rows, length), bool)
    target[:, 4:] = True
    b = {"tokens": tokens, "prompt_mask": ~target, "target_mask": target,
         "segment_ids": np.ones((rows, length), np.int32),
         "positions": np.tile(np.arange(length, dtype=np.int32), (rows, 1))}
    # Logits as the trained parameters, one table per view: half the positions predict their label.
    logits = rng.normal(size=(2 * rows, length, vocab)).astype(np.float32)
    right_here = rng.random((2 * rows, length)) < 0.5
    both_tokens = np.concatenate([tokens, tokens])
    for r in range(2 * rows):
        for i in range(length):
            row = logits[r, i]
            row[both_tokens[r, i]] = row.max() + 1.0 if right_here[r, i] else row.min() - 1.0
    key = jax.random.PRNGKey(4)

    def loss_with(weight):
        objective = make_objective("certainty_forcing",
                                   {"block_length": 8, "active": "response", "entropy_weight": weight}, config)

        def f(table):
            return objective(Views(student=lambda t, p, m: table, config=config), b, key)[0]
        return jax.grad(f)(jnp.asarray(logits))

    entropy_grad = np.asarray(loss_with(2.0) - loss_with(0.0))  # the certainty term's own gradient
    objective = make_objective("certainty_forcing", {"active": "response"}, config)
    a, bb, _ = (np.asarray(x) for x in objective.views(b, key, config))
    masked = np.concatenate([a, bb])
    flows = np.abs(entropy_grad).sum(-1) > 0
    assert flows.any()
    np.testing.assert_array_equal(flows, masked & right_here)


@pytest.mark.parametrize("preset,views,ratio", [("tiny-llada", 2, "fixed"), ("tiny-dream", 2, "fixed"),
                                                ("tiny-llada", 1, "fixed"), ("tiny-llada", 2, "uniform")])
def test_loss_equals_a_dense_computation(preset, views, ratio):
    model = tiny(preset)
    config = model.config
    settings = {"block_length": 8, "temperature": 0.5, "num_views": views, "mask_ratio": ratio}
    objective = make_objective("certainty_forcing", settings, config)
    b = batch(rows=8)
    key = jax.random.PRNGKey(7)
    # The model's logits plus a fixed push towards the label at half the positions, so that the
    # certainty term (argmax == label only) has positions to average over.
    push = np.zeros(b["tokens"].shape + (config.vocab_size,), np.float32)
    rows_, cols = np.nonzero(np.random.default_rng(0).random(b["tokens"].shape) < 0.5)
    push[rows_, cols, b["tokens"][rows_, cols]] = 40.0
    if config.shift_logits:  # the logit at i-1 predicts token i
        push = np.concatenate([push[:, 1:], push[:, :1]], axis=1)

    def student(t, p, m):
        return forward(model, t, p, m).logits + np.tile(push, (len(t) // len(push), 1, 1))

    loss, metrics = objective(Views(student=student, config=config), b, key)

    views = [np.asarray(x) for x in objective.views(b, key, config)]
    masks, later = views[:2], views[2]
    masks = masks[:settings["num_views"]]                           # one view: view A alone
    tokens, seg = b["tokens"], b["segment_ids"]
    spec = MaskSpec(kind=config.attention, q_segment_ids=seg, kv_segment_ids=seg)
    weight = 1.0 if config.shift_logits else 2.0
    total = 0.0
    for m in masks:                                             # one separate forward per view
        noisy = np.where(m | later, config.mask_token_id, tokens)
        x = np.asarray(student(noisy, b["positions"], spec), np.float64)
        ce, ent = [], []
        for r, i in zip(*np.nonzero(m)):
            src = i - 1 if config.shift_logits else i          # the logit that predicts token i
            row = x[r, src]
            logp = row - row.max() - np.log(np.exp(row - row.max()).sum())
            ce.append(-logp[tokens[r, i]])
            q = row / 0.5
            q = np.exp(q - q.max())
            q /= q.sum()
            if row.argmax() == tokens[r, i]:
                ent.append(-(q * np.log(np.where(q > 0, q, 1.0))).sum())
        assert len(ent) > 5 and len(ent) < len(ce)
        total += np.mean(ce) + weight * np.mean(ent)
    np.testing.assert_allclose(float(loss), total, rtol=2e-5)
    assert int(metrics["masked_tokens"]) == sum(m.sum() for m in masks)


def test_settings_are_checked():
    config = tiny("tiny-llada").config
    for bad in ({"mask_prob": 1.0}, {"temperature": 0.0}, {"block_length": 0}, {"active": "all"},
                {"entropy_weight": -1.0}, {"eps": 0.1}, {"num_views": 3}, {"mask_ratio": "beta"}):
        with pytest.raises(ConfigError):
            make_objective("certainty_forcing", bad, config)
    with pytest.raises(ConfigError, match="causal"):
        make_objective("certainty_forcing", {}, ModelConfig.preset("tiny-qwen2", mask_token_id=5))


def test_uniform_mask_ratio_covers_every_ratio_with_complementary_views():
    config = tiny("tiny-llada").config
    objective = make_objective("certainty_forcing", {"block_length": 64, "mask_ratio": "uniform"}, config)
    b = batch(rows=64)
    a, bb, _ = (np.asarray(x) for x in objective.views(b, jax.random.PRNGKey(3), config))
    active = a | bb
    assert not (a & bb).any()                                   # still complements of each other
    ratio = a.sum(1) / np.maximum(active.sum(1), 1)
    assert ratio.min() < 0.15 and ratio.max() > 0.85            # fixed 0.5 would stay near the middle
    fixed = make_objective("certainty_forcing", {"block_length": 64}, config)
    a, bb, _ = (np.asarray(x) for x in fixed.views(b, jax.random.PRNGKey(3), config))
    fixed_ratio = a.sum(1) / np.maximum((a | bb).sum(1), 1)
    assert np.abs(fixed_ratio - 0.5).max() < np.abs(ratio - 0.5).max()
