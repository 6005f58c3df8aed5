"""Weight-only int8 against float weights on a shipped model: the card's samplers on every suite
task with held-out prompts, both runs in one process. Writes
`sampling/results/int8_accuracy_cpu.json` (accuracy, NFE and answer tokens per forward per task
and sampler, and the differences) and `int8_accuracy_cpu.png`.

    python -m sampling.benchmarks.int8_accuracy [--model tasks-llada-small] [--n 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

import jaxdllm
from jaxdllm.eval import evaluate, resolve_tasks
from jaxdllm.extras import exit_if_missing
from sampling.benchmarks.report import write_report

METRICS = ("accuracy", "mean_nfe", "answer_tokens_per_forward")
OUT = Path(__file__).resolve().parents[1] / "results" / "int8_accuracy_cpu.json"


def main():
    exit_if_missing(("matplotlib",), "eval", "the int8 accuracy plot")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tasks-llada-small")
    parser.add_argument("--n", type=int, default=200, help="held-out prompts per task")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()

    tasks = resolve_tasks("suite")
    runs, models = {}, {}
    for weights in ("float32", "int8"):
        extra = {"quantization": "int8"} if weights == "int8" else {}
        model, tokenizer, defaults = jaxdllm.load(args.model, dtype="float32", **extra)
        g = defaults.gen_length
        samplers = {"llada": jaxdllm.SamplerConfig.preset("llada", gen_length=g, block_length=g, steps=g),
                    "threshold": jaxdllm.SamplerConfig.preset("fast-dllm-parallel", gen_length=g, block_length=g)}
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            result = evaluate(model, tokenizer, tasks, samplers, n=args.n, seed=args.seed, batch_size=100,
                              out=out, progress=False, log=lambda line: None)
        runs[weights] = {(setting, task): r for setting, per_task in result["results"].items()
                         for task, r in per_task.items() if task != "mean"}
        models[weights] = model
        print(f"{weights}: {time.perf_counter() - start:.0f} s")

    ids = np.asarray(tokenizer([f"reverse {k:04d}=" for k in range(0, 10000, 397)]).ids)
    a, b = np.asarray(models["float32"](ids)), np.asarray(models["int8"](ids))
    rows = []
    for key, f in runs["float32"].items():
        q = runs["int8"][key]
        rows.append({"sampler": key[0], "task": key[1],
                     **{f"{m}_float32": f[m] for m in METRICS},
                     **{f"{m}_int8": q[m] for m in METRICS},
                     "accuracy_points": round(100 * (q["accuracy"] - f["accuracy"]), 2)})
        print(f"{key[0]:10s} {key[1]:8s} accuracy {f['accuracy']:.3f} -> {q['accuracy']:.3f}  "
              f"NFE {f['mean_nfe']:.2f} -> {q['mean_nfe']:.2f}")
    weight_bytes = {w: int(sum(x.nbytes for x in jax.tree.leaves(nnx.state(m, nnx.Param)))) for w, m in models.items()}
    report = {"model": args.model, "n": args.n, "seed": args.seed, "tasks": [t.name for t in tasks],
              "what": "held-out suite prompts; float32 compute; int8 = weight-only int8 linear layers and LM head",
              "max_abs_accuracy_points": max(abs(r["accuracy_points"]) for r in rows),
              "logits_max_abs_diff": float(np.abs(a - b).max()), "logits_max_abs": float(np.abs(a).max()),
              "argmax_agreement": float(np.mean(a.argmax(-1) == b.argmax(-1))),
              "parameter_bytes": weight_bytes, "rows": rows}
    print(f"largest accuracy change {report['max_abs_accuracy_points']} points; logits within "
          f"{report['logits_max_abs_diff']:.4f} of {report['logits_max_abs']:.1f}")
    write_report(OUT, report, plot)


def plot(report: dict, path: Path) -> None:
    """Accuracy per task, float32 against int8 weights, one panel per sampler."""
    import matplotlib.pyplot as plt

    rows = report["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5), sharey=True)
    for ax, sampler in zip(axes, ("llada", "threshold")):
        mine = [r for r in rows if r["sampler"] == sampler]
        x = np.arange(len(mine))
        ax.bar(x - 0.2, [r["accuracy_float32"] for r in mine], 0.4, label="float32")
        ax.bar(x + 0.2, [r["accuracy_int8"] for r in mine], 0.4, label="int8 weights")
        ax.set_xticks(x, [r["task"] for r in mine])
        ax.set_title(f"{report['model']}, {sampler}")
    axes[0].set_ylabel(f"accuracy ({report['n']} held-out prompts)")
    axes[0].legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
