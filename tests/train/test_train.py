"""The trainer on a tiny model: the loss falls, resume is exact, an 8-device sharded step equals
the 1-device step, LoRA counts and merges correctly, bad input fails clearly."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdllm import from_pretrained
from jaxdllm.data import DataError, build_char_tokenizer, make_batch_iterator, make_mixture
from jaxdllm.models.config import ConfigError
from jaxdllm.sharding import make_mesh
from jaxdllm.train import TrainConfig, Trainer, TrainingError
from jaxdllm.train import lora as lora_lib
from jaxdllm.train import setup

MODEL = {"preset": "tiny-llada", "embed_dim": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 2,
         "head_dim": 16, "mlp_dim": 64, "max_position": 64, "attention_impl": "xla"}


def recipe(**sections) -> TrainConfig:
    raw = {"model": dict(MODEL),
           "data": {"examples_per_task": 200, "seq_len": 32, "batch_size": 16},
           "optim": {"lr": 3e-3, "warmup_steps": 5},
           "train": {"steps": 6}, "log": {"every": 1, "progress": False}, "mesh": {"data": 1}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return TrainConfig.from_dict(raw)


def one_device():
    return make_mesh(devices=jax.devices()[:1])


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_loss_falls_on_the_task_suite():
    trainer = Trainer(recipe(train={"steps": 80}, data={"examples_per_task": 400}), mesh=one_device())
    history = trainer.train()
    first = np.mean([r["loss"] for r in history[:5]])
    last = np.mean([r["loss"] for r in history[-5:]])
    assert last < 0.6 * first, (first, last)


@pytest.mark.slow  # the default run's 6-minute budget; the interrupted-run test below resumes to the same weights too
def test_resume_equals_uninterrupted_training(tmp_path):
    straight = Trainer(recipe(), mesh=one_device())
    straight.train()

    config = recipe(checkpoint={"every": 3})
    first = Trainer(config, workdir=tmp_path, mesh=one_device())
    first.train(stop_at=3)
    resumed = Trainer(config, workdir=tmp_path, mesh=one_device())
    assert resumed.restore() and resumed.step == 3
    resumed.train()
    for a, b in zip(jax.tree.leaves(straight.trainable), jax.tree.leaves(resumed.trainable)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert losses == pytest.approx([r["loss"] for r in straight.history], abs=0)


def test_sharded_step_equals_single_device_step():
    config = recipe()
    batch = next(make_batch_iterator(make_mixture(config.data.tasks, 50, 0), build_char_tokenizer(),
                                     Trainer.batch_config_for(config)))
    single = Trainer(config, mesh=one_device())
    sharded = Trainer(config, mesh=make_mesh(data=2, fsdp=2, tensor=2))
    assert len(jax.tree.leaves(sharded.trainable)[0].sharding.device_set) == 8
    m1, m8 = single.train_step(batch), sharded.train_step(batch)
    assert m8["loss"] == pytest.approx(m1["loss"], rel=1e-5)
    for a, b in zip(jax.tree.leaves(single.trainable), jax.tree.leaves(sharded.trainable)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-4)


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_lora_counts_trains_only_adapters_and_merged_export_matches(tmp_path):
    config = recipe(lora={"rank": 4, "alpha": 8.0, "targets": ["q", "v", "down"]}, train={"steps": 3})
    trainer = Trainer(config, mesh=one_device())
    layers, e, h, d, m = MODEL["num_layers"], MODEL["embed_dim"], MODEL["num_heads"], MODEL["head_dim"], MODEL["mlp_dim"]
    expected = layers * 4 * ((e + h * d) + (e + h * d) + (m + e))  # q, v: E -> H*D; down: M -> E
    assert lora_lib.num_lora_params(trainer.trainable) == expected
    base = jax.tree.map(np.asarray, trainer.frozen)
    trainer.train()
    for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(trainer.frozen)):
        np.testing.assert_array_equal(a, np.asarray(b))  # the base model is frozen

    # The merged kernel acts like the unmerged W x + scale * B(A x) on a random input.
    w = np.asarray(base["layers"][0]["attn"]["q"]["kernel"]).reshape(e, h * d)
    adapters = trainer.trainable["layers"][0]["attn"]["q"]
    a, b = np.asarray(adapters["lora_a"]), np.asarray(adapters["lora_b"]).reshape(-1, h * d)
    assert np.abs(b).max() > 0  # training moved the adapter
    x = np.random.default_rng(0).normal(size=(5, e)).astype(np.float32)
    merged = np.asarray(trainer.params()["layers"][0]["attn"]["q"]["kernel"]).reshape(e, h * d)
    np.testing.assert_allclose(x @ merged, x @ w + config.lora.scale * (x @ a) @ b, atol=1e-5)

    out = trainer.export(tmp_path / "merged")
    reloaded = from_pretrained(out)
    ids = jnp.asarray(np.random.default_rng(1).integers(5, 100, (2, 12)), jnp.int32)
    want = trainer.model_from(trainer.params())(ids).logits
    np.testing.assert_allclose(np.asarray(reloaded(ids).logits), np.asarray(want), atol=1e-5)
    # training applies the adapters in the forward: the same function as the merged weights
    np.testing.assert_allclose(np.asarray(trainer.model()(ids).logits), np.asarray(want), atol=1e-5)

    # the adapters and their optimizer state resume from an orbax checkpoint
    trainer.workdir, trainer.manager = tmp_path / "run", setup.checkpoint_manager(tmp_path / "run", config.checkpoint)
    trainer.save()
    trainer.manager.wait_until_finished()
    resumed = Trainer(config, workdir=tmp_path / "run", mesh=one_device())
    assert resumed.restore() and resumed.step == trainer.step
    for x, y in zip(jax.tree.leaves((trainer.trainable, trainer.opt_state)),
                    jax.tree.leaves((resumed.trainable, resumed.opt_state))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_nan_loss_stops_with_the_step_number():
    trainer = Trainer(recipe(), mesh=one_device())
    trainer.train(stop_at=2)
    trainer.trainable = {**trainer.trainable, "embed": jnp.full_like(trainer.trainable["embed"], jnp.nan)}
    with pytest.raises(TrainingError, match="at step 3"):
        trainer.train()


def test_checkpoint_from_another_model_is_refused(tmp_path):
    Trainer(recipe(checkpoint={"every": 2}, train={"steps": 2}), workdir=tmp_path, mesh=one_device()).train()
    wider = recipe(checkpoint={"every": 2})
    wider_model = {**MODEL, "embed_dim": 64}
    other = Trainer(TrainConfig.from_dict({**wider.to_dict(), "model": wider_model}), workdir=tmp_path,
                    mesh=one_device())
    with pytest.raises(TrainingError, match="another model.*embed_dim"):
        other.restore()


def test_bad_data_and_recipes_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        Trainer(recipe(data={"source": "jsonl", "path": str(tmp_path / "missing.jsonl")}), mesh=one_device())
    bad = tmp_path / "bad.jsonl"
    rows = [json.dumps({"prompt": f"copy {i}{i}=", "response": f"{i}{i}"}) for i in range(1, 9)]
    bad.write_text("\n".join(rows[:2] + ["{not json"] + rows[2:]) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:3"):
        Trainer(recipe(data={"source": "jsonl", "path": str(bad), "batch_size": 4}), mesh=one_device())
    with pytest.warns(UserWarning, match="skipped"):
        trainer = Trainer(recipe(data={"source": "jsonl", "path": str(bad), "batch_size": 4, "on_error": "skip"},
                                 train={"steps": 1}), mesh=one_device())
    assert len(trainer.examples) == 8 and math.isfinite(trainer.train()[-1]["loss"])
    with pytest.raises(ConfigError, match=r"\[optim\] has unknown key"):
        recipe(optim={"learning_rate": 1.0})
    with pytest.raises(ConfigError, match="grad_accum"):
        recipe(optim={"grad_accum": 3})
    with pytest.raises(ConfigError, match="does not exist"):
        TrainConfig.from_toml(tmp_path / "nope.toml")


def test_gradient_accumulation_equals_the_full_batch_step(tmp_path):
    # Causal LM on equal-length examples: every row scores the same number of tokens, so the
    # mean of two half-batch losses is the full-batch loss and the updates must agree.
    data = tmp_path / "same_length.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"copy {i:02d}=", "response": f"{i:02d}"}) + "\n"
                            for i in range(40)))
    sections = dict(data={"source": "jsonl", "path": str(data), "batch_size": 8},
                    objective={"kind": "causal_lm"}, model={"attention": "causal"})
    full = Trainer(recipe(**sections), mesh=one_device())
    accum = Trainer(recipe(**sections, optim={"grad_accum": 4}), mesh=one_device())
    for _ in range(2):
        batch = next(full.batches)
        m_full, m_acc = full.train_step(batch), accum.train_step(next(accum.batches))
        assert m_acc["loss"] == pytest.approx(m_full["loss"], rel=1e-6)
    for a, b in zip(jax.tree.leaves(full.trainable), jax.tree.leaves(accum.trainable)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)


def test_fine_tune_from_an_exported_checkpoint(tmp_path):
    first = Trainer(recipe(train={"steps": 2}), mesh=one_device())
    first.train()
    out = first.export(tmp_path / "base")
    config = TrainConfig.from_dict({**recipe(train={"steps": 1}).to_dict(), "model": {"init_from": str(out)}})
    tuned = Trainer(config, mesh=one_device())
    assert tuned.model_config.embed_dim == MODEL["embed_dim"]
    for a, b in zip(jax.tree.leaves(first.params()), jax.tree.leaves(tuned.params())):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # starts from the exported weights
    assert math.isfinite(tuned.train()[-1]["loss"])


def test_a_fine_tuned_export_keeps_the_sampler_lengths_but_not_the_parents_cache_notes(tmp_path):
    """`cache_notes` were measured on the parent's weights; the lengths still suit the model."""
    first = Trainer(recipe(train={"steps": 1}), mesh=one_device())
    out = first.export(tmp_path / "base")
    settings = {"gen_length": 16, "block_length": 16, "steps": 16, "cache_notes": {"dual": "fails on the parent"}}
    (out / "jaxdllm_sampler.json").write_text(json.dumps(settings))
    config = TrainConfig.from_dict({**recipe(train={"steps": 1}).to_dict(), "model": {"init_from": str(out)}})
    tuned = Trainer(config, mesh=one_device())
    copied = json.loads((tuned.export(tmp_path / "tuned") / "jaxdllm_sampler.json").read_text())
    assert copied == {"gen_length": 16, "block_length": 16, "steps": 16}
    # A recipe's [checkpoint] sampler sets the export's decoding defaults, over the parent's.
    blocks = {**config.to_dict(), "checkpoint": {"sampler": {"block_length": 8}}}
    retuned = Trainer(TrainConfig.from_dict(blocks), mesh=one_device())
    written = json.loads((retuned.export(tmp_path / "blocks") / "jaxdllm_sampler.json").read_text())
    assert written == {"gen_length": 16, "block_length": 8, "steps": 16}
    fresh = Trainer(recipe(train={"steps": 1}, checkpoint={"sampler": {"gen_length": 24, "block_length": 8}}),
                    mesh=one_device())
    assert json.loads((fresh.export(tmp_path / "fresh") / "jaxdllm_sampler.json").read_text()) == {
        "gen_length": 24, "block_length": 8}
    with pytest.raises(ConfigError, match="gen_lenght"):
        recipe(checkpoint={"sampler": {"gen_lenght": 24}})


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_scanned_layers_with_remat_train_like_the_unrolled_model():
    """LoRA adapters stacked with their scanned kernels, remat on: the same losses, adapters and
    merged weights as the unrolled model (the adapters start from the same key either way)."""
    lora = {"rank": 4, "alpha": 8.0, "targets": ["q", "o", "up"]}
    unrolled = Trainer(recipe(lora=lora), mesh=one_device())
    scanned = Trainer(recipe(lora=lora, model={"scan_layers": True, "remat": "dots"}), mesh=one_device())
    for _ in range(2):
        batch = next(unrolled.batches)
        m_u, m_s = unrolled.train_step(batch), scanned.train_step(next(scanned.batches))
        assert m_s["loss"] == pytest.approx(m_u["loss"], rel=1e-5)
    a_u = unrolled.trainable["layers"][1]["attn"]["o"]["lora_b"]
    a_s = scanned.trainable["layers"]["attn"]["o"]["lora_b"][1]
    assert np.abs(np.asarray(a_u)).max() > 0
    np.testing.assert_allclose(np.asarray(a_s), np.asarray(a_u), atol=1e-6)
    w_u = unrolled.params()["layers"][1]["mlp"]["up"]["kernel"]
    w_s = scanned.params()["layers"]["mlp"]["up"]["kernel"][1]
    np.testing.assert_allclose(np.asarray(w_s), np.asarray(w_u), atol=1e-6)


