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
forward. Writes `<out>.json` (after every setting) and `<out>.png`; run again with the same `--out`,
it reuses the settings already measured for a model from the same folder (same prompts and lengths).

More models (ablations) join with `--model LABEL=DIR` (repeatable); `--block-length` decodes in
blocks (dParallel's semi-autoregressive setting) and `--fast-thresholds` sweeps Fast-dLLM's
threshold. The JSON's `matched` section gives, per model, the fewest mean forwards among its
settings whose accuracy is within `--tolerance` points of the base's one-token-per-step accuracy,
and the ratios against one token per step and against the base's best parallel setting:

    python -m sampling.benchmarks.distill_pareto --base checkpoints/chain-llada-tiny \
        --distilled checkpoints/chain-llada-tiny-dparallel --tasks chain --gen-length 64 --block-length 32,64 \
        --fast-thresholds 0.5,0.7,0.9,0.95 --thresholds 0.05,0.1,0.2,0.35,0.5,0.75,1.0 \
        --model "w=0 (SFT)=runs/chain-sft/model" --out checkpoints/chain-llada-tiny-dparallel/pareto
"""

from __future__ import annotations

from jaxdllm.extras import exit_if_missing
import argparse
import json
import time
from pathlib import Path

from sampling.benchmarks.report import write_report

TASKS = ("copy", "reverse", "sort", "add", "perm", "pick3")


ONE_STEP = "llada (1 token/step)"


def samplers(gen: int, thresholds: list[float], blocks: tuple[int, ...] = (),
             fast_thresholds: tuple[float, ...] = (0.9,)) -> dict:
    """`{setting name: SamplerConfig}`: one token per step, Fast-dLLM's threshold at each of
    `fast_thresholds`, dParallel's entropy threshold at each of `thresholds`; `gen` tokens in
    blocks of each of `blocks` (default: one block; with several, each name says its blocks)."""
    from jaxdllm.decoding import SamplerConfig

    out = {}
    for block in blocks or (gen,):
        tag = "" if len(blocks) <= 1 else (", one block" if block == gen else f", blocks of {block}")
        out[ONE_STEP + tag] = SamplerConfig(gen_length=gen, block_length=block, steps=gen)
        for tau in fast_thresholds:
            out[f"threshold {tau:g}{tag}"] = SamplerConfig(gen_length=gen, block_length=block, policy="threshold",
                                                          threshold=tau)
        for tau in thresholds:
            out[f"entropy {tau:g}{tag}"] = SamplerConfig(gen_length=gen, block_length=block, policy="entropy",
                                                        entropy_threshold=tau)
    return out


def suite_row(results: list[dict]) -> dict:
    """Suite totals from per-task results: mean accuracy, mean NFE, answer tokens per forward."""
    nfe = sum(r["mean_nfe"] * r["n"] for r in results)
    tokens = sum(r["answer_tokens_per_forward"] * r["mean_nfe"] * r["n"] for r in results)
    n = sum(r["n"] for r in results)
    return {"accuracy": sum(r["accuracy"] for r in results) / len(results), "mean_nfe": nfe / n,
            "answer_tokens_per_forward": tokens / nfe}


def matched(data: dict, tolerance: float) -> dict:
    """Per model: its fewest mean forwards (suite) among settings within `tolerance` points of the
    base's one-token-per-step accuracy (its best block setting), with the ratios against one token
    per step (`gen_length` forwards) and against the base's best parallel (threshold or entropy) setting."""
    base_rows = data["models"]["base"]
    reference = max(r["suite"]["accuracy"] for name, r in base_rows.items() if name.startswith(ONE_STEP))
    target = reference - tolerance / 100

    def best(rows):  # the fewest forwards among the parallel settings at or above the floor
        ok = [(r["suite"]["mean_nfe"], name) for name, r in rows.items()
              if r["suite"]["accuracy"] >= target - 1e-9 and not name.startswith(ONE_STEP)]
        return min(ok) if ok else None

    base_best = best(base_rows)
    out = {"base_one_token_per_step_accuracy": reference, "accuracy_floor": target,
           "base_best_parallel": base_best and {"setting": base_best[1], "mean_nfe": base_best[0],
                                                "accuracy": base_rows[base_best[1]]["suite"]["accuracy"]}}
    for label, rows in data["models"].items():
        found = best(rows)
        if found is None:
            out[label] = None
            continue
        nfe, name = found
        out[label] = {"setting": name, "mean_nfe": nfe, "accuracy": rows[name]["suite"]["accuracy"],
                      "fewer_forwards_than_one_token_per_step": data["gen_length"] / nfe,
                      "fewer_forwards_than_base_best_parallel": base_best[0] / nfe if base_best else None}
    return out


def markdown_table(data: dict) -> str:
    """Every (model, setting) as a Markdown table row: per task accuracy / mean NFE / answer tokens
    per forward, then the suite's mean accuracy and NFE and the forwards saved against one token per step."""
    tasks = data["tasks"]
    lines = ["| model | sampler | " + " | ".join(tasks) + (" | suite |" if len(tasks) > 1 else " | fewer forwards |"),
             "|---|---|" + "---|" * (len(tasks) + 1)]
    for label, rows in data["models"].items():
        one_step = data["gen_length"]
        for name, row in rows.items():
            cells = [f"{100 * r['accuracy']:.1f} % / {r['mean_nfe']:.2f} / {r['answer_tokens_per_forward']:.2f}"
                     for r in (row["tasks"][t] for t in tasks)]
            suite = row["suite"]
            last = (f"{100 * suite['accuracy']:.1f} % / {suite['mean_nfe']:.2f} / " if len(tasks) > 1 else "")
            lines.append(f"| {label} | {name} | " + " | ".join(cells) + f" | {last}{one_step / suite['mean_nfe']:.1f}x |")
    return "\n".join(lines)


def plot(data: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    panels = ["suite", *data["tasks"]] if len(data["tasks"]) > 1 else ["suite"]
    fig, axes = (plt.subplots(2, 4, figsize=(16, 7.5)) if len(panels) > 1 else plt.subplots(1, 1, figsize=(8, 5.5)))
    axes = np.atleast_1d(axes)
    styles = {"base": ("tab:blue", "o"), "distilled": ("tab:red", "s")}
    others = iter([("tab:green", "^"), ("tab:purple", "v"), ("tab:orange", "D"), ("tab:brown", "P"),
                   ("tab:gray", "X")])
    styles.update({m: next(others, ("tab:gray", "x")) for m in data["models"] if m not in styles})
    for ax, panel in zip(axes.flat, panels):
        for model, rows in data["models"].items():
            color, marker = styles[model]
            pts = [(r["suite"] if panel == "suite" else r["tasks"][panel], name) for name, r in rows.items()]
            xs = [p["answer_tokens_per_forward"] for p, _ in pts]
            ys = [100 * p["accuracy"] for p, _ in pts]
            hollow = ["one block" in name for _, name in pts]  # several block settings: one block hollow
            for want_hollow in (False, True):
                sel = [i for i, h in enumerate(hollow) if h == want_hollow]
                if sel:
                    ax.scatter([xs[i] for i in sel], [ys[i] for i in sel], marker=marker, alpha=0.8,
                               facecolors="none" if want_hollow else color, edgecolors=color,
                               label=None if want_hollow and len(sel) < len(hollow) else model)
            for (p, name), x, y in zip(pts, xs, ys):
                if model == "base" and (name.startswith("llada") or name in ("entropy 0.5", "threshold 0.9")):
                    ax.annotate(name.replace(" (1 token/step)", ""), (x, y), fontsize=7, alpha=0.7,
                                xytext=(3, 3), textcoords="offset points")
        ax.set_title(panel if panel != "suite" else
                     ("suite (mean accuracy)" if len(data["tasks"]) > 1 else data["tasks"][0]))
        ax.set_xlabel("answer tokens per forward")
        ax.set_ylabel("accuracy / validity (%)")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(title="hollow: one block" if len(data.get("block_lengths", [])) > 1 else None)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    blocks = data.get("block_lengths", [data["gen_length"]])
    fig.suptitle(f"Base vs certainty-forcing distilled: {data['n']} held-out prompts per task,\ngen "
                 f"{data['gen_length']} in " + " or ".join("one block" if b == data["gen_length"] else f"blocks of {b}"
                                                         for b in blocks))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.distill_pareto")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the teacher / base checkpoint")
    parser.add_argument("--distilled", help="the distilled checkpoint (omitted: the base alone, to measure it first)")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--gen-length", type=int, default=16)
    parser.add_argument("--block-length", default="", help="decode in blocks of this length; several: "
                        "32,64 (default: one block)")
    parser.add_argument("--thresholds", default="0.05,0.1,0.2,0.35,0.5,0.75,1.0,1.5",
                        help="dParallel entropy thresholds")
    parser.add_argument("--fast-thresholds", default="0.9", help="Fast-dLLM confidence thresholds")
    parser.add_argument("--model", action="append", default=[], metavar="LABEL=DIR",
                        help="another model to measure (an ablation); repeatable")
    parser.add_argument("--tolerance", type=float, default=1.0,
                        help="accuracy points below the base's one token per step that count as matched")
    parser.add_argument("--out", required=True, help="output path without extension (.json, .png)")
    args = parser.parse_args(argv)
    extra = dict(m.rsplit("=", 1) if "=" in m else parser.error(f"--model needs LABEL=DIR, got {m!r}")
                 for m in args.model)

    from jaxdllm.checkpoint import from_pretrained
    from jaxdllm.tokenizer import Tokenizer
    from jaxdllm.train.task_accuracy import evaluate_tasks

    tasks = [t for t in args.tasks.split(",") if t]
    blocks = tuple(int(b) for b in args.block_length.split(",") if b)
    configs = samplers(args.gen_length, [float(t) for t in args.thresholds.split(",") if t], blocks,
                       tuple(float(t) for t in args.fast_thresholds.split(",") if t))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    checkpoints = {"base": args.base, **({"distilled": args.distilled} if args.distilled else {}), **extra}
    data = {"n": args.n, "gen_length": args.gen_length, "block_lengths": list(blocks or (args.gen_length,)),
            "tasks": tasks, "models": {}, "checkpoints": checkpoints}
    earlier = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").is_file() else {}
    same_run = all(earlier.get(k) == data[k] for k in ("n", "gen_length", "block_lengths", "tasks"))
    for label, directory in checkpoints.items():
        # A model measured by an earlier run of this command (same folder, prompts and lengths) is reused.
        done = (earlier["models"].get(label, {}) if same_run and earlier.get("checkpoints", {}).get(label) == directory
                else {})
        data["models"][label] = {name: done[name] for name in configs if name in done}
        if len(data["models"][label]) == len(configs):
            print(f"{label}: every setting reused from {out.with_suffix('.json')}", flush=True)
            continue
        model, tokenizer = from_pretrained(directory, dtype="float32"), Tokenizer.from_pretrained(directory)
        for name, config in configs.items():
            if name in data["models"][label]:
                continue
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
            data = write_report(out, data)  # after every setting: a rerun reuses what is done
    data["matched"] = matched(data, args.tolerance)
    data = write_report(out, data)
    for label, row in data["matched"].items():
        if label in data["models"]:
            print(f"matched accuracy {label:12s} " + ("no setting within the tolerance" if row is None else
                  f"{row['setting']}: NFE {row['mean_nfe']:.2f}, {row['fewer_forwards_than_one_token_per_step']:.1f}x "
                  f"fewer than one token per step" + (f", {row['fewer_forwards_than_base_best_parallel']:.2f}x fewer "
                  "than the base's best parallel setting" if row["fewer_forwards_than_base_best_parallel"] else "")))
    print(markdown_table(data))
    write_report(out, data, plot)


if __name__ == "__main__":
    main()
