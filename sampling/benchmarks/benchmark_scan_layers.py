"""Compile time and memory of a 32-layer model, unrolled against `scan_layers` (with each remat
policy): the training step and the compiled sampler.

    python -m sampling.benchmarks.benchmark_scan_layers [--layers 32] [--width 256] [--out sampling/results/scan_layers_cpu]

Each variant runs in its own subprocess (fresh compilation caches, its own peak RSS). For the
train step (masked-diffusion SFT loss, AdamW, batch x seq tokens) it records trace+lower and
compile seconds, XLA's planned temporary memory (`compiled.memory_analysis()`), the process's
peak resident memory, and the mean time of a few steps after the first; for the sampler, the
first-call (compile) and second-call seconds of `jaxdllm.generate` with the LLaDA policy. The
JSON is written after every variant, then a PNG.
"""

from __future__ import annotations

from jaxdllm.extras import exit_if_missing
import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from sampling.benchmarks.report import device_facts, write_report

VARIANTS = [  # (name, scan_layers, remat)
    ("unrolled", False, "none"),
    ("unrolled + remat dots", False, "dots"),
    ("scan", True, "none"),
    ("scan + remat dots", True, "dots"),
    ("scan + remat full", True, "full"),
]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def measure(layers: int, width: int, batch: int, seq: int, scan: bool, remat: str, steps: int) -> dict:
    """Runs in the subprocess."""
    import jax
    import numpy as np

    import jaxdllm
    from jaxdllm.data import build_char_tokenizer, make_batch_iterator, make_mixture
    from jaxdllm.train import TrainConfig, make_objective, make_optimizer, make_train_step, split_for_training
    from jaxdllm.train.setup import batch_config_for, init_model, init_optimizer, make_training_mesh
    from sampling.benchmarks.timing import timed

    model = {"preset": "tiny-llada", "embed_dim": width, "num_layers": layers, "num_heads": 4, "num_kv_heads": 4,
             "head_dim": width // 4, "mlp_dim": 3 * width, "max_position": 512, "attention_impl": "xla",
             "scan_layers": scan, "remat": remat}
    config = TrainConfig.from_dict({"model": model, "data": {"examples_per_task": 200, "seq_len": seq,
                                                             "batch_size": batch},
                                    "train": {"steps": 10}, "mesh": {"data": 1}})
    tokenizer = build_char_tokenizer()
    mesh = make_training_mesh(config.mesh)
    m = init_model(config, tokenizer, mesh)
    split = split_for_training(m, config.lora, mesh)
    tx, _ = make_optimizer(config.optim, 10)
    opt_state, opt_shardings = init_optimizer(tx, split.trainable, mesh)
    step = make_train_step(split, make_objective("mdm_sft", {}, m.config), tx, opt_shardings, mesh)
    batches = make_batch_iterator(make_mixture(config.data.tasks, 200, 0), tokenizer, batch_config_for(config))
    batch = {k: np.asarray(v) for k, v in next(batches).items()}
    key = jax.random.key(0)
    out = {"params": m.config.num_params}

    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
        lowered = step.lower(split.trainable, split.frozen, opt_state, batch, key)
    out["train_lower_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = lowered.compile()
    out["train_compile_s"] = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    out["train_temp_mb"] = mem.temp_size_in_bytes / 2**20
    out["train_argument_mb"] = mem.argument_size_in_bytes / 2**20
    state = [split.trainable, opt_state]

    def train_step():  # each call continues from the last one's parameters and optimizer state
        state[0], state[1], metrics = compiled(state[0], split.frozen, state[1], batch, key)
        return metrics

    t = timed(train_step, repeats=steps)  # the mean of the steps after the first
    out["train_step_s"] = float(np.mean(t.samples_s))
    out["loss"] = float(t.out["loss"])
    trainable = state[0]
    out["peak_rss_after_train_mb"] = _peak_rss_mb()

    model = split.params_model(trainable)
    prompts = np.tile(np.asarray(tokenizer.encode("reverse 4821="), np.int32), (4, 1))
    config = jaxdllm.SamplerConfig(gen_length=32, block_length=8, steps=32, prompt_bucket=16)
    t = timed(lambda: jaxdllm.generate(model, prompts, config), repeats=1)
    out["sample_first_s"], out["sample_second_s"] = t.first_s, t.min_s
    out["sample_nfe"] = int(t.out.nfe[0])
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    names = list(results["variants"])
    rows = [results["variants"][n] for n in names]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [("train step: lower + compile (s)", [r["train_lower_s"] + r["train_compile_s"] for r in rows]),
              ("train step: XLA temp memory (MiB)", [r["train_temp_mb"] for r in rows]),
              ("sampler: first call, incl. compile (s)", [r["sample_first_s"] for r in rows])]
    for ax, (title, values) in zip(axes, panels):
        ax.barh(names, values, color=["#888888" if "unrolled" in n else "#3070b0" for n in names])
        ax.set_title(title, fontsize=10)
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.1f}", va="center", fontsize=8)
        ax.invert_yaxis()
    meta = results["setup"]
    fig.suptitle(f"{meta['layers']} layers, width {meta['width']}, batch {meta['batch']} x {meta['seq']} tokens, "
                 f"{meta['device']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.benchmark_scan_layers")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default="sampling/results/scan_layers_cpu")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        scan, remat = args.child.split(",")
        print(json.dumps(measure(args.layers, args.width, args.batch, args.seq, scan == "1", remat, args.steps)))
        return 0
    facts = device_facts()
    results = {"setup": {"layers": args.layers, "width": args.width, "batch": args.batch, "seq": args.seq,
                         "device": f"{facts['platform']} ({facts['device_count']} devices)",
                         "jax": facts["jax"]}, "variants": {}}
    out = Path(args.out)
    for name, scan, remat in VARIANTS:
        cmd = [sys.executable, "-m", "sampling.benchmarks.benchmark_scan_layers", "--child", f"{int(scan)},{remat}",
               "--layers", str(args.layers), "--width", str(args.width), "--batch", str(args.batch),
               "--seq", str(args.seq), "--steps", str(args.steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        results["variants"][name] = row
        print(f"{name:24s} lower {row['train_lower_s']:6.1f}s  compile {row['train_compile_s']:6.1f}s  "
              f"temp {row['train_temp_mb']:7.1f} MiB  step {row['train_step_s']:.2f}s  peak RSS "
              f"{row['peak_rss_mb']:.0f} MiB  sampler first call {row['sample_first_s']:.1f}s", flush=True)
        results = write_report(out, results, facts=facts)
    write_report(out, results, plot, facts=facts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
