"""A causal model turned into a parallel decoder, every published way this project has, side by side in one
process on the same prompts (JSON + PNG).

Rows (all from the shipped causal model `tasks-qwen2-small` or a conversion of it by a CPU recipe):
  ar              the causal model, one token per forward (Jacobi decoding with a window of 1; greedy)
  jacobi-forcing  its Jacobi Forcing version (`tasks-qwen2-small-jf`), the `jacobi-forcing` preset, n = 16
  medusa          its Medusa heads (`medusa_heads.safetensors` beside it), the `medusa` preset
  specdiff        its masked-diffusion drafter (`companions.json`), the `specdiff` preset
  sdar-b4         its SDAR conversion with blocks of 4 (`tasks-sdar-small`), the `sdar` preset (threshold 0.9)
  sdar-b4-static  the same model, `sdar-static` (one token per step)
  sdar-b4-eb      the same model, `sdar-eb` (JetEngine's entropy bound, 0.35)
  sdar-b8         its SDAR conversion with blocks of 8 (`tasks-sdar-b8-small`), `sdar` with blocks of 8
  sbd-low         its Set Block Decoding fine-tune (`tasks-qwen2-small-sbd`), `sbd` (gamma 0.1, blocks of 16)
  sbd-high        the same model, `sbd-high` (gamma 0.35)
  wedlm           its WeDLM conversion (`tasks-qwen2-small-wedlm`), the `wedlm` preset (window 16, tau 0.4, lambda 0.02)
  wedlm-0.2       the same model, tau 0.2 (the paper's GSM8K Pareto point's threshold; lambda 0.02)
  wedlm-one       the same model, one mask per step (tau 0: the paper's quality setting's rule, window 16)
  wedlm-ar        the same model decoded one token per forward by its next-token head (Jacobi, window 1)

The first four give AR's tokens by construction (exact); the conversions are new models, so their
accuracy is their own. For each row and task group (`suite`: the six card tasks, `long`: copy, reverse
and sort of 10-16 digits): accuracy over `--n-prompts` held-out prompts per task (one batch per group),
answer tokens (up to EOS) per forward, and tokens/s of the whole decoding at batch 1 (one prompt per
task, one call each, compiled beforehand) and batch 8 (the group's prompts in calls of 8). Each
conversion's training time is read from its `train_metrics.jsonl` (`elapsed_s` of the last step).

    python -m sampling.benchmarks.benchmark_conversions --out sampling/results/conversions_cpu
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

import jaxdllm
from jaxdllm.data import get_task, make_mixture
from jaxdllm.decoding import SamplerConfig
from jaxdllm.eval.runner import left_pad
from jaxdllm.eval.tasks import LONG, SUITE
from jaxdllm.extras import exit_if_missing
from jaxdllm.tokenizer import Tokenizer, answer_length, decode_response
from sampling.benchmarks.report import write_report
from sampling.benchmarks.timing import timed

GROUPS = {"suite": SUITE, "long": LONG}
GEN_LENGTH = 32  # the longest answer (16 digits + EOS) fits
CAUSAL = "checkpoints/tasks-qwen2-small"
# label -> (model directory, preset, overrides)
ROWS = {
    "ar": (CAUSAL, "jacobi", dict(window=1)),
    "jacobi-forcing": ("checkpoints/tasks-qwen2-small-jf", "jacobi-forcing", dict(window=16)),
    "medusa": (CAUSAL, "medusa", {}),
    "specdiff": (CAUSAL, "specdiff", {}),
    "sdar-b4": ("checkpoints/tasks-sdar-small", "sdar", dict(block_length=4, steps=32)),
    "sdar-b4-static": ("checkpoints/tasks-sdar-small", "sdar-static", dict(block_length=4, steps=32)),
    "sdar-b4-eb": ("checkpoints/tasks-sdar-small", "sdar-eb", dict(block_length=4, steps=32)),
    "sdar-b8": ("checkpoints/tasks-sdar-b8-small", "sdar", dict(block_length=8, steps=32)),
    "sbd-low": ("checkpoints/tasks-qwen2-small-sbd", "sbd", {}),
    "sbd-high": ("checkpoints/tasks-qwen2-small-sbd", "sbd-high", {}),
    "wedlm": ("checkpoints/tasks-qwen2-small-wedlm", "wedlm", {}),
    "wedlm-0.2": ("checkpoints/tasks-qwen2-small-wedlm", "wedlm", dict(entropy_threshold=0.2)),
    "wedlm-one": ("checkpoints/tasks-qwen2-small-wedlm", "wedlm", dict(entropy_threshold=0.0)),
    "wedlm-ar": ("checkpoints/tasks-qwen2-small-wedlm", "jacobi", dict(window=1)),
}


def training_seconds(model_dir: Path) -> float | None:
    """`elapsed_s` of the last line of the model's `train_metrics.jsonl` (None without one)."""
    path = model_dir / "train_metrics.jsonl"
    if not path.exists():
        return None
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines[-1].get("elapsed_s") if lines else None


