"""Accuracy against answer tokens per forward, base model against its certainty-forcing
(dParallel) distillation, on the task suite's held-out prompts: the distilled model card's
table and Pareto plot.

    python -m sampling.benchmarks.distill_pareto --base checkpoints/tasks-llada-small \\
        --distilled checkpoints/tasks-llada-small-dparallel --out checkpoints/tasks-llada-small-dparallel/pareto

Each model decodes the same `--n` held-out prompts per task (`split="test"`, seed 1234, the base
card's prompts) in one `gen_length`-token block with: LLaDA low-confidence, one token per step
(the baseline); Fast-dLLM's threshold 0.9; and dParallel's entropy-threshold sampler at every
`--thresholds` value. Per task and over the suite it records accuracy (each task's checker, so
validity for the many-answer tasks), mean NFE and answer tokens (up to and including EOS) per
forward. Writes `<out>.json` (after every setting) and `<out>.png`.
"""

from __future__ import annotations

from jaxdllm.extras import exit_if_missing
import argparse
import json
import time
from pathlib import Path

TASKS = ("copy", "reverse", "sort", "add", "perm", "pick3")


def samplers(gen: int, thresholds: list[float]) -> dict:
    from jaxdllm.decoding import SamplerConfig

    out = {"llada (1 token/step)": SamplerConfig(gen_length=gen, block_length=gen, steps=gen),
           "threshold 0.9": SamplerConfig(gen_length=gen, block_length=gen, policy="threshold", threshold=0.9)}
    for tau in thresholds:
        out[f"entropy {tau:g}"] = SamplerConfig(gen_length=gen, block_length=gen, policy="entropy",
                                                entropy_threshold=tau)
    return out


def suite_row(results: list[dict]) -> dict:
    """Suite totals from per-task results: mean accuracy, mean NFE, answer tokens per forward."""
    nfe = sum(r["mean_nfe"] * r["n"] for r in results)
    tokens = sum(r["answer_tokens_per_forward"] * r["mean_nfe"] * r["n"] for r in results)
    n = sum(r["n"] for r in results)
    return {"accuracy": sum(r["accuracy"] for r in results) / len(results), "mean_nfe": nfe / n,
            "answer_tokens_per_forward": tokens / nfe}


def plot(data: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = ["suite", *data["tasks"]]
    fig, axes = plt.subplots(2, 4, figsize=(16, 7.5))
    styles = {"base": ("tab:blue", "o"), "distilled": ("tab:red", "s")}
    for ax, panel in zip(axes.flat, panels):
        for model, rows in data["models"].items():
            color, marker = styles.get(model, ("tab:gray", "^"))
            pts = [(r["suite"] if panel == "suite" else r["tasks"][panel], name) for name, r in rows.items()]
            xs = [p["answer_tokens_per_forward"] for p, _ in pts]
            ys = [100 * p["accuracy"] for p, _ in pts]
            ax.scatter(xs, ys, color=color, marker=marker, label=model, alpha=0.8)
            for (p, name), x, y in zip(pts, xs, ys):
                if name.startswith("llada") or name in ("entropy 0.5", "threshold 0.9"):
                    ax.annotate(name.replace(" (1 token/step)", ""), (x, y), fontsize=7, alpha=0.7,
                                xytext=(3, 3), textcoords="offset points")
        ax.set_title(panel if panel != "suite" else "suite (mean accuracy)")
        ax.set_xlabel("answer tokens per forward")
        ax.set_ylabel("accuracy / validity (%)")
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"Base vs certainty-forcing distilled: {data['n']} held-out prompts per task, "
                 f"gen {data['gen_length']} in one block")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.distill_pareto")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the teacher / base checkpoint")
    parser.add_argument("--distilled", required=True, help="the distilled checkpoint")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--gen-length", type=int, default=16)
    parser.add_argument("--thresholds", default="0.05,0.1,0.2,0.35,0.5,0.75,1.0,1.5")
    parser.add_argument("--out", required=True, help="output path without extension (.json, .png)")
    args = parser.parse_args(argv)

    from jaxdllm.checkpoint import from_pretrained
    from jaxdllm.tokenizer import Tokenizer
    from jaxdllm.train.task_accuracy import evaluate_tasks

    tasks = [t for t in args.tasks.split(",") if t]
    configs = samplers(args.gen_length, [float(t) for t in args.thresholds.split(",") if t])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"n": args.n, "gen_length": args.gen_length, "tasks": tasks, "models": {},
            "checkpoints": {"base": args.base, "distilled": args.distilled}}
    for label, directory in (("base", args.base), ("distilled", args.distilled)):
        model, tokenizer = from_pretrained(directory, dtype="float32"), Tokenizer.from_pretrained(directory)
        data["models"][label] = {}
        for name, config in configs.items():
            start = time.perf_counter()
            results = evaluate_tasks(model, tokenizer, tasks, config, n=args.n)
            row = {"tasks": {r["task"]: {k: r[k] for k in ("accuracy", "mean_nfe", "answer_tokens_per_forward",
                                                           "n", "samples")} for r in results},
                   "suite": suite_row(results), "seconds": time.perf_counter() - start}
            data["models"][label][name] = row
            s = row["suite"]
            print(f"{label:9s} {name:22s} suite accuracy {s['accuracy']:.3f}  NFE {s['mean_nfe']:.2f}  "
                  f"tokens/forward {s['answer_tokens_per_forward']:.2f}  | " +
                  "  ".join(f"{t} {r['accuracy']:.2f}/{r['mean_nfe']:.1f}" for t, r in row["tasks"].items()),
                  flush=True)
            out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    plot(data, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
