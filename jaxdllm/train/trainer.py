"""The trainer: one compiled, sharded train step, orbax checkpoints, exact resume.

State is three pytrees of arrays: `trainable` (the parameters, or the LoRA adapters), `frozen`
(the base parameters under LoRA, else empty), `opt_state` (optax AdamW), plus the host-side step
and data-iterator position. Construction is the sequence of `setup.py` functions; the step is
`step.make_train_step`. The PRNG key of step `s` is `fold_in(key(seed), s)`, so a resumed run
draws the same masks as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxdllm import sharding as shd
from jaxdllm.checkpoint.folder import CACHE_NOTES_KEY, SAMPLER_DEFAULTS_FILE
from jaxdllm.checkpoint.hf_config import require_checkpoint_folder
from jaxdllm.data import save_char_tokenizer
from jaxdllm.distributed import agree_any
from jaxdllm.decoding.config import SAMPLER_PRESETS
from jaxdllm.errors import TrainingError, TrainingInterrupted
from jaxdllm.interrupts import deferred_signals
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families import family_of
from jaxdllm.models.run_options import RunOptions
from jaxdllm.models.transformer import Transformer
from jaxdllm.shipped import checkpoint_dir
from jaxdllm.train import setup
from jaxdllm.train.agreement import agreement_from_recipe
from jaxdllm.train.config import TrainConfig
from jaxdllm.train.data_sources import data_source
from jaxdllm.train.objectives import make_objective
from jaxdllm.sharding import batch_sharding
from jaxdllm.train.step import make_train_step
from jaxdllm.train.workdir_lock import WorkdirLock
from jaxdllm.validation import require_positive_int

# The model fields (and the run option that lays out the parameters) a checkpoint must share with
# the recipe to be resumed.
_SAME_MODEL_FIELDS = ("vocab_size", "embed_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_dim",
                      "scan_layers")


def sampler_defaults(config: ModelConfig, seq_len: int) -> dict:
    """`jaxdllm generate` defaults for a model too short for the presets' 256 generated tokens.

    Such a model was trained on rows of `seq_len` tokens (prompt + answer), so it generates half
    a row (a power of two, one block, one token per step by default; a causal model's default
    preset has no block and keeps its own draft window, at most the answer). Empty where the presets fit.
    """
    llada = SAMPLER_PRESETS["llada"]
    if llada.gen_length + llada.prompt_bucket <= config.max_position:
        return {}
    gen = 1 << (max(min(seq_len, config.max_position) // 2, 1).bit_length() - 1)
    if not SAMPLER_PRESETS[family_of(config).default_preset(config)].canvas.diffusion_blocks:
        return {"gen_length": gen}
    return {"gen_length": gen, "block_length": gen, "steps": gen}


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
        where = workdir or config.checkpoint.dir
        self.workdir = Path(where).absolute() if where else None
        if config.model.init_from:  # a missing source fails before the workdir is made
            require_checkpoint_folder(checkpoint_dir(config.model.init_from), "[model] init_from")
        # Before anything reads or writes the folder: one run per workdir (process 0 holds it for the job).
        self.lock = (WorkdirLock(self.workdir).acquire()
                     if self.workdir is not None and jax.process_index() == 0 else None)
        # A jax.make_mesh mesh (Explicit axes) is used through its Auto twin, and everything the
        # trainer computes runs under that mesh, whatever mesh context the caller has set.
        self.mesh = shd.auto_mesh(mesh if mesh is not None else setup.make_training_mesh(config.mesh))
        self.tokenizer = setup.load_tokenizer(config)
        with jax.set_mesh(self.mesh):
            model = setup.init_model(config, self.tokenizer, self.mesh)
            self.model_config, self.run_options = model.config, model.options
            self.objective = make_objective(config.objective.kind, config.objective.settings, self.model_config)
            self.split = setup.split_for_training(model, config.lora, self.mesh, seed=config.train.seed,
                                                  extra=self.objective.extra_module(self.model_config),
                                                  freeze_backbone=self.objective.freezes_backbone)
            self.trainable, self.frozen = self.split.trainable, self.split.frozen
            del model
            self.tx, self.schedule = setup.make_optimizer(config.optim, config.train.steps)
            self.opt_state, self._opt_shardings = setup.init_optimizer(self.tx, self.trainable, self.mesh)
        self.step = 0

        self.batch_config = setup.batch_config_for(config, self.model_config, self.mesh)
        self.batches = setup.make_batches(config, self.tokenizer, self.objective, model_config=self.model_config,
                                          mesh=self.mesh)
        self._step_fn = make_train_step(self.split, self.objective, self.tx, self._opt_shardings, self.mesh,
                                        grad_accum=config.optim.grad_accum, skip_nan=config.train.on_nan == "skip",
                                        expert_bias_rate=config.train.expert_bias_rate)

        self.manager = setup.checkpoint_manager(self.workdir, config.checkpoint)
        self.agreement = agreement_from_recipe(config, self.tokenizer)
        self.history: list[dict] = []
        self._pending: list[dict] = []  # metrics of the steps since the last log record (checkpointed)

    batch_config_for = staticmethod(setup.batch_config_for)

    @property
    def examples(self) -> list:
        """The tokenised training rows (`jaxdllm.data.TokenizedExample`) the batches are drawn from."""
        return self.batches.examples

    def model(self) -> Transformer:
        """The model being trained, adapters (if any) applied in the forward."""
        return self.split.model(self.trainable, self.frozen)

    def model_from(self, params: dict) -> Transformer:
        """A plain NNX model over a full parameter dict (usable inside `jit`)."""
        return self.split.params_model(params)

    def params(self) -> dict:
        """The full parameters, LoRA adapters folded into their kernels."""
        if self.config.lora.enabled:
            with jax.set_mesh(self.mesh):
                return self.split.merged_params(self.trainable, self.frozen)
        if self.split.extra:
            return self.split.backbone_params(self.trainable, self.frozen)
        return self.trainable

    def exported_params(self) -> dict:
        """What `export` writes: the moving average of the parameters with `[optim] ema_decay`
        (in the parameters' dtypes), else `params()`."""
        from jaxdllm.train.ema import ema_from

        average = ema_from(self.opt_state) if self.config.optim.ema_decay else None
        if average is None or self.config.lora.enabled or self.split.extra:
            return self.params()
        return jax.tree.map(lambda a, p: a.astype(p.dtype), average, self.trainable)

    def extra_module(self):
        """The objective's own trained module (e.g. Medusa heads), or None."""
        return self.split.extra_module(self.trainable, self.frozen)

    # -- running ---------------------------------------------------------------------------
    def _device_batch(self, batch: dict) -> dict:
        rows = batch_sharding(self.mesh)
        return {k: jax.make_array_from_process_local_data(rows, np.asarray(v)) for k, v in batch.items()}

    def train_step(self, batch: dict) -> dict:
        """One optimizer step on a host batch; returns host metrics."""
        with jax.set_mesh(self.mesh):  # activation sharding constraints resolve against this mesh
            key = jax.random.fold_in(jax.random.key(self.config.train.seed), self.step)  # under this mesh
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
        record every `[log] every` steps to `self.history` and `metrics.jsonl`. SIGINT or SIGTERM
        stops it after the current step with a checkpoint of that step, raising
        `TrainingInterrupted`; a resumed run then gives the same weights and log as one that was
        never stopped.
        """
        total = self.config.train.steps if steps is None else steps
        require_positive_int(total, "steps (the total to train to)")
        if self.step > total:
            raise TrainingError(f"the run in {self.workdir} is already at step {self.step}, past {total}: "
                                f"train to more steps than {self.step}, or pass {self.step} to keep it as it is")
        end = min(total, stop_at) if stop_at else total
        log_every = self.config.log.every
        progress = None
        if self.config.log.progress and jax.process_index() == 0:
            from tqdm.auto import tqdm
            progress = tqdm(total=end, initial=self.step, desc="train", dynamic_ncols=True, mininterval=5)
        t0, tokens_seen = time.perf_counter(), 0
        if self.agreement is not None and self.step == 0 and end > 0:
            self._log({"step": 0, **self.measure_agreement()})  # the teacher itself, before any update
        with deferred_signals() as caught:  # stop between steps, after a save
            while self.step < end:
                batch = next(self.batches)
                metrics = self.train_step(batch)
                tokens_seen += int((batch["segment_ids"] > 0).sum()) * self.batch_config.num_shards  # every process's rows
                self._pending.append(metrics)
                if self.step % log_every == 0 or self.step == end:
                    elapsed = time.perf_counter() - t0
                    window, self._pending = self._pending, []
                    record = {"step": self.step, **{k: float(np.mean([m[k] for m in window])) for k in window[0]},
                              "lr": float(self.schedule(self.step - 1)), "tokens_per_s": tokens_seen / elapsed,
                              "elapsed_s": elapsed}
                    if self.agreement is not None and (self.step % self.config.log.agreement_every == 0
                                                       or self.step == end):
                        begin = time.perf_counter()
                        record.update(self.measure_agreement())
                        t0 += time.perf_counter() - begin  # tokens_per_s counts training time only
                    self._log(record)
                    if progress is not None:
                        progress.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
                if progress is not None:
                    progress.update(1)
                saved = self.step % self.config.checkpoint.every == 0 or self.step == end
                # every process of a multi-process job stops at the same step (a collective per step)
                stopping = agree_any(bool(caught))
                if self.manager is not None and (saved or stopping):
                    self.save()
                if stopping:
                    if progress is not None:
                        progress.close()
                    if self.manager is not None:
                        self.manager.wait_until_finished()
                    raise TrainingInterrupted(self.step, caught[0] if caught else signal.SIGTERM,
                                              saved=self.manager is not None)
        if progress is not None:
            progress.close()
        if self.manager is not None:
            self.manager.wait_until_finished()
        return self.history

    def measure_agreement(self) -> dict:
        """`[log] agreement_every`'s metrics for the current weights (`jaxdllm.train.agreement`)."""
        with jax.set_mesh(self.mesh):
            return self.agreement(self.model_from(self.params()))

    def close(self) -> None:
        """Finish pending checkpoint writes and release the output folder for another run."""
        if self.manager is not None:
            self.manager.wait_until_finished()
            self.manager.close()
        if self.lock is not None:
            self.lock.release()

    def _log_path(self) -> Path | None:
        return self.config.log.jsonl or (self.workdir / "metrics.jsonl" if self.workdir else None)

    def _log(self, record: dict) -> None:
        self.history.append(record)
        path = self._log_path()
        if path is not None and jax.process_index() == 0:
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")

    # -- checkpoints ---------------------------------------------------------------------
    def _meta(self) -> dict:
        return {"step": self.step, "data_state": self.batches.get_state(), "pending_metrics": self._pending,
                "model_config": self.model_config.to_dict(), "run_options": self.run_options.to_dict(),
                "lora": self.config.lora.rank,
                "lora_targets": sorted(self.config.lora.targets) if self.config.lora.enabled else []}

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
                                {"trainable": self.split.trainable_shardings, "opt_state": self._opt_shardings})
        state = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
        self.trainable, self.opt_state = state["trainable"], state["opt_state"]
        self.step = int(meta["step"])
        self.batches.set_state(meta["data_state"])
        self._pending = list(meta.get("pending_metrics", []))
        self._truncate_log(self.step)
        return True

    def _truncate_log(self, step: int) -> None:
        """Drop `metrics.jsonl` records past `step`: the resumed run writes them again."""
        path = self._log_path()
        if path is None or jax.process_index() != 0 or not Path(path).is_file():
            return
        lines = Path(path).read_text().splitlines()
        kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= step]
        if len(kept) != len(lines):
            Path(path).write_text("".join(line + "\n" for line in kept))

    def _check_same_model(self, meta: dict) -> None:
        # Older checkpoints kept the run options among the config's fields.
        saved = {**meta.get("model_config", {}), **meta.get("run_options", {})}
        ours = {**self.model_config.to_dict(), **self.run_options.to_dict()}
        defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig) + dataclasses.fields(RunOptions)}
        saved = {k: saved.get(k, defaults.get(k)) for k in _SAME_MODEL_FIELDS}
        diff = {k: (saved[k], ours.get(k)) for k in _SAME_MODEL_FIELDS if saved[k] != ours.get(k)}
        if meta.get("lora") != self.config.lora.rank:
            diff["lora.rank"] = (meta.get("lora"), self.config.lora.rank)
        if self.config.lora.enabled and not diff and meta.get("lora_targets") is None:  # the old flat layout
            raise TrainingError(f"checkpoints in {self.workdir} hold LoRA adapters in the layout of an older "
                                "jaxdllm and cannot be resumed; use a new [checkpoint] dir")
        targets = sorted(self.config.lora.targets) if self.config.lora.enabled else []
        if self.config.lora.enabled and meta.get("lora_targets", targets) != targets:
            diff["lora.targets"] = (meta["lora_targets"], targets)
        if diff:
            detail = ", ".join(f"{k}: checkpoint {a} vs recipe {b}" for k, (a, b) in diff.items())
            raise TrainingError(f"checkpoints in {self.workdir} were written for another model ({detail}); "
                                f"use a new [checkpoint] dir or the matching recipe")

    # -- export ----------------------------------------------------------------------------
    def export(self, path: str | Path, dtype: str | None = None) -> Path:
        """Save the (LoRA-merged; with `[optim] ema_decay`, averaged) model as a Hugging Face checkpoint
        with its tokenizer."""
        from jaxdllm.checkpoint import save_pretrained
        model = self.model_from(self.exported_params())
        copy_from = checkpoint_dir(self.config.model.init_from) if self.config.model.init_from else None
        out = save_pretrained(model, path, dtype=dtype, copy_files_from=copy_from)
        if copy_from is None and jax.process_index() == 0:
            if self.config.model.tokenizer:  # the recipe's own tokenizer folder
                for name in ("tokenizer.json", "tokenizer_config.json"):
                    source = Path(self.config.model.tokenizer) / name
                    if source.is_file():
                        (Path(out) / name).write_bytes(source.read_bytes())
            else:
                save_char_tokenizer(out, model_max_length=self.model_config.max_position)
            defaults = self.config.checkpoint.sampler or sampler_defaults(self.model_config, self.config.data.seq_len)
            if defaults:
                (Path(out) / SAMPLER_DEFAULTS_FILE).write_text(json.dumps(defaults))
        if jax.process_index() == 0:  # what the data leaves beside a model (GenMol: its length distribution)
            for source in data_source(self.config.data.source)().files_beside_export(self.config.data):
                (Path(out) / source.name).write_bytes(source.read_bytes())
        extra = self.extra_module()
        if extra is not None and jax.process_index() == 0:  # beside the weights, where its preset looks
            self.objective.save_extra(extra, out, model=str(self.config.model.init_from or "from scratch"),
                                      steps=self.step)
        copied = Path(out) / SAMPLER_DEFAULTS_FILE
        if copy_from is not None and jax.process_index() == 0 and (copied.is_file() or self.config.checkpoint.sampler):
            settings = json.loads(copied.read_text()) if copied.is_file() else {}
            noted = settings.pop(CACHE_NOTES_KEY, None) is not None  # measured on the parent's weights, not these
            if noted or self.config.checkpoint.sampler:
                copied.write_text(json.dumps({**settings, **self.config.checkpoint.sampler}, indent=1) + "\n")
        return Path(out)

