"""Teacher agreement during distillation, several runs side by side: from each run's
`metrics.jsonl` (`[log] agreement_every`), the share of training prompts where the student
writes the teacher's answer (with the teacher's sampler, and with the parallel sampler of
`[log] agreement_fast`) and that parallel sampler's mean forwards, against the step.

    python -m sampling.benchmarks.plot_agreement "certainty forcing=runs/chain-cf/metrics.jsonl" \\
        "w=0=runs/chain-sft/metrics.jsonl" --out checkpoints/chain-llada-tiny-dparallel/agreement.png

Writes the PNG and, beside it, a JSON of the plotted points.
"""

from __future__ import annotations

from jaxdllm.extras import exit_if_missing
import argparse
import json
from pathlib import Path

PANELS = (("teacher_agreement", "agreement, teacher's sampler"),
          ("fast_agreement", "agreement, parallel sampler"),
          ("fast_nfe", "parallel sampler: mean forwards"))


def read_curves(path: str | Path) -> dict:
    """`{metric: [(step, value), ...]}` for the agreement metrics logged in a `metrics.jsonl`."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return {key: [(r["step"], r[key]) for r in records if key in r] for key, _ in PANELS}


def main(argv=None) -> None:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.plot_agreement")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="LABEL=METRICS", help="a run's label and metrics.jsonl")
    parser.add_argument("--out", required=True, help="PNG to write (the JSON goes beside it)")
    parser.add_argument("--title", default="Agreement with the teacher's answers on training prompts")
    args = parser.parse_args(argv)
    runs = {}
    for item in args.runs:
        if "=" not in item:
            parser.error(f"expected LABEL=METRICS, got {item!r}")
        label, path = item.rsplit("=", 1)
        runs[label] = read_curves(path)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, t) for k, t in PANELS if any(curves[k] for curves in runs.values())]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels):
        for label, curves in runs.items():
            if curves[key]:
                steps, values = zip(*curves[key])
                ax.plot(steps, [100 * v if "agreement" in key else v for v in values], marker=".", lw=1.2,
                        label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel("% of prompts" if "agreement" in key else "forwards")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(args.title)
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    out.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
