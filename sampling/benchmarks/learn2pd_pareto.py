"""Learn2PD against the samplers a user would otherwise pick, on the task suite's held-out prompts:
accuracy, NFE and answer tokens per forward of every setting (one Pareto plot), and NFE against
`gen_length` with and without end-of-text prediction (EoTP).

    python -m sampling.benchmarks.learn2pd_pareto --model checkpoints/tasks-llada-small \\
        --out checkpoints/tasks-llada-small/learn2pd

The filter is the one saved beside the model (`learn2pd_filter.safetensors`, `jaxdllm distill
learn2pd`). Every setting decodes the same `--n` held-out prompts per task (`split="test"`, seed
1234: the model card's prompts) through `jaxdllm.eval.evaluate` (float32, batches of 100), so
the numbers are `jaxdllm eval`'s, and a rerun resumes from the decoded items in `--items`.

1. The suite at the checkpoint's own canvas (`gen_length` 16, one block): LLaDA one token per
   step (the baseline), Fast-dLLM's threshold rule, dParallel's entropy threshold, Prophet, and
   Learn2PD at several filter thresholds with and without EoTP.
2. EoTP at length: `gen_length` 16, 32 and 48 in blocks of 16 on the tasks whose prompts leave
   room for 48 tokens in the model's 64 positions (copy, sort, add, perm): LLaDA, Fast-dLLM
   0.9 (also with `stop_at_eos`, the training-free way to skip the end-of-text fill), Learn2PD
   0.96 with and without EoTP.

Writes `<out>.json` and `<out>.png`.
"""

from __future__ import annotations

from jaxdllm.extras import exit_if_missing
import argparse
import json
import time
from pathlib import Path

from sampling.benchmarks.report import write_report

SUITE = ("copy", "reverse", "sort", "add", "perm", "pick3")
LONG_FIT = ("copy", "sort", "add", "perm")  # prompts of at most 16 tokens: 16 + 48 <= 64 positions
FAMILIES = {"llada": ("black", "-o"), "threshold 0.9": ("tab:blue", "-s"),  # part 2: color, line style
            "threshold 0.9 stop_at_eos": ("tab:blue", ":s"), "learn2pd 0.96": ("tab:red", "-*"),
            "learn2pd 0.96 no EoTP": ("tab:red", "--*")}


def suite_samplers(gen: int, block: int) -> dict:
    """The labelled settings of part 1 (`gen` tokens in blocks of `block`)."""
    from jaxdllm.decoding import SamplerConfig

    base = dict(gen_length=gen, block_length=block)
    out = {"llada (1 token/step)": SamplerConfig(**base, steps=gen)}
    for tau in (0.7, 0.9, 0.95):
        out[f"threshold {tau:g}"] = SamplerConfig(**base, policy="threshold", threshold=tau)
    for tau in (0.5, 1.0, 1.5):
        out[f"entropy {tau:g}"] = SamplerConfig(**base, policy="entropy", entropy_threshold=tau)
    out["prophet"] = SamplerConfig(**base, steps=gen, policy="prophet")
    for tau in (0.5, 0.8, 0.9, 0.96, 0.99):
        out[f"learn2pd {tau:g}"] = SamplerConfig(**base, steps=gen, policy="learn2pd", filter_threshold=tau)
    for tau in (0.9, 0.96):
        out[f"learn2pd {tau:g} no EoTP"] = SamplerConfig(**base, steps=gen, policy="learn2pd", filter_threshold=tau,
                                                         eot_prediction=False)
    return out


def length_samplers(gens: list[int], block: int) -> dict:
    """The labelled settings of part 2: four samplers at each `gen_length`."""
    from jaxdllm.decoding import SamplerConfig

    out = {}
    for g in gens:
        base = dict(gen_length=g, block_length=block)
        out[f"llada G={g}"] = SamplerConfig(**base, steps=g)
        out[f"threshold 0.9 G={g}"] = SamplerConfig(**base, policy="threshold", threshold=0.9)
        # the training-free way to skip the end-of-text fill: a row stops once EOS and all before it are decided
        out[f"threshold 0.9 stop_at_eos G={g}"] = SamplerConfig(**base, policy="threshold", threshold=0.9,
                                                                stop_at_eos=True)
        out[f"learn2pd 0.96 G={g}"] = SamplerConfig(**base, steps=g, policy="learn2pd", filter_threshold=0.96)
        out[f"learn2pd 0.96 no EoTP G={g}"] = SamplerConfig(**base, steps=g, policy="learn2pd", filter_threshold=0.96,
                                                            eot_prediction=False)
    return out


def _rows(report: dict) -> dict:
    """`{label: {task or "mean": {accuracy, mean_nfe, answer_tokens_per_forward, n}}}` without timings
    and samples."""
    keep = ("n", "accuracy", "mean_nfe", "answer_tokens_per_forward")
    return {label: {task: {k: row[k] for k in keep} for task, row in rows.items()}
            for label, rows in report["results"].items()}


