"""Multiverse's fork-and-merge decoding against the sequential model trained on the same data, on the same
held-out `parts` prompts, in one process (JSON + PNG).

Models: `checkpoints/tasks-qwen2-small-multiverse` (the shipped causal model fine-tuned with the
AR-to-Multiverse curriculum: `training/multiverse_parts_cpu.toml`) and the sequential baseline (the same
model and data budget on tag-free text: `training/multiverse_parts_sequential_cpu.toml`, exported to
`runs/parts-sequential/model`). Rows, all greedy:

* `multiverse`: the Multiverse model on the Multiverse canvas (`policy="multiverse"`): forks at `</Goal>`
  into one row per outline, merges at the last `</Path>`.
* `multiverse-sequential`: the Multiverse model one token per forward under its training mask and
  positions (`sampling/benchmarks/multiverse_parts_eval.py`: every step recomputes the whole text; its
  time is not comparable and is not reported), fed the same tokens as the fork/merge decoder (`<Path>k:`,
  and `<Path>` or `<Conclusion>` after `</Path>`).
* `sequential`: the sequential model, next-token decoding with a KV cache (`jacobi`, window 1).

Per row: accuracy (`PartsTask.check`: every part's steps and the combination), final-answer accuracy,
sequential forwards per answer (the longest chain of forwards, the prefill that chooses the first token
included), answer tokens per answer (the merged text up to EOS), their ratio (the degree of parallelism:
tokens per sequential forward), the share of answers that forked, and wall time per answer at batch 1 and
batch 8 (compiled beforehand, best of `--repeats`).

    python -m sampling.benchmarks.benchmark_multiverse --out sampling/results/multiverse_cpu
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import jaxdllm
from jaxdllm.data.multiverse_tags import TAG_IDS
from jaxdllm.data.parts_task import PartsTask
from jaxdllm.decoding import SamplerConfig
from jaxdllm.decoding.policies.multiverse import settings_for
from jaxdllm.eval.runner import left_pad
from jaxdllm.extras import exit_if_missing
from jaxdllm.tokenizer import Tokenizer
from sampling.benchmarks.multiverse_parts_eval import evaluate as evaluate_uncached
from sampling.benchmarks.multiverse_parts_eval import TRAIN_INSTANCES, held_out_prompts
from sampling.benchmarks.report import write_report
from sampling.benchmarks.timing import timed

MULTIVERSE = "checkpoints/tasks-qwen2-small-multiverse"
SEQUENTIAL = "runs/parts-sequential/model"
GEN_LENGTH = 150   # the longest answer (4 parts, Multiverse format) is 131 tokens with its EOS


def configs(tokenizer) -> dict:
    return {"multiverse": SamplerConfig(gen_length=GEN_LENGTH, policy="multiverse", prompt_bucket=8, newlines=False,
                                        stop_at_eos=True, **settings_for(tokenizer)),
            "sequential": SamplerConfig(gen_length=GEN_LENGTH, policy="jacobi", window=1, prompt_bucket=8,
                                        stop_at_eos=True)}


def measure(name: str, path: str, config, prompts: list[str], task: PartsTask, repeats: int, batch: int) -> dict:
    model = jaxdllm.from_pretrained(path)
    tokenizer = Tokenizer.from_pretrained(path)
    eos = model.config.eos_token_id
    encoded = [tokenizer.encode(p) for p in prompts]
    ids, mask = left_pad(encoded, model.config.pad_token_id or 0)
    texts, nfe, lengths = [], [], []
    for lo in range(0, len(ids), batch):
        res = jaxdllm.generate(model, ids[lo:lo + batch], config, attention_mask=mask[lo:lo + batch])
        for row, n in zip(np.asarray(res.generated), np.asarray(res.nfe)):
            tokens = row.tolist()
            length = tokens.index(eos) + 1 if eos in tokens else len(tokens)
            texts.append(tokenizer.decode(tokens[:length - 1] if eos in tokens else tokens, skip_special_tokens=True))
            nfe.append(int(n))
            lengths.append(length)
    correct = [task.check(p, t) for p, t in zip(prompts, texts)]
    final = [task.final_answer(p, t) == task.answer(p) for p, t in zip(prompts, texts)]
    run = lambda lo, hi: jaxdllm.generate(model, ids[lo:hi], config, attention_mask=mask[lo:hi])  # noqa: E731
    singles, eights = 16, [(lo, lo + 8) for lo in range(0, min(len(ids), 64) - 7, 8)]
    batch1 = timed(lambda: [run(i, i + 1) for i in range(singles)], repeats=repeats).min_s / singles
    batch8 = timed(lambda: [run(lo, hi) for lo, hi in eights], repeats=repeats).min_s / (8 * len(eights))
    row = dict(sampler=name, model=Path(path).name, prompts=len(prompts), accuracy=float(np.mean(correct)),
               final_answer_accuracy=float(np.mean(final)), sequential_forwards=float(np.mean(nfe)),
               answer_tokens=float(np.mean(lengths)), tokens_per_sequential_forward=float(np.sum(lengths) / np.sum(nfe)),
               forked=float(np.mean(["<Parallel>" in t for t in texts])), batch1_s_per_answer=batch1,
               batch8_s_per_answer=batch8, preset=repr(config), examples=[dict(prompt=p, response=t, correct=c)
                                                                         for p, t, c in list(zip(prompts, texts, correct))[:3]])
    print({k: v for k, v in row.items() if k not in ("examples", "preset")}, flush=True)
    return row


def uncached_row(prompts, task) -> dict:
    """The Multiverse model one token per forward under its training mask (every step recomputes the text)."""
    r = evaluate_uncached(MULTIVERSE, prompts, task, GEN_LENGTH, batch=100)
    row = dict(sampler="multiverse-sequential", model=Path(MULTIVERSE).name, prompts=len(prompts),
               accuracy=r["accuracy"], final_answer_accuracy=r["final_answer_accuracy"],
               sequential_forwards=r["mean_response_tokens"], answer_tokens=r["mean_response_tokens"],
               tokens_per_sequential_forward=1.0, formats=r["formats"])
    print(row, flush=True)
    return row


def plot(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    rows = result["rows"]
    names = [r["sampler"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    axes[0].bar(names, [100 * r["accuracy"] for r in rows], color="tab:blue")
    axes[0].set_title("accuracy (%)")
    axes[1].bar(names, [r["sequential_forwards"] for r in rows], color="tab:orange")
    axes[1].set_title("sequential forwards per answer")
    timed_rows = [r for r in rows if "batch1_s_per_answer" in r]
    x = np.arange(len(timed_rows))
    axes[2].bar(x - 0.2, [1e3 * r["batch1_s_per_answer"] for r in timed_rows], 0.4, label="batch 1")
    axes[2].bar(x + 0.2, [1e3 * r["batch8_s_per_answer"] for r in timed_rows], 0.4, label="batch 8")
    axes[2].set_xticks(x, [r["sampler"] for r in timed_rows])
    axes[2].set_title("ms per answer")
    axes[2].legend()
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"Multiverse fork/merge vs the sequential model, parts task ({result['prompts']} held-out prompts), "
                 f"{result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.benchmark_multiverse")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--sequential-model", default=SEQUENTIAL)
    p.add_argument("--out", default="sampling/results/multiverse_cpu")
    args = p.parse_args(argv)
    t0, load_before = time.perf_counter(), os.getloadavg()
    task = PartsTask()
    prompts = held_out_prompts(task, args.prompts, train_instances=TRAIN_INSTANCES, train_seed=0, seed=1)
    tokenizer = Tokenizer.from_pretrained(MULTIVERSE)
    assert tokenizer.token_to_id("<Think>") == TAG_IDS["<Think>"]
    cfg = configs(tokenizer)
    rows = [measure("multiverse", MULTIVERSE, cfg["multiverse"], prompts, task, args.repeats, batch=50),
            uncached_row(prompts, task),
            measure("sequential", args.sequential_model, cfg["sequential"], prompts, task, args.repeats, batch=50)]
    result = {"task": "parts", "prompts": len(prompts), "rows": rows, "wall_s": time.perf_counter() - t0,
              "load_average_before": load_before, "load_average_after": os.getloadavg()}
    write_report(args.out, result, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
