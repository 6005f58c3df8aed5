"""GenMol's MDLM objective (`mdlm`) against a numpy computation of the published loss, its antithetic
times and masking rates, and the parameter moving average (`[optim] ema_decay`) against MDLM's
update rule written out step by step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdllm.errors import ConfigError
from jaxdllm.models.config import ModelConfig
from jaxdllm.train.ema import ema_from, parameter_ema
from jaxdllm.train.objectives import Views, make_objective
from jaxdllm.train.objectives.mdlm import antithetic_times

MASK, PAD, V = 4, 3, 12


def _config(**kw):
    return ModelConfig.preset("tiny-llada", vocab_size=V, mask_token_id=MASK, pad_token_id=PAD, bos_token_id=1,
                              eos_token_id=2, eot_token_id=None, **kw)


def _batch(rng):
    lengths = [9, 5, 12, 7]
    tokens = np.full((4, 12), PAD, np.int32)
    seg = np.zeros((4, 12), np.int32)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(5, V, n)
        tokens[i, 0], tokens[i, n - 1] = 1, 2
        seg[i, :n] = 1
    return {"tokens": jnp.asarray(tokens), "segment_ids": jnp.asarray(seg),
            "positions": jnp.asarray(np.tile(np.arange(12), (4, 1)) * (seg > 0)),
            "prompt_mask": jnp.zeros((4, 12), bool), "target_mask": jnp.asarray(seg > 0)}


def test_the_loss_is_the_published_global_mean_of_nll_over_t():
    rng = np.random.default_rng(0)
    batch, table = _batch(rng), rng.normal(size=(12, V)).astype(np.float32) * 3
    seen = {}

    def student(tokens, positions, mask):  # logits depend on the position and on whether the input is MASK
        seen["noisy"] = np.asarray(tokens)
        return jnp.asarray(table)[None] + (tokens == MASK)[..., None] * 0.5

    objective = make_objective("mdlm", {}, _config(attention="bidirectional"))
    key = jax.random.key(3)
    loss, metrics = objective(Views(student=student, config=_config(attention="bidirectional")), batch, key)
    _, t = objective.noise(batch["segment_ids"] > 0, key)
    noisy, tokens, t = seen["noisy"], np.asarray(batch["tokens"]), np.asarray(t)[:, 0].astype(np.float64)
    real = np.asarray(batch["segment_ids"]) > 0
    total = 0.0
    for b in range(4):
        for i in range(12):
            if noisy[b, i] != MASK:
                continue
            assert real[b, i]  # PAD is never masked
            logits = table[i].astype(np.float64) + 0.5
            logits[MASK] = -1e6
            logp = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
            total += -logp[tokens[b, i]] / t[b]
    assert (noisy != MASK).any() and (noisy == MASK).any()
    np.testing.assert_allclose(float(loss), total / real.sum(), rtol=1e-5)
    assert int(metrics["masked_tokens"]) == int((noisy == MASK).sum())


def test_times_are_antithetic_and_rows_are_masked_at_their_rate():
    t = np.sort(np.asarray(antithetic_times(jax.random.key(0), 64, 1e-3)))
    np.testing.assert_allclose(np.diff(t), (1 - 1e-3) / 64, rtol=1e-4)
    assert 1e-3 <= t[0] and t[-1] < 1
    objective = make_objective("mdlm")
    real = jnp.ones((8, 4000), bool).at[:, -100:].set(False)
    masked, t = objective.noise(real, jax.random.key(1))
    rate = np.asarray(masked[:, :-100].mean(1))
    np.testing.assert_allclose(rate, (1 - 1e-3) * np.asarray(t)[:, 0], atol=0.03)
    assert not np.asarray(masked[:, -100:]).any()


def test_mdlm_refuses_causal_and_shifted_models_and_bad_settings():
    with pytest.raises(ConfigError, match="bidirectional"):
        make_objective("mdlm", {}, _config(attention="causal"))
    with pytest.raises(ConfigError, match="shift"):
        make_objective("mdlm", {}, _config(attention="bidirectional", shift_logits=True))
    with pytest.raises(ConfigError, match="eps"):
        make_objective("mdlm", {"eps": 1.5})


def test_the_parameter_average_follows_mdlms_warm_up_rule():
    tx = optax.chain(optax.sgd(0.1), parameter_ema(0.9))
    params = {"w": jnp.array([1.0, -2.0])}
    state = tx.init(params)
    shadow = np.array([1.0, -2.0])
    for n in range(1, 30):
        grads = {"w": jnp.array([0.3 * n, -0.1])}
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        decay = min(0.9, (1 + n) / (10 + n))  # MDLM's ExponentialMovingAverage.update
        shadow = shadow - (1 - decay) * (shadow - np.asarray(params["w"]))
        np.testing.assert_allclose(np.asarray(ema_from(state)["w"]), shadow, rtol=1e-6)
