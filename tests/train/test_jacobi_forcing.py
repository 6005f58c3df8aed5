"""Jacobi Forcing and CLLM: the packed `prompt, noisy_0, clean_0, ...` rows under the
`jacobi_forcing` mask against plain causal forwards of `prompt + clean` and `prompt + noisy`, the
loss written out pair by pair from those plain forwards (numpy), and the choice of noisy states."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdllm import ConfigError, MaskSpec, ModelConfig
from jaxdllm.data import BatchConfig, BatchIterator, SpecialIds
from jaxdllm.train.distill.trajectories import (Trajectory, noise_ratios, pack, progressive_noisy,
                                                  trajectory_examples)
from jaxdllm.train.objectives import Views, make_objective
from jaxdllm.train.objectives.jacobi_forcing import packed_mask, stream_layout
from support.forward import forward
from support.models import tiny_model

N = 4
EOS, PAD = 254, 0


@pytest.fixture(scope="module")
def model():
    return tiny_model("tiny-qwen2", seed=3, head_scale=10.0, shared=True,  # peaked logits
                      eos_token_id=EOS, pad_token_id=PAD)


def rows(seed=0):
    """Two packed rows of different prompt lengths and block counts, batched with padding."""
    rng = np.random.default_rng(seed)
    out = []
    for p, blocks in ((5, 2), (3, 3)):
        prompt = rng.integers(4, 200, p)
        clean = rng.integers(4, 200, (blocks, N))
        noisy = clean.copy()
        noisy[0, 2:] = rng.integers(4, 200, N - 2)      # diverges at offset 2
        if blocks > 2:
            noisy[2] = rng.integers(4, 200, N)          # diverges at offset 0 (or later, by chance)
        out.append((prompt, noisy, clean))
    examples = [pack(p, n, c) for p, n, c in out]
    config = BatchConfig(seq_len=28, batch_size=2, shuffle=False, fill_with_eos=False)
    batch = next(BatchIterator(examples, config, SpecialIds(pad=PAD, bos=None, eos=EOS)))
    return out, {k: jnp.asarray(v) for k, v in batch.items()}


def plain(model, ids):
    ids = jnp.asarray(np.asarray(ids)[None], jnp.int32)
    return np.asarray(forward(model, ids, attention=MaskSpec(kind="causal")).logits[0], np.float64)


def run_objective(objective, model, batch):
    """`objective(views of model, batch, key 0)` compiled: eager op-by-op dispatch is what costs
    time on a CPU."""
    @nnx.jit
    def call(model, batch, key):
        return objective(Views(student=lambda t, p, m: model(t, p, m).logits, config=model.config), batch, key)

    return call(model, batch, jax.random.PRNGKey(0))


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_packed_streams_equal_plain_causal_forwards(model):
    parts, batch = rows()
    logits = np.asarray(forward(model, batch["tokens"], batch["positions"], packed_mask(batch, N)).logits)
    for r, (prompt, noisy, clean) in enumerate(parts):
        p, blocks = len(prompt), len(clean)
        want_clean = plain(model, np.concatenate([prompt, clean.reshape(-1)]))
        want_noisy = plain(model, np.concatenate([prompt, noisy.reshape(-1)]))
        np.testing.assert_allclose(logits[r, :p], want_clean[:p], atol=2e-4)
        for j in range(blocks):
            at = p + 2 * j * N
            np.testing.assert_allclose(logits[r, at:at + N], want_noisy[p + j * N:p + (j + 1) * N], atol=2e-4)
            np.testing.assert_allclose(logits[r, at + N:at + 2 * N], want_clean[p + j * N:p + (j + 1) * N], atol=2e-4)


def reference_loss(model_params_model, parts, ar_weight, temperature):
    """The loss from plain causal forwards, pair by pair (numpy float64)."""
    ce, consistency, pairs = [], 0.0, 0
    for prompt, noisy, clean in parts:
        p = len(prompt)
        lc = plain(model_params_model, np.concatenate([prompt, clean.reshape(-1)]))
        ln = plain(model_params_model, np.concatenate([prompt, noisy.reshape(-1)]))
        flat = clean.reshape(-1)
        logp = log_softmax(lc)
        ce += [-logp[p - 1 + k, flat[k]] for k in range(len(flat))]   # AR over the answer
        for j in range(len(clean)):
            pairs += 1
            differs = np.nonzero(noisy[j] != clean[j])[0]
            if not len(differs):
                continue
            span = slice(p + j * N + differs[0], p + (j + 1) * N)
            target = np.exp(log_softmax(lc[span] / temperature))
            consistency += np.mean(-(target * log_softmax(ln[span] / temperature)).sum(-1))
    ar = np.mean(ce)
    return ar_weight * ar + temperature ** 2 * consistency / pairs, ar, temperature ** 2 * consistency / pairs


@pytest.mark.parametrize("kind", ["cllm", "jacobi_forcing"])
def test_loss_equals_pairwise_reference(model, kind):
    parts, batch = rows()
    objective = make_objective(kind, {"block_length": N, "temperature": 2.0}, model.config)
    loss, metrics = run_objective(objective, model, batch)
    want, ar, cons = reference_loss(model, parts, 10.0, 2.0)
    assert cons > 0
    np.testing.assert_allclose(float(metrics["ar_loss"]), ar, rtol=1e-4)
    np.testing.assert_allclose(float(metrics["consistency_loss"]), cons, rtol=1e-4)
    np.testing.assert_allclose(float(loss), want, rtol=1e-4)
    assert int(metrics["consistency_tokens"]) == sum(N - int(np.argmax(n[j] != c[j]))
                                                    for _, n, c in parts for j in range(len(c)) if (n[j] != c[j]).any())


def test_consistency_is_zero_when_noisy_equals_clean(model):
    parts, _ = rows()
    examples = [pack(p, c, c) for p, _, c in parts]
    batch = next(BatchIterator(examples, BatchConfig(seq_len=28, batch_size=2, shuffle=False, fill_with_eos=False),
                               SpecialIds(pad=PAD, bos=None, eos=EOS)))
    objective = make_objective("jacobi_forcing", {"block_length": N}, model.config)
    _, metrics = run_objective(objective, model, {k: jnp.asarray(v) for k, v in batch.items()})
    assert float(metrics["consistency_loss"]) == 0.0 and int(metrics["consistency_tokens"]) == 0
    assert float(metrics["ar_loss"]) > 0


def test_no_gradient_flows_into_the_teacher_side(model):
    """The gradient equals the gradient of the same loss in which the clean logits of the
    consistency term come from a second model whose parameters are constants."""
    parts, batch = rows()
    objective = make_objective("jacobi_forcing", {"block_length": N, "ar_weight": 0.0}, model.config)
    graphdef, params = nnx.split(model)
    frozen = jax.tree.map(lambda x: np.asarray(x), params)

    def loss(params, teacher_params):
        mask = packed_mask(batch, N)
        s = nnx.merge(graphdef, params)(batch["tokens"], batch["positions"], mask).logits
        t = nnx.merge(graphdef, teacher_params)(batch["tokens"], batch["positions"], mask).logits
        stream, _ = stream_layout(batch["prompt_mask"].sum(1), s.shape[1], N)
        mixed = jnp.where((stream == 2)[..., None], t, s)  # clean stream (the teacher side) from the constant copy
        return objective.terms(mixed, batch)["consistency"]

    ours = jax.jit(jax.grad(lambda p: objective(Views(student=lambda t, q, m: nnx.merge(graphdef, p)(t, q, m).logits,
                                                      config=model.config), batch, jax.random.PRNGKey(0))[0]))(params)
    want = jax.jit(jax.grad(loss))(params, frozen)
    leaves = zip(jax.tree.leaves(ours), jax.tree.leaves(want))
    assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(ours)) > 0
    for a, b in leaves:
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_progressive_schedule_picks_the_closest_state():
    fixed = np.array([5, 6, 7, 8, 9, 10, 11, 12])
    states = np.array([[1, 1, 1, 1, 1, 1, 1, 1],      # ratios (1, 1)
                       [5, 6, 1, 1, 9, 1, 1, 1],      # (0.5, 0.75)
                       [5, 6, 7, 8, 9, 10, 11, 1]])   # (0, 0.25)
    t = Trajectory(np.array([1, 2]), states, fixed)
    np.testing.assert_allclose(noise_ratios(states, fixed, N), [[1, 1], [0.5, 0.75], [0, 0.25]])
    # window 3: targets (0, 0.5, 1) from the shift on
    np.testing.assert_array_equal(progressive_noisy(t, N, 2, 3, 0), [states[2, :4], states[1, 4:]])
    np.testing.assert_array_equal(progressive_noisy(t, N, 2, 3, 2), [states[0, :4], states[2, 4:]])
    # blocks after the first EOS are dropped; CLLM picks one differing state of one block
    fixed_eos = np.array([5, 6, EOS, EOS, EOS, EOS, EOS, EOS])
    t2 = Trajectory(np.array([1, 2]), np.array([[5, 1, 1, 1, 1, 1, 1, 1]]), fixed_eos)
    (row,) = trajectory_examples([t2], N, selection="progressive", eos_id=EOS, window=2, shift_schedule=False)
    assert len(row) == 2 + 2 * N
    np.testing.assert_array_equal(row.positions, [0, 1, 2, 3, 4, 5, 2, 3, 4, 5])
    (row,) = trajectory_examples([t], N, selection="one_state", eos_id=EOS, seed=1)
    noisy = row.ids[2:2 + N] if len(row) == 2 + 2 * N else row.ids[2 + 2 * N:2 + 3 * N]
    assert (noisy != row.ids[-N:]).any()


def test_config_pairs_the_objective_with_trajectory_data(tmp_path):
    from jaxdllm.train.config import TrainConfig

    base = {"model": {"preset": "tiny-qwen2"}, "data": {"source": "trajectories", "path": "t.jsonl"},
            "objective": {"kind": "jacobi_forcing", "block_length": 8}}
    TrainConfig.from_dict(base)
    with pytest.raises(ConfigError, match="does not train on trajectories"):
        TrainConfig.from_dict({**base, "objective": {"kind": "causal_lm"}})
    with pytest.raises(ConfigError, match="trains on Jacobi trajectories"):
        TrainConfig.from_dict({**base, "data": {"source": "tasks"}})
    with pytest.raises(ConfigError, match="trains causal models"):
        make_objective("cllm", {}, ModelConfig.preset("tiny-llada"))
    with pytest.raises(ConfigError, match="temperature"):
        make_objective("jacobi_forcing", {"temperature": 0})
