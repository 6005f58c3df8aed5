"""Worker for tests/train/test_train_multihost.py: train tiny models of several recipe kinds, one after
another in this one process, and write each run's losses and parameter sums.

    python tests/train/multihost_worker.py OUT.json --workdir DIR --teachers DIR [--recipes a,b,...]
    python tests/train/multihost_worker.py OUT.json ... --port P --process-id I --num-processes N
    python tests/train/multihost_worker.py OUT.json ... --one-device mdm_sft     # also on 1 of the devices

The parent sets XLA_FLAGS (the local device count) and JAX_PLATFORMS in the environment; with
`--port` this process joins a job on 127.0.0.1 (`jaxdllm.distributed.initialize`, gloo CPU
collectives) once, and every recipe then runs over the job's devices. The processes of one job
share `--workdir` (the distillation files, written once, by process 0); `--teachers` holds the tiny
teacher checkpoints the parent wrote (`llada`, `qwen2`).

A recipe with a `distill` entry first runs `jaxdllm distill generate` or `jaxdllm distill
trajectories` (the command line's `main`, in this process) over the job, then trains on that file.

OUT.json: `{"process_index", "process_count", "device_count", "local_device_count",
"recipes": {name: run}, "one_device": {name: run}}`, a run being `{"mesh", "rows_per_process",
"steps", "losses", "grad_norms", "param_sum", "param_abs_sum"` (the full, LoRA-merged parameters),
`"trained_sum", "trained_abs_sum"` (what the optimiser updates: all parameters, the LoRA adapters or
the Medusa heads) and `"init_trained_sum"` (the same before the first step)}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
os.environ.setdefault("JAXDLLM_COMPILATION_CACHE", "off")  # the command line's cache stays off, as in tests

import jax  # noqa: E402

# The tiniest models: one layer, width 32, 32-token rows, 8 rows a batch, 3 steps.
LLADA = {"preset": "tiny-llada", "embed_dim": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2,
         "head_dim": 16, "mlp_dim": 64, "max_position": 64, "attention_impl": "xla"}
QWEN2 = {**LLADA, "preset": "tiny-qwen2"}
DIFFUSIONGEMMA = {"preset": "tiny-diffusiongemma", "embed_dim": 32, "num_layers": 1, "num_heads": 2,
                  "num_kv_heads": 1, "head_dim": 16, "mlp_dim": 32, "block_size": 8, "max_position": 64,
                  "attention_impl": "xla",
                  "gemma4": {"layer_types": ["full"], "sliding_window": 8, "full_head_dim": 16, "full_kv_heads": 1},
                  "experts": {"num_experts": 4, "experts_per_token": 2, "expert_dim": 16}}
TEACHERS = {"llada": LLADA, "qwen2": QWEN2}  # written by the parent (`write_teacher`), random weights
STEPS = 3
TASKS = ["copy", "sort", "add", "perm"]  # prompts of <= 15 tokens: prompt + 16 answer tokens fit a 32-token row


def recipes(teachers: Path, workdir: Path) -> dict[str, dict]:
    """Every recipe kind, tiny. `distill`: the teacher's prompts and sampler (its `out` is in the
    job's `workdir`); the student starts from the teacher as in training/*.toml."""
    llada, qwen2 = str(teachers / "llada"), str(teachers / "qwen2")
    data = {"source": "tasks", "tasks": TASKS, "examples_per_task": 16, "seq_len": 32, "batch_size": 8}
    distill = {"tasks": ["copy", "sort"], "examples_per_task": 8, "batch_size": 8}
    return {
        "mdm_sft": {"model": LLADA, "data": data, "objective": {"kind": "mdm_sft"}},
        "lora": {"model": {"init_from": llada, "attention_impl": "xla"}, "data": data,
                 "objective": {"kind": "mdm_sft"}, "lora": {"rank": 4, "alpha": 8.0, "targets": ["q", "v", "down"]}},
        # dParallel: the teacher's answers (`distill generate`; a random teacher: keep them all)
        "certainty_forcing": {
            "model": {"init_from": llada, "attention_impl": "xla"},
            "distill": {**distill, "preset": "llada", "sampler": {"gen_length": 8, "block_length": 8, "steps": 8},
                        "out": str(workdir / "teacher.jsonl")},
            "data": {"source": "teacher", "keep": "all", "seq_len": 32, "batch_size": 8},
            "objective": {"kind": "certainty_forcing", "block_length": 8}},
        # Jacobi Forcing: the causal teacher's Jacobi trajectories (`distill trajectories`)
        "jacobi_forcing": {
            "model": {"init_from": qwen2, "attention_impl": "xla"},
            "distill": {**distill, "preset": "jacobi", "sampler": {"gen_length": 8, "window": 4},
                        "out": str(workdir / "trajectories.jsonl")},
            "data": {"source": "trajectories", "keep": "all", "seq_len": 32, "batch_size": 8, "window": 4},
            "objective": {"kind": "jacobi_forcing", "block_length": 4}},
        "medusa": {"model": {"init_from": qwen2, "attention_impl": "xla"}, "data": data,
                   "objective": {"kind": "medusa", "num_heads": 2}},  # Medusa-1: the heads alone
        "diffusiongemma": {"model": DIFFUSIONGEMMA, "data": {**data, "tasks": ["copy", "sort"]},
                           "objective": {"kind": "uniform_block_diffusion"}},
    }


