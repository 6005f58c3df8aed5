"""Measure peak host memory and wall time of `from_pretrained` on a random checkpoint.

    python -m sampling.benchmarks.measure_import --size-gb 1 --out results/import_memory.json

Writes a random LLaDA-layout or HF-layout checkpoint of about `--size-gb` on disk (sharded
into several safetensors files), then imports it in a fresh subprocess that reports its peak
resident memory (`ru_maxrss`) before and after the import. The JSON holds both, the bytes
on disk and the import time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from sampling.benchmarks.report import write_report


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _child(path: str, dtype: str | None) -> None:
    """Runs in the subprocess: import jax, note the baseline peak, import, note the peak."""
    import jax
    from flax import nnx

    from jaxdllm.checkpoint.hf_io import from_pretrained
    from sampling.benchmarks.report import device_facts

    jax.numpy.zeros(1).block_until_ready()  # initialise the backend before the baseline
    base = _peak_rss_bytes()
    t0 = time.perf_counter()
    model = from_pretrained(path, dtype=dtype)
    jax.block_until_ready(jax.tree.leaves(nnx.state(model)))
    seconds = time.perf_counter() - t0
    print(json.dumps({"baseline_peak_rss": base, "peak_rss": _peak_rss_bytes(), "import_seconds": seconds,
                      "facts": device_facts()}))


def write_random_checkpoint(path: Path, size_gb: float, shard_gb: float) -> dict:
    """A random fp32 LLaDA-layout checkpoint of about `size_gb`, in `shard_gb` files."""
    from jaxdllm.checkpoint.hf_config import config_to_hf
    from jaxdllm.checkpoint.hf_names import tensor_table
    from jaxdllm.models.config import ModelConfig
    from safetensors.numpy import save_file

    base = ModelConfig.preset("tiny-llada", vocab_size=32000, embed_dim=1024, num_heads=8, num_kv_heads=8,
                              head_dim=128, mlp_dim=4096)
    per_layer = (base.replace(num_layers=2).num_params - base.replace(num_layers=1).num_params)
    fixed = base.replace(num_layers=1).num_params - per_layer
    layers = max(1, round((size_gb * 1e9 / 4 - fixed) / per_layer))
    config = base.replace(num_layers=layers)
    rng = np.random.default_rng(0)
    path.mkdir(parents=True, exist_ok=True)
    shard, shard_bytes, files, weight_map = {}, 0, [], {}

    def flush():
        nonlocal shard, shard_bytes
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, str(path / name), metadata={"format": "pt"})
        files.append(name)
        weight_map.update({k: name for k in shard})
        shard, shard_bytes = {}, 0

    for t in tensor_table(config):
        shard[t.name] = rng.standard_normal(t.hf_shape, dtype=np.float32) * 0.02
        shard_bytes += shard[t.name].nbytes
        if shard_bytes >= shard_gb * 1e9:
            flush()
    if shard:
        flush()
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(config_to_hf(config)))
    return {"num_params": config.num_params, "num_layers": layers, "files": len(files),
            "disk_bytes": sum((path / f).stat().st_size for f in files)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--shard-gb", type=float, default=0.3)
    parser.add_argument("--dtype", default=None, help="import dtype (default: as stored, float32)")
    parser.add_argument("--out", default="results/import_memory.json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.dtype)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        info = write_random_checkpoint(Path(tmp) / "ckpt", args.size_gb, args.shard_gb)
        cmd = [sys.executable, "-m", "sampling.benchmarks.measure_import", "--child", str(Path(tmp) / "ckpt")]
        if args.dtype:
            cmd += ["--dtype", args.dtype]
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env.pop("XLA_FLAGS", None)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        child = json.loads(out.stdout.strip().splitlines()[-1])
        facts = child.pop("facts")  # the child's (CPU) backend: this process never starts one
        child["process_seconds"] = time.perf_counter() - t0
    result = {**info, **child, "dtype": args.dtype or "float32",
              "import_peak_over_baseline": child["peak_rss"] - child["baseline_peak_rss"]}
    result["peak_over_baseline_div_disk"] = result["import_peak_over_baseline"] / info["disk_bytes"]
    print(json.dumps(write_report(args.out, result, facts=facts), indent=2))  # JSON only: one measurement
    return 0


if __name__ == "__main__":
    sys.exit(main())
