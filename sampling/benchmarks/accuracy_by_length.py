"""Accuracy of `jaxdllm eval` runs by answer length and prompt length, side by side (JSON + PNG).

Reads the `items.jsonl` of several `jaxdllm eval --out DIR` runs of the task suite (one line per
prompt) and groups the prompts of each task by the digits of their answer (copy and reverse: the
digits of the prompt) and by the prompt's length in tokens. For a block-causal model the table also
gives where the answer starts inside its first block (prompt tokens mod the block), the quantity
the published block layout is about:

    python -m sampling.benchmarks.accuracy_by_length --model checkpoints/tasks-llada2-tiny --block 16 \\
        --run "left-padded, llada=runs/before/default" --run "published, llada=runs/after/default" \\
        --out sampling/results/block_layout/tasks_llada2_tiny

A `--run` is `LABEL=DIR` or `LABEL=DIR#SETTING`: SETTING names one of the samplers an eval run
evaluated (`eval.json` "settings"; default: the first). Records are matched to settings in the
order the run wrote them (setting by setting, task by task).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from sampling.benchmarks.report import write_report


def read_run(directory: Path, setting: str | None = None) -> list[dict]:
    """The item records of one setting of an eval run directory."""
    settings = list(json.loads((directory / "eval.json").read_text())["settings"])
    name = setting or settings[0]
    if name not in settings:
        raise SystemExit(f"{directory}: no setting {name!r} (it has {settings})")
    by_key: dict[str, list[dict]] = {}
    for line in (directory / "items.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_key.setdefault(record["key"], []).append(record)
    tasks = {r["task"] for records in by_key.values() for r in records}
    keys = list(by_key)  # first appearance: setting by setting, each over its tasks
    mine = keys[settings.index(name) * len(tasks):(settings.index(name) + 1) * len(tasks)]
    return [r for k in mine for r in by_key[k]]


def digits(prompt: str) -> int:
    match = re.search(r"(\d+)=$", prompt)
    return len(match.group(1)) if match else -1


def group(records: list[dict], count_tokens, block: int | None) -> dict:
    """`{task: {digits: {"n", "correct", "accuracy", "prompt_tokens", "offset", "mean_nfe"}}}`."""
    cells: dict = defaultdict(lambda: defaultdict(lambda: {"n": 0, "correct": 0, "nfe": 0, "prompt_tokens": set()}))
    for r in records:
        cell = cells[r["task"]][digits(r["id"])]
        cell["n"] += 1
        cell["correct"] += int(r["correct"])
        cell["nfe"] += r["nfe"]
        cell["prompt_tokens"].add(count_tokens(r["id"]))
    out = {}
    for task, by_digits in sorted(cells.items()):
        out[task] = {}
        for d, c in sorted(by_digits.items()):
            lengths = sorted(c["prompt_tokens"])
            out[task][d] = {"n": c["n"], "correct": c["correct"], "accuracy": c["correct"] / c["n"],
                            "mean_nfe": c["nfe"] / c["n"], "prompt_tokens": lengths,
                            "offset": [n % block for n in lengths] if block else None}
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({t for r in results.values() for t in r})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for label, by_task in results.items():
            cells = by_task.get(task, {})
            xs = sorted(cells, key=int)
            ax.plot([int(x) for x in xs], [100 * cells[x]["accuracy"] for x in xs], "o-", label=label, alpha=0.8)
            ax.set_xticks([int(x) for x in xs])
        ax.set(title=task, xlabel="answer digits", ylabel="accuracy (%)", ylim=(-5, 105))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the model folder (its tokenizer counts prompt tokens)")
    p.add_argument("--run", action="append", required=True, help="LABEL=DIR[#SETTING], repeatable")
    p.add_argument("--block", type=int, help="the decoding block: report prompt tokens mod it")
    p.add_argument("--out", required=True, help="output path without extension (.json and .png are written)")
    args = p.parse_args(argv)

    from jaxdllm.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(args.model)
    results = {}
    for spec in args.run:
        label, _, where = spec.partition("=")
        directory, _, setting = where.partition("#")
        results[label] = group(read_run(Path(directory), setting or None),
                               lambda text: len(tok([text]).ids[0]), args.block)
    write_report(args.out, {"model": args.model, "block": args.block, "runs": args.run, "results": results},
                 lambda data, path: plot(data["results"], path))
    for label, by_task in results.items():
        for task, cells in by_task.items():
            row = ", ".join(f"{d}: {c['correct']}/{c['n']}" for d, c in cells.items())
            print(f"{label:40s} {task:8s} {row}")


if __name__ == "__main__":
    main()
