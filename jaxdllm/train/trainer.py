"""The trainer: one compiled, sharded train step, orbax checkpoints, exact resume.

State is four pytrees of arrays: `trainable` (the parameters, or the LoRA factors), `frozen`
(the base parameters under LoRA, else empty), `opt_state` (optax AdamW), plus the host-side
step and data-iterator position. The train step is a single `jax.jit` with explicit in/out
shardings on a `(data, fsdp, tensor)` mesh: parameters by their logical axes
(`jaxdllm.sharding`), the batch over `(data, fsdp)`. Gradient accumulation is a `lax.scan`
over micro-batches inside the step. The PRNG key of step `s` is `fold_in(key(seed), s)`, so a
resumed run draws the same masks as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxdllm import sharding as shd
from jaxdllm.data import (BatchConfig, JsonlConfig, build_char_tokenizer, load_gsm8k, make_batch_iterator,
                          make_mixture, read_jsonl, save_char_tokenizer, special_token_ids)
from jaxdllm.errors import ConfigError, TrainingError
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.transformer import Transformer
from jaxdllm.tokenizer import Tokenizer
from jaxdllm.train import lora as lora_lib
from jaxdllm.train.config import TrainConfig
from jaxdllm.train.objectives import Views, make_objective


# ------------------------------------------------------------------------------ pieces --
def make_optimizer(optim, total_steps: int) -> optax.GradientTransformation:
    """AdamW with warmup and a constant / cosine / linear schedule, after global-norm clipping."""
    decay_steps = max(total_steps - optim.warmup_steps, 1)
    final = optim.lr * optim.final_lr_fraction
    after = {"constant": optax.constant_schedule(optim.lr),
             "cosine": optax.cosine_decay_schedule(optim.lr, decay_steps, alpha=optim.final_lr_fraction),
             "linear": optax.linear_schedule(optim.lr, final, decay_steps)}[optim.schedule]
    schedule = after
    if optim.warmup_steps:
        schedule = optax.join_schedules(
            [optax.linear_schedule(0.0, optim.lr, optim.warmup_steps), after], [optim.warmup_steps])
    chain = [optax.clip_by_global_norm(optim.clip)] if optim.clip else []
    chain.append(optax.adamw(schedule, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay))
    return optax.chain(*chain), schedule


def load_tokenizer(config: TrainConfig) -> Tokenizer:
    """The checkpoint's own tokenizer for `init_from`, else the tiny models' character tokenizer."""
    if config.model.init_from:
        return Tokenizer.from_pretrained(config.model.init_from)
    return build_char_tokenizer()


def load_examples(data) -> list:
    """The training examples a `[data]` section names."""
    if data.source == "tasks":
        return make_mixture(data.tasks, data.examples_per_task, data.seed, split=data.split)
    if data.source == "gsm8k":
        return load_gsm8k(split=data.split, path=data.path)
    return read_jsonl(data.path, JsonlConfig(on_error=data.on_error)).records


def build_model_config(config: TrainConfig, tokenizer: Tokenizer) -> ModelConfig:
    """`preset` + the tokenizer's vocabulary and special ids + overrides + compute dtype."""
    overrides = dict(config.model.overrides)
    overrides.setdefault("dtype", config.train.compute_dtype)
    overrides.setdefault("param_dtype", "float32")
    if config.model.init_from:
        raise ConfigError("build_model_config is for presets; init_from models carry their config")
    ids = special_token_ids(tokenizer)
    return ModelConfig.preset(config.model.preset, vocab_size=tokenizer.vocab_size, **{**ids, **overrides})


def _mesh(section):
    fixed = section.fsdp * section.tensor
    data = section.data if section.data > 0 else jax.device_count() // fixed
    return shd.make_mesh(data=data, fsdp=section.fsdp, tensor=section.tensor)