def plot(data: dict, path: Path) -> None:
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    families = {"llada": ("black", "o"), "threshold": ("tab:blue", "s"), "entropy": ("tab:green", "^"),
                "prophet": ("tab:purple", "D"), "learn2pd": ("tab:red", "*")}
    suite = data["suite"]["results"]
    for ax, panel in zip(axes.flat, ["mean", *SUITE]):
        for label, rows in suite.items():
            family = label.split()[0]
            color, marker = families.get(family, ("tab:gray", "x"))
            hollow = "no EoTP" in label
            r = rows[panel]
            ax.scatter(r["answer_tokens_per_forward"], 100 * r["accuracy"], color=color, marker=marker, s=60,
                       facecolors="none" if hollow else color)
            ax.annotate(label.replace("learn2pd", "L2PD").replace(" (1 token/step)", ""),
                        (r["answer_tokens_per_forward"], 100 * r["accuracy"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_title("suite mean" if panel == "mean" else panel)
        ax.set_xlabel("answer tokens per forward")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
    ax = axes.flat[-1]
    length = data["length"]
    for family, (color, style) in FAMILIES.items():
        xs = length["gen_lengths"]
        ys = [length["results"][f"{family} G={g}"]["mean"]["mean_nfe"] for g in xs]
        ax.plot(xs, ys, style, color=color, label=family, mfc="none" if "no EoTP" in family else color)
    ax.set_yscale("log")
    ax.set_yticks([1, 2, 4, 8, 16, 32, 48])
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("gen_length (blocks of 16)")
    ax.set_ylabel("mean NFE (copy, sort, add, perm)")
    ax.set_title("end-of-text prediction at length")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"{data['model']}: Learn2PD against training-free samplers ({data['n']} held-out prompts per task)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tables(data: dict) -> str:
    """The card's Markdown tables: per-task accuracy and NFE of every part-1 setting with the suite
    mean, then part 2's mean NFE and accuracy per `gen_length`."""
    suite = data["suite"]["results"]
    head = "| setting | " + " | ".join(SUITE) + " | suite mean accuracy | answer tokens / forward |"
    lines = [head, "|" + "---|" * (len(SUITE) + 3)]
    for label, rows in suite.items():
        cells = [f"{100 * rows[t]['accuracy']:.1f} ({rows[t]['mean_nfe']:.2f})" for t in SUITE]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {100 * rows['mean']['accuracy']:.1f} | "
                     f"{rows['mean']['answer_tokens_per_forward']:.2f} |")
    length = data["length"]
    gens = length["gen_lengths"]
    lines += ["", "| sampler | " + " | ".join(f"G = {g}: NFE (accuracy)" for g in gens) + " |",
              "|" + "---|" * (len(gens) + 1)]
    for family in FAMILIES:
        cells = []
        for g in gens:
            r = length["results"][f"{family} G={g}"]["mean"]
            cells.append(f"{r['mean_nfe']:.2f} ({100 * r['accuracy']:.1f})")
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    exit_if_missing(("matplotlib",), "eval", "the Learn2PD Pareto plot")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="checkpoints/tasks-llada-small")
    p.add_argument("--n", type=int, default=200, help="held-out prompts per task")
    p.add_argument("--out", help="writes <out>.json and <out>.png")
    p.add_argument("--items", default="runs/learn2pd-items", help="decoded items (a rerun resumes from them)")
    p.add_argument("--gen-lengths", default="16,32,48", help="part 2's gen_length values (blocks of 16)")
    p.add_argument("--tables-from", dest="tables_from",
                   help="print the Markdown tables of an earlier <out>.json and draw its <out>.png again")
    args = p.parse_args(argv)
    if args.tables_from:  # and the plot again beside it
        data = json.loads(Path(args.tables_from).read_text())
        print(tables(data))
        plot(data, Path(args.tables_from).with_suffix(".png"))
        return

    import jaxdllm
    from jaxdllm.eval import evaluate, resolve_tasks
    from jaxdllm.eval.evaluate import weights_version
    from jaxdllm.decoding.policies.learn2pd import filter_facts

    if not args.out:
        p.error("--out is required (or --tables-from)")
    model_dir = jaxdllm.checkpoint_dir(args.model)
    out = Path(args.out)
    model = jaxdllm.from_pretrained(model_dir, dtype="float32")
    tokenizer = jaxdllm.Tokenizer.from_pretrained(model_dir)
    data = {"model": model_dir.name, "n": args.n, "seed": 1234, "filter": filter_facts(model_dir)}
    parts = {"suite": (suite_samplers(16, 16), SUITE),
             "length": (length_samplers([int(g) for g in args.gen_lengths.split(",")], 16), LONG_FIT)}
    for part, (samplers, tasks) in parts.items():
        params = {label: jaxdllm.policy_params(model_dir, config) for label, config in samplers.items()}
        start = time.perf_counter()
        report = evaluate(model, tokenizer, resolve_tasks(",".join(tasks)), samplers, n=args.n, seed=1234,
                          batch_size=100, out=Path(args.items) / part, model_id=str(model_dir.resolve()),
                          model_version=weights_version(model_dir), policy_params=params, progress=False,
                          log=lambda line: print(line, flush=True))
        data[part] = {"tasks": list(tasks), "settings": report["settings"], "results": _rows(report),
                      "seconds": time.perf_counter() - start}
    data["length"]["gen_lengths"] = [int(g) for g in args.gen_lengths.split(",")]
    write_report(out, data, plot, quiet=True)
    print(tables(data))
    print(f"wrote {out}.json and {out}.png")


if __name__ == "__main__":
    main()
