"""Draft-and-verify decoding of the shipped causal checkpoints, side by side in one process (JSON + PNG).

Samplers (all greedy and exact: each gives AR's tokens, which the script checks row by row):
  ar                    Jacobi decoding with a window of 1 (one forward per token)
  jacobi                plain Jacobi decoding, window n = 16
  jacobi-forcing        the `jacobi-forcing` preset at n = 16 (multi-block + rejection recycling)
  lookahead             Lookahead decoding's published 7B setting (N 5, W 7, G 7)
  lookahead+prompt      the same with the pool seeded from the prompt (`pool_from_prompt`)
  medusa                the `medusa` preset: the published 63-node tree over the model's Medusa heads
  bpd                   blockwise parallel decoding on the same heads (a chain of their top-1)
  token-recycling       the `token-recycling` preset (a 64-node tree from each row's top-8 table)
  specdiff              the `specdiff` preset: a masked-diffusion drafter (a second model in the loop)
                        drafts 8 tokens, 4 per drafter forward, adaptive length
  specdiff-1fwd         the same with all 8 drafted in one drafter forward
  diffuspec             the `diffuspec` preset: 4 beams over one drafter forward's lattice

Medusa and BPD run where the model has heads beside it (`medusa_heads.safetensors`), the drafter
rows where its `companions.json` names a drafter. Drafter rows also report the drafter's forwards
per target forward.

For each model and task: answer tokens per forward over `--n-prompts` held-out prompts per task
(decoded as one batch per task group), and tokens/s of the whole decoding at batch 1 (one prompt
per task, one call each, compiled beforehand) and at batch 8 (the group's prompts in calls of 8).

    python -m sampling.benchmarks.benchmark_draft_verify --out sampling/results/draft_verify_cpu
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from jaxdllm.extras import exit_if_missing
import jaxdllm
from jaxdllm.data import make_mixture
from jaxdllm.decoding import SamplerConfig
from jaxdllm.eval.runner import left_pad
from jaxdllm.eval.tasks import LONG, SUITE
from jaxdllm.errors import CheckpointError, ConfigError
from jaxdllm.tokenizer import Tokenizer, answer_length
from sampling.benchmarks.report import write_report
from sampling.benchmarks.timing import timed

GROUPS = {"suite": SUITE, "long": LONG}
GEN_LENGTH = 32  # the longest answer (16 digits + EOS) fits
N = 16           # the Jacobi window


def samplers() -> dict[str, SamplerConfig]:
    g = GEN_LENGTH
    return {"ar": SamplerConfig.preset("jacobi", gen_length=g, window=1),
            "jacobi": SamplerConfig.preset("jacobi", gen_length=g, window=N),
            "jacobi-forcing": SamplerConfig.preset("jacobi-forcing", gen_length=g, window=N),
            "lookahead": SamplerConfig.preset("lookahead", gen_length=g),
            "lookahead+prompt": SamplerConfig.preset("lookahead", gen_length=g, pool_from_prompt=True),
            "medusa": SamplerConfig.preset("medusa", gen_length=g),
            "bpd": SamplerConfig.preset("bpd", gen_length=g),
            "token-recycling": SamplerConfig.preset("token-recycling", gen_length=g),
            "specdiff": SamplerConfig.preset("specdiff", gen_length=g),
            "specdiff-1fwd": SamplerConfig.preset("specdiff", gen_length=g, tokens_per_step=8),
            "diffuspec": SamplerConfig.preset("diffuspec", gen_length=g)}


def answers(tokens: np.ndarray, width: int, eos: int) -> list[list[int]]:
    return [list(row[width:width + answer_length(row[width:], eos)]) for row in tokens]


def measure(model_dir: Path, n_prompts: int, repeats: int) -> list[dict]:
    model = jaxdllm.from_pretrained(model_dir)
    tokenizer = Tokenizer.from_pretrained(model_dir)
    eos, pad = model.config.eos_token_id, model.config.pad_token_id or 0
    out = []
    for group, tasks in GROUPS.items():
        examples = make_mixture(tasks, n_prompts, 1234, split="test")
        ids, mask = left_pad([tokenizer.encode(e.prompt) for e in examples], pad)
        width = ids.shape[1]
        singles = [next(i for i, e in enumerate(examples) if e.task == t) for t in tasks]
        reference = None
        for name, config in samplers().items():
            try:
                params = jaxdllm.policy_params(model_dir, config)
            except (CheckpointError, ConfigError):
                continue  # no heads, or no drafter, beside this model
            run = lambda lo, hi: jaxdllm.generate(model, ids[lo:hi], config, attention_mask=mask[lo:hi],  # noqa: E731
                                                  policy_params=params)
            res = run(0, len(ids))  # every prompt of the group: the tokens and forwards
            got = answers(np.asarray(res.tokens), width, eos)
            reference = got if name == "ar" else reference
            chunks = [(lo, lo + 8) for lo in range(0, len(ids) - 7, 8)]
            # calls of 8 prompts (the warm-up compiles the batch-8 program)
            batch_s = timed(lambda: [run(lo, hi) for lo, hi in chunks], repeats=repeats).min_s
            batch_tokens = sum(len(got[i]) for lo, hi in chunks for i in range(lo, hi))
            one = [lambda i=i: run(i, i + 1) for i in singles]
            # one call per prompt, all prompts per sample (the warm-up compiles the batch-1 program)
            single_s = timed(lambda: [f() for f in one], repeats=repeats).min_s
            single_tokens = sum(len(got[i]) for i in singles)
            nfe = np.asarray(res.nfe)
            per_task = {}
            for task in tasks:
                rows = [i for i, e in enumerate(examples) if e.task == task]
                tokens = sum(len(got[i]) for i in rows)
                per_task[task] = dict(tokens_per_forward=tokens / float(nfe[rows].sum()),
                                      forwards_per_answer=float(nfe[rows].mean()))
            tokens = sum(len(a) for a in got)
            drafter = None if res.drafter_forwards is None else float(res.drafter_forwards.sum() / nfe.sum())
            out.append(dict(model=model_dir.name, tasks=group, sampler=name, rows=len(examples),
                            tokens_per_forward=tokens / float(nfe.sum()), per_task=per_task,
                            drafter_forwards_per_forward=drafter,
                            tokens_fed_per_forward=_fed(config),
                            batch8_tok_s=batch_tokens / batch_s, batch1_tok_s=single_tokens / single_s,
                            same_as_ar=sum(a == b for a, b in zip(got, reference)) / len(got)))
            print(json.dumps({k: v for k, v in out[-1].items() if k != "per_task"}), flush=True)
    return out


def _fed(config: SamplerConfig) -> int:
    """Tokens one row feeds per forward (the compute a step costs, relative to AR's 1)."""
    return config.policy.layout().length


def task_mean(row: dict | None) -> float:
    """A row's tokens per forward averaged over its tasks (what the README and cards tabulate;
    `tokens_per_forward` is all answer tokens over all forwards of the group)."""
    if row is None:
        return 0.0
    return float(np.mean([t["tokens_per_forward"] for t in row["per_task"].values()]))


def plot(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    rows = result["rows"]
    models = sorted({r["model"] for r in rows})
    names = [n for n in samplers() if any(r["sampler"] == n for r in rows)]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    width = 0.8 / len(names)
    colors = plt.get_cmap("tab20").colors
    groups = [(m, g) for m in models for g in GROUPS]
    for k, name in enumerate(names):
        pick = [next((r for r in rows if r["model"] == m and r["tasks"] == g and r["sampler"] == name), None)
                for m, g in groups]
        x = np.arange(len(groups)) + k * width
        for ax, key in zip(axes, ("task_mean_tokens_per_forward", "batch1_tok_s", "batch8_tok_s")):
            ax.bar(x, [task_mean(r) if key.startswith("task_mean") else r[key] if r else 0.0 for r in pick], width,
                   label=name, color=colors[k % len(colors)])
    labels = [f"{m.replace('tasks-', '')}\n{g}" for m, g in groups]
    for ax, title in zip(axes, ("answer tokens per forward (mean over the tasks)", "tokens/s, batch 1 (one call per prompt)",
                                "tokens/s, batch 8")):
        ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, labels, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylim(0, 1.6 * axes[0].get_ylim()[1])  # room for the legend above the bars
    axes[0].legend(fontsize=7, ncol=3, loc="upper left")
    fig.suptitle(f"Draft-and-verify decoding, greedy (same tokens as AR), {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.benchmark_draft_verify")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="checkpoints/tasks-qwen2-small,checkpoints/tasks-qwen2-small-jf")
    p.add_argument("--n-prompts", type=int, default=50, help="held-out prompts per task")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="sampling/results/draft_verify_cpu")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    for model in args.models.split(","):
        rows += measure(Path(model), args.n_prompts, args.repeats)
    result = {"gen_length": GEN_LENGTH, "n_prompts_per_task": args.n_prompts,
              "samplers": {k: repr(v.policy) for k, v in samplers().items()}, "rows": rows,
              "wall_s": time.perf_counter() - t0}
    write_report(args.out, result, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
