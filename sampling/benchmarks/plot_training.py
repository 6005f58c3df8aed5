"""A training run's curves from its `metrics.jsonl`: every logged loss term and the masked-token
accuracy against the step, one panel each, as a PNG.

    python -m sampling.benchmarks.plot_training runs/dparallel-tiny/metrics.jsonl --out checkpoints/X/training_curve.png
"""

from __future__ import annotations

from jaxdllm.extras import exit_if_missing
import argparse
import json
from pathlib import Path

PANELS = ("loss", "ce", "entropy", "ar_loss", "ntp_loss", "masked_loss", "mlm_loss", "consistency_loss", "denoise_loss",
          "encoder_loss", "masked_accuracy", "ntp_accuracy", "ar_accuracy",
          "noisy_accuracy", "corrupted_accuracy", "masking_rate", "expert_load_max", "expert_load_cv")


def main(argv=None) -> None:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.plot_training")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", help="metrics.jsonl of a run")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in Path(args.metrics).read_text().splitlines() if line.strip()]
    train = [r for r in records if "loss" in r]  # not the step-0 teacher-agreement record
    panels = [p for p in PANELS if all(p in r for r in train)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    steps = [r["step"] for r in train]
    for ax, name in zip(axes[0], panels):
        ax.plot(steps, [r[name] for r in train], lw=1.2)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(args.title or str(Path(args.metrics).parent))
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
