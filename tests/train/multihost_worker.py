"""Worker for tests/train/test_train_multihost.py: train a tiny model for a few steps, write the losses.

    python tests/train/multihost_worker.py OUT.json                            # one process, all local devices
    python tests/train/multihost_worker.py OUT.json --port P --process-id I --num-processes N

The parent sets XLA_FLAGS (the local device count) and JAX_PLATFORMS in the environment; with
`--port` this process joins a `jax.distributed` cluster on 127.0.0.1 with CPU (gloo) collectives.
Every process writes `{"process_index", "process_count", "device_count", "local_device_count",
"losses", "grad_norms", "param_sum", "param_abs_sum"}` to OUT.json (the parent gives each its own
path).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import jax  # noqa: E402

MODEL = {"preset": "tiny-llada", "embed_dim": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2,
         "head_dim": 16, "mlp_dim": 64, "max_position": 64, "attention_impl": "xla"}
RECIPE = {"model": MODEL,
          "data": {"source": "tasks", "examples_per_task": 200, "seq_len": 32, "batch_size": 8},
          "optim": {"lr": 3e-3, "warmup_steps": 2},
          "train": {"steps": 4}, "log": {"every": 1, "progress": False}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--port", type=int)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--num-processes", type=int, default=1)
    args = parser.parse_args(argv)

    jax.config.update("jax_default_matmul_precision", "highest")  # as in tests/conftest.py
    if args.port is not None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=args.num_processes,
                                   process_id=args.process_id, initialization_timeout=120)

    import numpy as np
    from jaxdllm.train import TrainConfig, Trainer

    trainer = Trainer(TrainConfig.from_dict(RECIPE))
    history = trainer.train()

    # Parameters are replicated (fsdp = tensor = 1): every process holds a full copy.
    leaves = jax.tree.leaves(trainer.params())
    assert all(leaf.is_fully_replicated for leaf in leaves)
    local = [np.asarray(leaf.addressable_data(0), np.float64) for leaf in leaves]
    result = {"process_index": jax.process_index(), "process_count": jax.process_count(),
              "device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
              "mesh": dict(trainer.mesh.shape),
              "rows_per_process": trainer.batch_config.rows_per_shard,
              "steps": [r["step"] for r in history],
              "losses": [r["loss"] for r in history],
              "grad_norms": [r["grad_norm"] for r in history],
              "param_sum": float(sum(x.sum() for x in local)),
              "param_abs_sum": float(sum(np.abs(x).sum() for x in local))}
    with open(args.out, "w") as f:
        json.dump(result, f)
    if args.port is not None:
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