# ----------------------------------------------------------------------------- trainer --
class Trainer:
    """Builds model, data, optimizer and checkpoints from a `TrainConfig`; `train()` runs it.

    Args:
      config: the recipe.
      workdir: checkpoints and `metrics.jsonl` go here (default: `[checkpoint] dir`; None
        keeps everything in memory).
      mesh: a mesh to use instead of `[mesh]` (tests pass one over a subset of devices).
    """

    def __init__(self, config: TrainConfig, workdir: str | Path | None = None, mesh=None):
        self.config = config
        self.mesh = mesh if mesh is not None else _mesh(config.mesh)
        self.tokenizer = load_tokenizer(config)
        model = self._init_model()
        self.model_config = model.config
        self.graphdef, state = nnx.split(model)
        self._abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
        param_shardings = nnx.to_pure_dict(shd.state_shardings(state, self.mesh))
        params = jax.device_put(nnx.to_pure_dict(state), param_shardings)
        del model, state

        replicated = NamedSharding(self.mesh, PartitionSpec())
        key = jax.random.key(config.train.seed)
        if config.lora.enabled:
            self.frozen = params
            self.trainable = jax.device_put(lora_lib.init_lora(params, config.lora, jax.random.fold_in(key, 0x1042A)),
                                            replicated)
            self._frozen_shardings = param_shardings
            self._trainable_shardings = jax.tree.map(lambda _: replicated, self.trainable)
        else:
            self.frozen, self._frozen_shardings = {}, {}
            self.trainable, self._trainable_shardings = params, param_shardings
        self.tx, self.schedule = make_optimizer(config.optim, config.train.steps)
        init = jax.jit(self.tx.init)
        # Moments follow their parameters; scalars (step counts) are replicated on the mesh.
        self._opt_shardings = jax.tree.map(
            lambda s: s if isinstance(s, NamedSharding) and s.mesh == self.mesh else replicated,
            init.lower(self.trainable).compile().output_shardings)
        self.opt_state = jax.device_put(init(self.trainable), self._opt_shardings)
        self.step = 0
        self._key = key

        self.examples = load_examples(config.data)
        if config.data.chat_template:
            self.examples = [dataclasses.replace(e, prompt=self.tokenizer.apply_chat_template(
                [{"role": "user", "content": e.prompt}], add_generation_prompt=True)) for e in self.examples]
        self.batch_config = self.batch_config_for(config)
        self.batches = make_batch_iterator(self.examples, self.tokenizer, self.batch_config)
        self._batch_sharding = NamedSharding(self.mesh, PartitionSpec(("data", "fsdp"), None))

        self.objective = make_objective(config.objective.kind, config.objective.settings, self.model_config)
        self._step_fn = self._compile_step()

        self.workdir = Path(workdir or config.checkpoint.dir).absolute() if (workdir or config.checkpoint.dir) else None
        self.manager = None
        if self.workdir is not None:
            self.manager = ocp.CheckpointManager(
                self.workdir / "checkpoints",
                options=ocp.CheckpointManagerOptions(max_to_keep=config.checkpoint.keep, create=True),
                item_names=("state", "meta"))
        self.history: list[dict] = []

    # -- construction ---------------------------------------------------------------------
    @staticmethod
    def batch_config_for(config: TrainConfig) -> BatchConfig:
        """The batching of a recipe; this process keeps its slice of every global batch."""
        return BatchConfig(seq_len=config.data.seq_len, batch_size=config.data.batch_size, seed=config.data.seed,
                           pack=config.data.pack, fill_with_eos=not config.data.pack,
                           add_bos=not config.data.chat_template,  # the template carries its own BOS
                           num_shards=jax.process_count(), shard_index=jax.process_index())

    def _init_model(self) -> Transformer:
        c = self.config
        if c.model.init_from:
            from jaxdllm.checkpoint import from_pretrained, load_state
            src = Path(c.model.init_from)
            overrides = dict(c.model.overrides)
            if (src / "jaxdllm_config.json").is_file():
                return load_state(src, mesh=self.mesh)
            # float32 master weights: AdamW steps of lr ~1e-5 vanish in bf16 weights.
            dtype = overrides.pop("param_dtype", "float32")
            return from_pretrained(src, dtype=dtype, compute_dtype=c.train.compute_dtype, mesh=self.mesh,
                                   **overrides)
        model_config = build_model_config(c, self.tokenizer)
        return Transformer(model_config, rngs=nnx.Rngs(c.train.seed))

    def model_from(self, params: dict) -> Transformer:
        """An NNX model over a parameter dict (usable inside `jit`)."""
        state = jax.tree.map(lambda x: x, self._abstract)
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(self.graphdef, state)

    def params(self) -> dict:
        """The full parameters (LoRA merged in)."""
        if self.config.lora.enabled:
            return lora_lib.merge(self.frozen, self.trainable, self.config.lora)
        return self.trainable

    def _compile_step(self):
        accum = self.config.optim.grad_accum
        lora_cfg = self.config.lora
        on_nan_skip = self.config.train.on_nan == "skip"

        def loss_of(trainable, frozen, micro, key):
            params = lora_lib.merge(frozen, trainable, lora_cfg) if lora_cfg.enabled else trainable
            model = self.model_from(params)
            apply = lambda tokens, positions, mask: model(tokens, positions=positions, attention=mask)
            return self.objective(Views(student=apply, config=self.model_config), micro, key)

        def step(trainable, frozen, opt_state, batch, key):
            micro = jax.tree.map(lambda x: x.reshape(accum, x.shape[0] // accum, *x.shape[1:]), batch)
            keys = jax.random.split(key, accum)
            grad_fn = jax.value_and_grad(loss_of, has_aux=True)

            def body(acc, xs):
                mb, k = xs
                (_, metrics), grads = grad_fn(trainable, frozen, mb, k)
                return jax.tree.map(jnp.add, acc, (grads, metrics)), None

            zeros = jax.tree.map(jnp.zeros_like, trainable)
            metric_shapes = jax.eval_shape(lambda: grad_fn(trainable, frozen, jax.tree.map(lambda x: x[0], micro), keys[0])[0][1])
            zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), metric_shapes)
            (grads, metrics), _ = jax.lax.scan(body, (zeros, zero_metrics), (micro, keys))
            grads = jax.tree.map(lambda g: g / accum, grads)
            metrics = jax.tree.map(lambda m: m / accum, metrics)
            updates, new_opt = self.tx.update(grads, opt_state, trainable)
            new_trainable = optax.apply_updates(trainable, updates)
            metrics["grad_norm"] = optax.tree_utils.tree_norm(grads)
            if on_nan_skip:  # keep the old state where the loss is not finite
                ok = jnp.isfinite(metrics["loss"])
                new_trainable = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new_trainable, trainable)
                new_opt = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new_opt, opt_state)
            return new_trainable, new_opt, metrics

        batch_shardings = {k: self._batch_sharding for k in ("tokens", "prompt_mask", "target_mask",
                                                              "segment_ids", "positions")}
        replicated = NamedSharding(self.mesh, PartitionSpec())
        return jax.jit(step,
                       in_shardings=(self._trainable_shardings, self._frozen_shardings, self._opt_shardings,
                                     batch_shardings, replicated),
                       out_shardings=(self._trainable_shardings, self._opt_shardings, replicated),
                       donate_argnums=(0, 2))

    # -- running ---------------------------------------------------------------------------
    def _device_batch(self, batch: dict) -> dict:
        return {k: jax.make_array_from_process_local_data(self._batch_sharding, np.asarray(v))
                for k, v in batch.items()}

    def train_step(self, batch: dict) -> dict:
        """One optimizer step on a host batch; returns host metrics."""
        key = jax.random.fold_in(self._key, self.step)
        self.trainable, self.opt_state, metrics = self._step_fn(
            self.trainable, self.frozen, self.opt_state, self._device_batch(batch), key)
        self.step += 1
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if not math.isfinite(metrics["loss"]) and self.config.train.on_nan == "stop":
            raise TrainingError(f"loss is {metrics['loss']} at step {self.step}; stopping "
                                f"(set [train] on_nan = \"skip\" to skip such steps)")
        return metrics

    def train(self, steps: int | None = None, stop_at: int | None = None) -> list[dict]:
        """Train until `steps` total steps (default `[train] steps`), or stop early at `stop_at`.

        Saves a checkpoint every `[checkpoint] every` steps and at the end; appends a metrics
        record every `[log] every` steps to `self.history` and `metrics.jsonl`.
        """
        total = steps or self.config.train.steps
        end = min(total, stop_at) if stop_at else total
        log_every = self.config.log.every
        progress = None
        if self.config.log.progress and jax.process_index() == 0:
            from tqdm.auto import tqdm
            progress = tqdm(total=end, initial=self.step, desc="train", dynamic_ncols=True, mininterval=5)
        t0, tokens_seen, window = time.perf_counter(), 0, []
        while self.step < end:
            batch = next(self.batches)
            metrics = self.train_step(batch)
            tokens_seen += int((batch["segment_ids"] > 0).sum()) * jax.process_count()
            window.append(metrics)
            if self.step % log_every == 0 or self.step == end:
                elapsed = time.perf_counter() - t0
                record = {"step": self.step, **{k: float(np.mean([m[k] for m in window])) for k in window[0]},
                          "lr": float(self.schedule(self.step - 1)), "tokens_per_s": tokens_seen / elapsed,
                          "elapsed_s": elapsed}
                window = []
                self._log(record)
                if progress is not None:
                    progress.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
            if progress is not None:
                progress.update(1)
            if self.manager is not None and (self.step % self.config.checkpoint.every == 0 or self.step == end):
                self.save()
        if progress is not None:
            progress.close()
        if self.manager is not None:
            self.manager.wait_until_finished()
        return self.history

    def _log(self, record: dict) -> None:
        self.history.append(record)
        path = self.config.log.jsonl or (self.workdir / "metrics.jsonl" if self.workdir else None)
        if path is not None and jax.process_index() == 0:
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")

    # -- checkpoints ---------------------------------------------------------------------
    def _meta(self) -> dict:
        return {"step": self.step, "data_state": self.batches.get_state(),
                "model_config": self.model_config.to_dict(), "lora": self.config.lora.rank}

    def save(self) -> None:
        """Checkpoint trainable params, optimizer state, step and data position (orbax)."""
        state = {"trainable": self.trainable, "opt_state": self.opt_state}
        self.manager.save(self.step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(self._meta())), force=True)

    def restore(self, step: int | None = None) -> bool:
        """Resume from the latest (or given) checkpoint in the workdir; False if there is none."""
        if self.manager is None:
            return False
        step = self.manager.latest_step() if step is None else step
        if step is None:
            return False
        meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        self._check_same_model(meta)
        abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                {"trainable": self.trainable, "opt_state": self.opt_state},
                                {"trainable": self._trainable_shardings, "opt_state": self._opt_shardings})
        state = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
        self.trainable, self.opt_state = state["trainable"], state["opt_state"]
        self.step = int(meta["step"])
        self.batches.set_state(meta["data_state"])
        return True

    def _check_same_model(self, meta: dict) -> None:
        saved = meta.get("model_config", {})
        ours = self.model_config.to_dict()
        keys = ("vocab_size", "embed_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_dim")
        diff = {k: (saved.get(k), ours.get(k)) for k in keys if saved.get(k) != ours.get(k)}
        if diff or meta.get("lora") != self.config.lora.rank:
            if meta.get("lora") != self.config.lora.rank:
                diff["lora.rank"] = (meta.get("lora"), self.config.lora.rank)
            detail = ", ".join(f"{k}: checkpoint {a} vs recipe {b}" for k, (a, b) in diff.items())
            raise TrainingError(f"checkpoints in {self.workdir} were written for another model ({detail}); "
                                f"use a new [checkpoint] dir or the matching recipe")

    # -- export ----------------------------------------------------------------------------
    def export(self, path: str | Path, dtype: str | None = None) -> Path:
        """Save the (LoRA-merged) model as a Hugging Face checkpoint with its tokenizer."""
        from jaxdllm.checkpoint import save_pretrained
        model = self.model_from(self.params())
        copy_from = self.config.model.init_from if self.config.model.init_from else None
        out = save_pretrained(model, path, dtype=dtype, copy_files_from=copy_from)
        if copy_from is None and jax.process_index() == 0:
            save_char_tokenizer(out, model_max_length=self.model_config.max_position)
        return Path(out)

