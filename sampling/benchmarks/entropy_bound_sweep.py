"""The EB-sampler (`--preset eb`) at several entropy bounds beside one token per step, Fast-dLLM's
threshold rule and dParallel's entropy threshold, on the same held-out prompts of a shipped model:
accuracy against mean NFE (JSON + PNG).

    python -m sampling.benchmarks.entropy_bound_sweep --model tasks-llada-small --tasks suite \\
        --out sampling/results/entropy_bound/tasks-llada-small

Each family is one `jaxdllm eval` run (its command is printed and stored in the JSON), on the
checkpoint's own canvas (`jaxdllm_sampler.json`: `gen_length`, blocks):

    jaxdllm eval --model M --tasks T --n N --preset llada                                  # one token per step
    jaxdllm eval --model M --tasks T --n N --preset fast-dllm-parallel --sweep threshold=...
    jaxdllm eval --model M --tasks T --n N --preset dparallel --sweep entropy_threshold=...
    jaxdllm eval --model M --tasks T --n N --preset eb --sweep entropy_bound=...

The runs' folders (`items.jsonl`, `eval.json`, `pareto.png`) go under `--runs` (default
`runs/entropy_bound/<model>`), so a rerun resumes after the last finished batch. Writes
`<out>.json` (every setting's per-task and mean accuracy, mean NFE and answer tokens per forward,
and the commands) and `<out>.png` (accuracy against mean NFE: the mean over the tasks, then one
panel per task).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jaxdllm.extras import exit_if_missing
from sampling.benchmarks.report import write_report

FAMILIES = (  # (label, preset, the swept setting or None, the flag giving its values)
    ("one token per step", "llada", None, None),
    ("threshold (Fast-dLLM)", "fast-dllm-parallel", "threshold", "thresholds"),
    ("entropy (dParallel)", "dparallel", "entropy_threshold", "entropy_thresholds"),
    ("entropy bound (EB)", "eb", "entropy_bound", "bounds"),
)


def eval_commands(args) -> dict[str, list[str]]:
    """`{family label: jaxdllm eval argv}` (without the leading `jaxdllm`)."""
    out = {}
    for label, preset, setting, flag in FAMILIES:
        argv = ["eval", "--model", args.model, "--tasks", args.tasks, "--n", str(args.n), "--preset", preset]
        if setting is not None:
            values = getattr(args, flag)
            if not values:
                continue
            argv += ["--sweep", f"{setting}={values}"]
        out[label] = argv + ["--out", str(Path(args.runs) / preset), "--no-progress"]
    return out


def plot(data: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    panels = ["mean", *data["tasks"]] if len(data["tasks"]) > 1 else [data["tasks"][0]]
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    size = (4.2 * cols, 3.4 * rows) if cols > 1 else (7.5, 5.0)
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        for i, (family, settings) in enumerate(data["families"].items()):
            pts = [(data["results"][s][panel], s) for s in settings]
            xs = [p["mean_nfe"] for p, _ in pts]
            ys = [100 * p["accuracy"] for p, _ in pts]
            ax.plot(xs, ys, "o-" if len(pts) > 1 else "s", color=f"C{i}", label=family, alpha=0.85)
            for (_, s), x, y in zip(pts, xs, ys):
                tag = s.split("=", 1)[1] if "=" in s else ""
                if tag:
                    ax.annotate(tag, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
        ax.set_xticks([t for t in (1, 1.5, 2, 3, 4, 6, 8, 10, 15, 20, 30, 40, 64, 100, 128, 256) if lo <= t <= hi])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title("mean over the tasks" if panel == "mean" else panel)
        ax.set_xlabel("mean NFE (forwards per prompt)")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3, which="both")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{data['model']}: {data['n']} held-out prompts per task, gen_length {data['gen_length']} in "
                 f"blocks of {data['block_length']}\nlabels: the swept value (threshold, entropy threshold, bound)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_table(data: dict) -> str:
    """One row per setting: accuracy % (mean NFE) per task, then the mean."""
    tasks = data["tasks"]
    extra = ["mean"] if len(tasks) > 1 else []
    lines = ["| setting | " + " | ".join(tasks + extra) + " |", "|---|" + "---|" * (len(tasks) + len(extra))]
    for label, row in data["results"].items():
        cells = [f"{100 * row[t]['accuracy']:.1f} ({row[t]['mean_nfe']:.2f})" for t in tasks + extra]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_run(data: dict, family: str, command: list[str], prefix: str = "") -> None:
    """Run `jaxdllm <command>` (an eval with `--out`) and add its settings and results to `data`
    under `family` (each setting's label prefixed with `prefix`)."""
    from jaxdllm.cli import main as jaxdllm_main

    print("jaxdllm " + " ".join(command), flush=True)
    if jaxdllm_main(command) != 0:
        raise SystemExit(f"jaxdllm {' '.join(command)} failed")
    report = json.loads((Path(command[command.index("--out") + 1]) / "eval.json").read_text())
    keys = {label: prefix + label for label in report["results"]}
    data["commands"][family] = "jaxdllm " + " ".join(command)
    data["families"][family] = list(keys.values())
    data["settings"].update({keys[k]: v for k, v in report["settings"].items()})
    data["results"].update({keys[k]: v for k, v in report["results"].items()})
    data["tasks"] = [t for t in next(iter(report["results"].values())) if t != "mean"]


def save(data: dict, out: str | Path) -> None:
    """Print the table; write `<out>.json` and `<out>.png`."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    print(markdown_table(data))
    write_report(path, data, plot)


def main(argv=None) -> None:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.entropy_bound_sweep")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint folder or shipped name")
    parser.add_argument("--tasks", default="suite")
    parser.add_argument("--n", type=int, default=200, help="held-out prompts per task")
    parser.add_argument("--bounds", default="0.01,0.1,0.5,1.0", help="EB entropy bounds (nats)")
    parser.add_argument("--thresholds", default="0.7,0.9,0.95", help="Fast-dLLM confidence thresholds")
    parser.add_argument("--entropy-thresholds", default="0.1,0.5,1.0", help="dParallel entropy thresholds")
    parser.add_argument("--runs", help="folder of the eval runs (default: runs/entropy_bound/<model name>)")
    parser.add_argument("--out", required=True, help="output path without extension (.json, .png)")
    args = parser.parse_args(argv)
    args.runs = args.runs or str(Path("runs") / "entropy_bound" / Path(args.model).name)

    commands = eval_commands(args)
    data = {"model": Path(args.model).name, "n": args.n, "tasks": None, "commands": {}, "families": {},
            "settings": {}, "results": {}}
    for family, command in commands.items():
        add_run(data, family, command)
    first = next(iter(data["settings"].values()))  # every family runs on the checkpoint's canvas
    data["gen_length"] = int(first.split("gen_length=")[1].split(",")[0])
    data["block_length"] = int(first.split("block_length=")[1].split(",")[0])
    save(data, args.out)


if __name__ == "__main__":
    main()
