"""Router load of an MoE checkpoint: the (token, expert) rows each routed expert runs, per MoE
layer, on held-out task examples, in the two inputs a diffusion model sees most: the first
decoding step (the prompt, then the whole answer masked) and the finished text (prompt + answer).
Perfect balance is every expert at 1.0 x the mean. Writes `<out>.json` and `<out>.png`.

    python -m sampling.benchmarks.router_load --model checkpoints/tasks-llada2-tiny --tasks copy,reverse \\
        --out checkpoints/tasks-llada2-tiny/router_load
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from jaxdllm.extras import exit_if_missing
from sampling.benchmarks.report import write_report


def loads_of(model, rows: list[list[int]]) -> np.ndarray:
    """`[num_moe_layers, E]` rows per expert over `rows` (rows of one length run together: no
    padding's rows are counted)."""
    total = None
    by_length: dict[int, list[list[int]]] = {}
    for row in rows:
        by_length.setdefault(len(row), []).append(row)
    for _, group in sorted(by_length.items()):
        loads = model(jnp.asarray(group, jnp.int32), return_router_loads=True).router_loads
        total = np.asarray(loads) if total is None else total + np.asarray(loads)
    return total


def summary(loads: np.ndarray) -> dict:
    share = loads / loads.mean(-1, keepdims=True)
    return {"rows_per_expert": loads.tolist(), "load_over_mean": share.round(3).tolist(),
            "max_over_mean": share.max(-1).round(3).tolist(), "min_over_mean": share.min(-1).round(3).tolist(),
            "cv": (loads.std(-1) / loads.mean(-1)).round(4).tolist()}


def main(argv=None) -> None:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.router_load")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an MoE checkpoint folder or shipped name")
    parser.add_argument("--tasks", default="copy,reverse")
    parser.add_argument("--n", type=int, default=200, help="held-out examples per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output path without extension")
    args = parser.parse_args(argv)

    import jaxdllm
    from jaxdllm.data import make_mixture

    model, tok, _ = jaxdllm.load(args.model)
    c = model.config
    if c.experts is None:
        raise SystemExit(f"{args.model} has no routed experts")
    examples = make_mixture(args.tasks.split(","), args.n, args.seed, split="test")
    first_step, finished = [], []
    for ex in examples:
        prompt, answer = tok.encode(ex.prompt), tok.encode(ex.response, add_special_tokens=False) + [c.eos_token_id]
        first_step.append(prompt + [c.mask_token_id] * len(answer))
        finished.append(prompt + answer)
    report = {"model": str(args.model), "tasks": args.tasks.split(","), "examples": len(examples),
              "experts": c.experts.num_experts, "experts_per_token": c.experts.experts_per_token,
              "moe_layers": [i for i in range(c.num_layers) if c.is_moe_layer(i)],
              "first_step": summary(loads_of(model, first_step)),
              "finished": summary(loads_of(model, finished))}
    write_report(args.out, report, plot)
    print(json.dumps({k: report[k]["max_over_mean"] for k in ("first_step", "finished")}))


def plot(report: dict, path: Path) -> None:
    """Rows over the mean per expert: a panel per MoE layer, first step above, finished text below."""
    import matplotlib.pyplot as plt

    layers = report["moe_layers"]
    fig, axes = plt.subplots(2, len(layers), figsize=(3.6 * len(layers), 5.2), squeeze=False, sharey=True)
    for r, key in enumerate(("first_step", "finished")):
        for col, layer in enumerate(layers):
            ax = axes[r][col]
            ax.bar(range(report["experts"]), report[key]["load_over_mean"][col], color="tab:blue" if r else "tab:orange")
            ax.axhline(1.0, color="k", lw=0.8, ls="--")
            ax.set_title(f"layer {layer}, {key.replace('_', ' ')}", fontsize=9)
            ax.set_xlabel("expert")
            if col == 0:
                ax.set_ylabel("rows / mean")
    fig.suptitle(f"router load: {Path(report['model']).name}, {report['examples']} held-out examples")
    fig.tight_layout()
    fig.savefig(path, dpi=110)

if __name__ == "__main__":
    main()
