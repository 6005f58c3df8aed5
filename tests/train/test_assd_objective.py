"""ASSD's joint objective (`assd`) against the published loss written out with transformers'
`XLNetLMHeadModel` on the same weights: sigma = [visible ascending | masked ascending] by argsort,
`perm_mask = sigma_i <= sigma_j` with the visible block cleared, one-hot `target_mapping` over the masked
positions, labels, mean cross-entropy. And the masking itself: the prompt stays visible, the count is
int(r * answer length), spans are contiguous, the curriculum's range."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdllm
from jaxdllm import ConfigError
from jaxdllm.data import BatchConfig, build_char_tokenizer, make_batch_iterator, make_mixture
from jaxdllm.train.objectives import Views, make_objective
from jaxdllm.train.objectives.assd import masking_range
from support.hf_models import make_hf_xlnet
from support.optional import torch


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(transformers model, jaxdllm model, a batch of 6 task rows of 32 tokens)."""
    tokenizer = build_char_tokenizer()
    path = tmp_path_factory.mktemp("xlnet")
    theirs = make_hf_xlnet(path, tokenizer.vocab_size)
    batch = next(make_batch_iterator(make_mixture(("copy", "reverse", "sort", "add"), 20, 0), tokenizer,
                                     BatchConfig(seq_len=32, batch_size=6, seed=0)))
    return theirs, jaxdllm.from_pretrained(path), {k: np.asarray(v) for k, v in batch.items()}


def _views(model, step=None):
    forward = lambda t, p, m, cache=None, **kw: model(t, positions=p, attention=m, cache=cache, **kw)  # noqa: E731
    return Views(student=None, config=model.config, forward=forward, step=step)


def _published_loss(model, tokens, masked, parallel=False):
    """The published joint loss of rows `tokens [B, L]` with `masked [B, L]` (every row the same count);
    `parallel`: the published `parallel` objective's, every masked token predicted from the visible ones."""
    b, length = tokens.shape
    k = int(masked[0].sum())
    perm = np.zeros((b, length, length), np.float32)
    mapping = np.zeros((b, k, length), np.float32)
    labels = np.zeros((b, k), np.int64)
    for r in range(b):
        visible, hidden = np.flatnonzero(~masked[r]), np.flatnonzero(masked[r])
        sigma = np.empty(length, np.int64)
        sigma[np.r_[visible, hidden]] = np.arange(length)  # rank of each position
        perm[r] = sigma[:, None] <= sigma[None, :]
        perm[r][np.ix_(visible, visible)] = 0.0
        if parallel:
            perm[r][:, hidden] = 1.0
        mapping[r, np.arange(k), hidden] = 1.0
        labels[r] = tokens[r, hidden]
    with torch.no_grad():
        out = model(torch.tensor(tokens), perm_mask=torch.tensor(perm), target_mapping=torch.tensor(mapping),
                    labels=torch.tensor(labels))
    return float(out.loss)


@pytest.mark.parametrize("infill_rate", [0.0, 1.0], ids=["subsets", "spans"])
def test_the_loss_is_the_published_joint_loss(setup, infill_rate):
    theirs, ours, batch = setup
    objective = make_objective("assd", {"final_min": 0.4, "final_max": 0.9, "infill_rate": infill_rate},
                               ours.config)
    key = jax.random.PRNGKey(3)
    loss, metrics = jax.jit(lambda b, k: objective(_views(ours), b, k))(batch, key)
    masked, _ = objective.noise(batch, key)
    masked = np.asarray(masked)
    # rows differ in how many tokens they mask: the published loss per row, weighted by its targets
    counts = masked.sum(1)
    want = sum(_published_loss(theirs, batch["tokens"][r:r + 1], masked[r:r + 1]) * counts[r]
               for r in range(len(counts))) / counts.sum()
    np.testing.assert_allclose(float(loss), want, rtol=1e-4, atol=1e-5)
    assert int(metrics["masked_tokens"]) == counts.sum()


def test_parallel_rows_train_the_draft_conditionals(setup):
    """`parallel_rate = 1`: every row's masked tokens see the visible ones only (the published `parallel`
    objective: the conditionals ASSD's drafts read), unlike the joint loss."""
    theirs, ours, batch = setup
    objective = make_objective("assd", {"final_min": 0.4, "final_max": 0.9, "parallel_rate": 1.0}, ours.config)
    key = jax.random.PRNGKey(5)
    loss, _ = jax.jit(lambda b, k: objective(_views(ours), b, k))(batch, key)
    masked = np.asarray(objective.noise(batch, key)[0])
    counts = masked.sum(1)
    per_row = [(_published_loss(theirs, batch["tokens"][r:r + 1], masked[r:r + 1], parallel=True),
                _published_loss(theirs, batch["tokens"][r:r + 1], masked[r:r + 1])) for r in range(len(counts))]
    want = sum(p * c for (p, _), c in zip(per_row, counts)) / counts.sum()
    joint = sum(j * c for (_, j), c in zip(per_row, counts)) / counts.sum()
    np.testing.assert_allclose(float(loss), want, rtol=1e-4, atol=1e-5)
    assert abs(want - joint) > 1e-3


def test_the_masking_follows_the_answer_and_the_curriculum(setup):
    _, ours, batch = setup
    answer = batch["target_mask"] > 0
    n_answer = answer.sum(1)
    for infill in (0.0, 1.0):
        objective = make_objective("assd", {"start_masking_rate": 0.2, "final_min": 0.6, "final_max": 1.0,
                                            "masking_warmup_steps": 100, "infill_rate": infill}, ours.config)
        for step, (lo, hi) in ((0, (0.2, 0.2)), (50, (0.4, 0.6)), (100, (0.6, 1.0)), (None, (0.6, 1.0))):
            masked, rate = (np.asarray(x) for x in objective.noise(batch, jax.random.PRNGKey(step or 7), step))
            assert np.allclose(masking_range(step, 0.2, 0.6, 1.0, 100), (lo, hi))
            assert ((rate >= lo - 1e-6) & (rate <= hi + 1e-6)).all()
            assert not (masked & ~answer).any()  # the prompt is never masked
            np.testing.assert_array_equal(masked.sum(1), np.clip((n_answer * rate).astype(int), 1, n_answer))
            if infill:  # one contiguous run per row
                runs = (np.diff(masked.astype(int), axis=1) == 1).sum(1) + masked[:, 0]
                assert (runs == 1).all()
    with pytest.raises(ConfigError, match="model_type 'xlnet'"):
        make_objective("assd", {}, jaxdllm.ModelConfig.preset("tiny-llada"))
    with pytest.raises(ConfigError, match=r"final_min \(0.9\) exceeds final_max \(0.5\)"):
        make_objective("assd", {"final_min": 0.9, "final_max": 0.5})


def test_step_reads_the_optimizer_count():
    import optax

    from jaxdllm.train.step import optimizer_step

    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    params = {"w": jnp.ones(3)}
    state = tx.init(params)
    assert int(optimizer_step(state)) == 0
    for _ in range(3):
        _, state = tx.update({"w": jnp.ones(3)}, state, params)
    assert int(optimizer_step(state)) == 3
