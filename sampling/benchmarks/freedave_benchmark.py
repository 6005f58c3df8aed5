"""FreeDave (policy `freedave`) against one token per step (its reference) and Fast-dLLM's threshold
rule on the shipped models, on the same held-out prompts: accuracy, the share of outputs identical to
one token per step, mean NFE, answer tokens per forward and tokens/s (JSON + PNG).

    python -m sampling.benchmarks.freedave_benchmark --out sampling/results/freedave/freedave_cpu
    python -m sampling.benchmarks.freedave_benchmark --models chain-llada-tiny --n 50 --drafts 4 --out /tmp/fd

Each model decodes on its own canvas (`jaxdllm_sampler.json`: chain-llada-tiny 64 tokens in blocks of
32, tasks-llada-small 16 tokens in one block), greedy, in batches of `--batch-size` prompts
(`jaxdllm.eval.runner.decode_batches`, the eval's loop). Settings: `llada` at one token per step,
`threshold` 0.9 (`fast-dllm-parallel`'s rule), and `freedave` with each K of `--drafts` (the default batch
layout, B*K rows per forward) and of `--sequential` (the K drafts one after another with the reference's
shapes: outputs bit for bit where the model's numerics depend on the batch shape, e.g. bf16 weights).
"Identical" compares all `gen_length` generated tokens with one token per step's, item by item.
tokens/s counts answer tokens (through EOS) per second over the batches that did not compile the loop.
For FreeDave the JSON also holds where the forwards went: forwards that committed nothing (seeding:
a block whose seed was not carried over) and the histogram of tokens committed per forward (a
block's last token, committed without a forward, counts with the forward before it).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from jaxdllm.extras import exit_if_missing
from sampling.benchmarks.report import write_report

MODELS = {"chain-llada-tiny": "chain", "tasks-llada-small": "suite"}


def settings(defaults, drafts: list[int], sequential: list[int]) -> dict:
    """`{label: SamplerConfig}` on the checkpoint's canvas: one token per step, threshold 0.9, FreeDave
    (batch layout) at each K of `drafts` and in the sequential layout at each K of `sequential`."""
    one = defaults.replace(policy="llada", steps=defaults.gen_length)
    out = {"llada (1 token/step)": one,
           "threshold 0.9": defaults.replace(policy="threshold", threshold=0.9)}
    for k in drafts:
        out[f"freedave K={k}"] = defaults.replace(policy="freedave", drafts=k)
    for k in sequential:
        out[f"freedave K={k} sequential"] = defaults.replace(policy="freedave", drafts=k, draft_layout="sequential")
    return out


def forward_profile(commit_step: np.ndarray, nfe: np.ndarray) -> dict:
    """Where a row's forwards went: `commit_step [N, G]` (the row's NFE at each token's commit) and
    `nfe [N]` -> seeding forwards per row (committing nothing) and the histogram of tokens per forward."""
    hist: dict[int, int] = {}
    seeding = []
    for steps, n in zip(commit_step, nfe):
        counts = np.bincount(steps, minlength=int(n) + 1)[1:int(n) + 1]
        seeding.append(int((counts == 0).sum()))
        for c in counts[counts > 0]:
            hist[int(c)] = hist.get(int(c), 0) + 1
    return {"seeding_forwards_per_prompt": float(np.mean(seeding)),
            "tokens_per_committing_forward": dict(sorted(hist.items()))}


def run_model(name: str, tasks_spec: str, n: int, drafts: list[int], sequential: list[int], batch_size: int,
              log=print, settings_of=None, params_of=None) -> dict:
    """Every setting on `n` held-out prompts of each task of `tasks_spec` for shipped model `name`.

    `settings_of(defaults) -> {label: SamplerConfig}` replaces FreeDave's settings (the first label
    is the reference the others are compared with: one token per step); `params_of(label, config)`
    gives a setting's `policy_params` (default None).

    Returns `{"canvas", "settings", "results": {label: {task: row, "mean": row}}}`; a row holds
    `accuracy`, `mean_nfe`, `identical_to_one_token_per_step`, `answer_tokens_per_forward`,
    `tokens_per_s` (and FreeDave's forward profile); the means add `fewer_forwards`.
    """
    import jaxdllm
    from jaxdllm.eval.runner import decode_batches
    from jaxdllm.eval.tasks import resolve_tasks
    from jaxdllm.tokenizer import answer_length, decode_response

    model, tok, defaults = jaxdllm.load(name)
    eos = model.config.eos_token_id
    configs = settings_of(defaults) if settings_of else settings(defaults, drafts, sequential)
    reference = next(iter(configs))
    out = {"canvas": {"gen_length": defaults.gen_length, "block_length": defaults.block_length},
           "settings": {label: repr(c) for label, c in configs.items()}, "results": {}}
    reference_tokens: dict[str, np.ndarray] = {}
    for label, config in configs.items():
        rows = {}
        params = params_of(label, config) if params_of else None
        for task in resolve_tasks(tasks_spec):
            items = task.items(n, 1234)
            prompts = [task.encode(tok, item) for item in items]
            tokens, nfe, steps, seconds, answer, warm_answer = [], [], [], 0.0, [], 0
            for batch in decode_batches(model, prompts, config, batch_size=batch_size, same_shape=True,
                                        policy_params=params):
                got = batch.tokens[:batch.size]
                tokens.append(got)
                nfe.append(np.asarray(batch.result.nfe[:batch.size]))
                width = batch.result.prompt_len
                steps.append(np.asarray(batch.result.commit_step[:batch.size, width:]))
                lengths = [answer_length(row, eos) for row in got]
                answer += lengths
                if not batch.compiled:
                    seconds += batch.seconds
                    warm_answer += sum(lengths)
            tokens, nfe, steps = np.concatenate(tokens), np.concatenate(nfe), np.concatenate(steps)
            correct = [task.score(item, decode_response(tok, row, eos)) for item, row in zip(items, tokens)]
            if label == reference:
                reference_tokens[task.name] = tokens
            row = {"n": len(items), "accuracy": float(np.mean(correct)), "mean_nfe": float(nfe.mean()),
                   "identical_to_one_token_per_step": float((tokens == reference_tokens[task.name]).all(1).mean()),
                   "answer_tokens_per_forward": float(np.sum(answer) / nfe.sum()),
                   "tokens_per_s": float(warm_answer / seconds) if seconds else None}
            if label.startswith("freedave"):
                row.update(forward_profile(steps, nfe))
            rows[task.name] = row
            log(f"{name:18s} {label:22s} {task.name:8s} acc {row['accuracy']:.3f}  identical "
                f"{row['identical_to_one_token_per_step']:.3f}  NFE {row['mean_nfe']:.2f}  "
                f"tok/fwd {row['answer_tokens_per_forward']:.2f}  tok/s {row['tokens_per_s'] or float('nan'):.1f}")
        keys = ("accuracy", "mean_nfe", "identical_to_one_token_per_step", "answer_tokens_per_forward")
        rows["mean"] = {k: float(np.mean([r[k] for r in rows.values()])) for k in keys}
        speeds = [r["tokens_per_s"] for t, r in rows.items() if t != "mean" and r["tokens_per_s"]]
        rows["mean"]["tokens_per_s"] = float(np.mean(speeds)) if speeds else None
        out["results"][label] = rows
    base = out["results"][reference]["mean"]["mean_nfe"]
    for rows in out["results"].values():
        rows["mean"]["fewer_forwards"] = base / rows["mean"]["mean_nfe"]
    return out


def plot(data: dict, path: Path) -> None:
    """One panel per model: each setting's mean NFE as a bar, labelled with the forwards saved against
    one token per step, the accuracy and the share of outputs identical to one token per step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(data["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(7.0 * len(models), 3.8), squeeze=False)
    for ax, name in zip(axes.flat, models):
        results = data["models"][name]["results"]
        labels = list(results)
        means = [results[label]["mean"] for label in labels]
        y = range(len(labels))
        ax.barh(y, [m["mean_nfe"] for m in means], color=[f"C{i}" for i in y])
        for i, m in zip(y, means):
            ax.text(m["mean_nfe"], i, f"  {m['mean_nfe']:.1f} ({m['fewer_forwards']:.2f}x), acc "
                    f"{100 * m['accuracy']:.1f} %, identical {100 * m['identical_to_one_token_per_step']:.1f} %",
                    va="center", fontsize=7)
        ax.set_yticks(list(y), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1.9 * max(m["mean_nfe"] for m in means))
        ax.set_xlabel("mean NFE (forwards per prompt; mean over the tasks)")
        canvas = data["models"][name]["canvas"]
        ax.set_title(f"{name}: gen {canvas['gen_length']}, blocks of {canvas['block_length']}", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(f"FreeDave vs one token per step vs threshold 0.9, {data['n']} held-out prompts per task (CPU)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(data: dict) -> str:
    """One table per model: accuracy / mean NFE / identical share per task, fewer forwards, tokens/s."""
    lines = []
    for name, model in data["models"].items():
        tasks = [t for t in next(iter(model["results"].values())) if t != "mean"]
        lines += [f"\n{name}", "| setting | " + " | ".join(tasks + ["mean"]) + " | fewer forwards | tokens/s |",
                  "|---|" + "---|" * (len(tasks) + 3)]
        for label, rows in model["results"].items():
            cells = [f"{100 * rows[t]['accuracy']:.1f} % / {rows[t]['mean_nfe']:.2f} / "
                     f"{100 * rows[t]['identical_to_one_token_per_step']:.0f} %" for t in tasks + ["mean"]]
            speed = rows["mean"]["tokens_per_s"]
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {rows['mean']['fewer_forwards']:.2f}x | "
                         + (f"{speed:.0f}" if speed else "-") + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    """Parse the flags, run every model, print the tables and write `<out>.json` and `<out>.png`."""
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.freedave_benchmark")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"shipped models among {list(MODELS)}")
    parser.add_argument("--n", type=int, default=200, help="held-out prompts per task (seed 1234)")
    parser.add_argument("--drafts", default="2,4,8", help="FreeDave's K values (batch layout)")
    parser.add_argument("--sequential", default="4", help="K values of the sequential layout ('' for none)")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--out", required=True, help="output path without extension (.json, .png)")
    parser.add_argument("--replot", action="store_true", help="only redraw <out>.png from <out>.json")
    args = parser.parse_args(argv)
    if args.replot:
        data = json.loads(Path(f"{args.out}.json").read_text())
        plot(data, Path(f"{args.out}.png"))
        return
    drafts = [int(k) for k in args.drafts.split(",")]
    sequential = [int(k) for k in args.sequential.split(",") if k]
    data = {"n": args.n, "batch_size": args.batch_size, "drafts": drafts, "sequential": sequential,
            "command": "python -m sampling.benchmarks.freedave_benchmark " + " ".join(argv or []), "models": {}}
    begin = time.perf_counter()
    for name in args.models.split(","):
        data["models"][name] = run_model(name, MODELS[name], args.n, drafts, sequential, args.batch_size)
        data["models"][name]["wall_s"] = time.perf_counter() - begin
        write_report(args.out, data)  # after each model: a kill keeps what is done
    data["wall_s"] = time.perf_counter() - begin
    print(markdown(data))
    write_report(args.out, data, plot)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