WALL_CLOCK = ("tokens_per_s", "elapsed_s")


def _log_without_wall_clock(path):
    return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK} for line in path.read_text().splitlines()]


def test_an_interrupted_run_resumes_to_the_same_weights_and_log(tmp_path, monkeypatch):
    """SIGINT after step 7 (checkpoints every 5, a log record every 3): the run saves step 7 and
    stops; the same run resumed ends with the weights and metrics.jsonl of a run never stopped."""
    import signal

    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a job started in the background

    from jaxdllm.errors import TrainingInterrupted

    config = recipe(train={"steps": 12}, checkpoint={"every": 5}, log={"every": 3, "progress": False})
    straight = Trainer(config, workdir=tmp_path / "straight", mesh=one_device())
    straight.train()
    straight.close()

    step = Trainer.train_step

    def interrupting_step(self, batch):
        metrics = step(self, batch)
        if self.step == 7:
            signal.raise_signal(signal.SIGINT)  # as a user's Ctrl-C, in the middle of the run
            signal.raise_signal(signal.SIGINT)  # a second one while it saves changes nothing
        return metrics

    monkeypatch.setattr(Trainer, "train_step", interrupting_step)
    first = Trainer(config, workdir=tmp_path / "stopped", mesh=one_device())
    with pytest.raises(TrainingInterrupted) as stopped:
        first.train()
    first.close()
    assert (stopped.value.step, stopped.value.signum, stopped.value.saved) == (7, signal.SIGINT, True)
    monkeypatch.setattr(Trainer, "train_step", step)
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back

    resumed = Trainer(config, workdir=tmp_path / "stopped", mesh=one_device())
    assert resumed.restore() and resumed.step == 7
    resumed.train()
    resumed.close()
    for a, b in zip(jax.tree.leaves(straight.params()), jax.tree.leaves(resumed.params())):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert _log_without_wall_clock(tmp_path / "stopped" / "metrics.jsonl") == \
        _log_without_wall_clock(tmp_path / "straight" / "metrics.jsonl")


def test_a_resume_from_an_older_checkpoint_drops_the_log_lines_it_redoes(tmp_path):
    config = recipe(train={"steps": 8}, checkpoint={"every": 5}, log={"every": 1, "progress": False})
    run = Trainer(config, workdir=tmp_path, mesh=one_device())
    run.train(stop_at=7)  # checkpoints at 5 and 7, log lines 1..7
    run.close()
    again = Trainer(config, workdir=tmp_path, mesh=one_device())
    assert again.restore(step=5)
    assert [r["step"] for r in _log_without_wall_clock(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    again.train()
    again.close()
    assert [r["step"] for r in _log_without_wall_clock(tmp_path / "metrics.jsonl")] == list(range(1, 9))