def measure(label: str, model_dir: Path, config: SamplerConfig, n_prompts: int, repeats: int) -> list[dict]:
    model = jaxdllm.from_pretrained(model_dir)
    tokenizer = Tokenizer.from_pretrained(model_dir)
    params = jaxdllm.policy_params(model_dir, config)
    eos, pad = model.config.eos_token_id, model.config.pad_token_id or 0
    out = []
    for group, tasks in GROUPS.items():
        examples = make_mixture(tasks, n_prompts, 1234, split="test")
        ids, mask = left_pad([tokenizer.encode(e.prompt) for e in examples], pad)
        width = ids.shape[1]
        singles = [next(i for i, e in enumerate(examples) if e.task == t) for t in tasks]
        run = lambda lo, hi: jaxdllm.generate(model, ids[lo:hi], config, attention_mask=mask[lo:hi],  # noqa: E731
                                              policy_params=params)
        res = run(0, len(ids))
        tokens = np.asarray(res.tokens)[:, width:]
        lengths = [answer_length(row, eos) for row in tokens]
        correct = [bool(get_task(e.task).check(e.prompt, decode_response(tokenizer, row, eos)))
                   for e, row in zip(examples, tokens)]
        chunks = [(lo, lo + 8) for lo in range(0, len(ids) - 7, 8)]
        batch_s = timed(lambda: [run(lo, hi) for lo, hi in chunks], repeats=repeats).min_s
        single_s = timed(lambda: [run(i, i + 1) for i in singles], repeats=repeats).min_s
        nfe = np.asarray(res.nfe)
        per_task = {}
        for task in tasks:
            rows = [i for i, e in enumerate(examples) if e.task == task]
            per_task[task] = dict(accuracy=float(np.mean([correct[i] for i in rows])),
                                  tokens_per_forward=sum(lengths[i] for i in rows) / float(nfe[rows].sum()))
        drafter = None if res.drafter_forwards is None else float(res.drafter_forwards.sum() / nfe.sum())
        out.append(dict(
            sampler=label, model=model_dir.name, preset=repr(config), tasks=group, rows=len(examples),
            accuracy=float(np.mean(correct)), tokens_per_forward=sum(lengths) / float(nfe.sum()),
            task_mean_tokens_per_forward=float(np.mean([t["tokens_per_forward"] for t in per_task.values()])),
            drafter_forwards_per_forward=drafter, per_task=per_task,
            batch1_tok_s=sum(lengths[i] for i in singles) / single_s,
            batch8_tok_s=sum(lengths[i] for lo, hi in chunks for i in range(lo, hi)) / batch_s,
            training_s=training_seconds(model_dir) if model_dir.name != Path(CAUSAL).name else None))
        print(json.dumps({k: v for k, v in out[-1].items() if k not in ("per_task", "preset")}), flush=True)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    rows = result["rows"]
    names = [n for n in ROWS if any(r["sampler"] == n for r in rows)]
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.6))
    width = 0.8 / len(GROUPS)
    for g, group in enumerate(GROUPS):
        pick = [next((r for r in rows if r["sampler"] == n and r["tasks"] == group), None) for n in names]
        x = np.arange(len(names)) + g * width
        for ax, key in zip(axes, ("accuracy", "task_mean_tokens_per_forward", "batch1_tok_s", "batch8_tok_s")):
            ax.bar(x, [r[key] if r else 0.0 for r in pick], width, label=group)
    for ax, title in zip(axes, ("accuracy", "answer tokens per forward (mean over the tasks)",
                                "tokens/s, batch 1", "tokens/s, batch 8")):
        ax.set_xticks(np.arange(len(names)) + width / 2, names, fontsize=8, rotation=30)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"The causal model tasks-qwen2-small and its parallel decoders, greedy, {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.benchmark_conversions")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(ROWS), help="which rows, comma-separated")
    p.add_argument("--n-prompts", type=int, default=50, help="held-out prompts per task")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default="sampling/results/conversions_cpu")
    args = p.parse_args(argv)
    t0, load_before = time.perf_counter(), os.getloadavg()
    rows = []
    for label in args.rows.split(","):
        model_dir, preset, overrides = ROWS[label]
        config = SamplerConfig.preset(preset, gen_length=GEN_LENGTH, **overrides)
        rows += measure(label, Path(model_dir), config, args.n_prompts, args.repeats)
    # the host's 1/5/15-minute load averages: tokens/s compare rows fairly only on an otherwise idle machine
    result = {"gen_length": GEN_LENGTH, "n_prompts_per_task": args.n_prompts, "rows": rows,
              "wall_s": time.perf_counter() - t0, "load_average_before": load_before, "load_average_after": os.getloadavg()}
    write_report(args.out, result, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