COMMON = {"optim": {"lr": 3e-3, "warmup_steps": 0}, "train": {"steps": STEPS},
          "log": {"every": 1, "progress": False}}
DISTILL_COMMAND = {"teacher": "generate", "trajectories": "trajectories"}  # [data] source -> `jaxdllm distill` command


def write_teacher(directory: Path, kind: str) -> Path:
    """A random tiny teacher checkpoint (`TEACHERS[kind]`, character tokenizer) in `directory`;
    the parent calls this once, before the workers start."""
    from flax import nnx

    from jaxdllm.checkpoint import save_pretrained
    from jaxdllm.data import save_char_tokenizer
    from jaxdllm.models.transformer import Transformer
    from jaxdllm.train import TrainConfig, setup

    config = TrainConfig.from_dict({"model": TEACHERS[kind]})
    model = Transformer(setup.build_model_config(config, setup.load_tokenizer(config)), config.run_options(),
                        rngs=nnx.Rngs(0))
    save_pretrained(model, directory)
    save_char_tokenizer(directory, model_max_length=TEACHERS[kind]["max_position"])
    return directory


def _toml_value(value) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)  # strings, numbers and booleans are spelled alike in JSON and TOML


def write_toml(recipe: dict, path: Path) -> Path:
    path.write_text("".join(f"[{section}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items())
                            for section, values in recipe.items()))
    return path


def _sums(tree) -> tuple[float, float]:
    """`(sum, sum of |x|)` in float64 of a replicated pytree (every process holds all of it)."""
    import numpy as np

    leaves = jax.tree.leaves(tree)
    assert all(leaf.is_fully_replicated for leaf in leaves)
    local = [np.asarray(leaf.addressable_data(0), np.float64) for leaf in leaves]
    return float(sum(x.sum() for x in local)), float(sum(np.abs(x).sum() for x in local))


def train(recipe: dict, mesh=None) -> dict:
    from jaxdllm.train import TrainConfig, Trainer

    trainer = Trainer(TrainConfig.from_dict({**recipe, **COMMON}), mesh=mesh)
    init_sum, _ = _sums(trainer.trainable)
    history = trainer.train()
    param_sum, param_abs_sum = _sums(trainer.params())
    trained_sum, trained_abs_sum = _sums(trainer.trainable)
    return {"mesh": dict(trainer.mesh.shape), "rows_per_process": trainer.batch_config.rows_per_shard,
            "steps": [r["step"] for r in history], "losses": [r["loss"] for r in history],
            "grad_norms": [r["grad_norm"] for r in history], "param_sum": param_sum, "param_abs_sum": param_abs_sum,
            "trained_sum": trained_sum, "trained_abs_sum": trained_abs_sum, "init_trained_sum": init_sum}


def distill(recipe: dict, name: str, workdir: Path) -> None:
    """`jaxdllm distill generate|trajectories` over the job (every process runs it; process 0 writes)."""
    from jaxdllm.cli import main

    command = DISTILL_COMMAND[recipe["data"]["source"]]
    toml = write_toml({**recipe, **COMMON}, workdir / f"{name}.process{jax.process_index()}.toml")
    code = main(["distill", command, str(toml), "--no-progress"])
    assert code == 0, f"jaxdllm distill {command} exited with {code}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--workdir", required=True, help="the job's shared folder (distillation files)")
    parser.add_argument("--teachers", required=True, help="the parent's tiny teacher checkpoints")
    parser.add_argument("--recipes", default="all", help="comma-separated recipe names (default: all)")
    parser.add_argument("--one-device", default="", help="recipes to train again on one device of this process")
    parser.add_argument("--port", type=int)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--num-processes", type=int, default=1)
    args = parser.parse_args(argv)

    jax.config.update("jax_default_matmul_precision", "highest")  # as in tests/conftest.py
    if args.port is not None:
        from jaxdllm.distributed import JoinSpec, initialize

        initialize(JoinSpec(f"127.0.0.1:{args.port}", args.num_processes, args.process_id),
                   initialization_timeout_s=120)

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    every = recipes(Path(args.teachers), workdir)
    names = list(every) if args.recipes == "all" else args.recipes.split(",")
    result = {"process_index": jax.process_index(), "process_count": jax.process_count(),
              "device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
              "recipes": {}, "one_device": {}}
    for name in names:
        if "distill" in every[name]:
            distill(every[name], name, workdir)
        result["recipes"][name] = train(every[name])
    if args.one_device:
        from jaxdllm.sharding import make_mesh

        for name in args.one_device.split(","):
            result["one_device"][name] = train(every[name], mesh=make_mesh(devices=jax.devices()[:1]))
    with open(args.out, "w") as f:
        json.dump(result, f)
    if args.port is not None:
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
