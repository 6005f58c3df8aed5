"""APD (policy `apd`: a small causal model steering a diffusion model's parallel commits) against
Fast-dLLM's threshold rule on the same held-out prompts: accuracy against forwards, one point per
setting (JSON + PNG Pareto plot).

    python -m sampling.benchmarks.apd_pareto --out sampling/results/apd/apd_pareto_cpu

The diffusion model is `tasks-llada-small` on its card's canvas (16 tokens, one block), greedy; the
verifier is the model its `companions.json` names (`tasks-qwen2-small`, same character tokenizer).
Settings: one token per step (the reference), threshold at each of `--thresholds`, APD at each R of
`--mix` (draft window M = 16, KV window W = 16, temperature 0: the draft is the diffusion model's
argmax and the target the argmax of the mixture), and the verifier alone (greedy AR decoding of the
causal model: APD's R = 0 limit, on its own canvas). NFE counts the diffusion model's forwards; APD
also runs one verifier forward (16 tokens, cached) per step, and AR one causal forward per token.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from jaxdllm.extras import exit_if_missing
from sampling.benchmarks.freedave_benchmark import run_model
from sampling.benchmarks.report import write_report

MODEL, TASKS = "tasks-llada-small", "suite"


def settings(defaults, thresholds: list[float], mixes: list[float]) -> dict:
    """`{label: SamplerConfig}` on the checkpoint's canvas (the first is the reference)."""
    out = {"llada (1 token/step)": defaults.replace(policy="llada", steps=defaults.gen_length)}
    for t in thresholds:
        out[f"threshold {t}"] = defaults.replace(policy="threshold", threshold=t)
    for r in mixes:
        out[f"apd R={r}"] = defaults.replace(policy="apd", mix=r, draft_window=defaults.gen_length, kv_window=16,
                                             stop_at_eos=True)
    return out


def verifier_alone(n: int, batch_size: int, gen_length: int, log=print) -> dict:
    """The verifier's own greedy decoding (AR) of the same prompts: accuracy and forwards."""
    import numpy as np

    import jaxdllm
    from jaxdllm.decoding import SamplerConfig
    from jaxdllm.eval.runner import decode_batches
    from jaxdllm.eval.tasks import resolve_tasks
    from jaxdllm.tokenizer import decode_response

    model, tok, _ = jaxdllm.load("tasks-qwen2-small")
    config = SamplerConfig.preset("jacobi", gen_length=gen_length, window=1)
    rows = {}
    for task in resolve_tasks(TASKS):
        items = task.items(n, 1234)
        correct, nfe = [], []
        for batch in decode_batches(model, [task.encode(tok, item) for item in items], config,
                                    batch_size=batch_size, same_shape=True):
            got = batch.tokens[:batch.size]
            correct += [task.score(item, decode_response(tok, row, model.config.eos_token_id))
                        for item, row in zip(items[batch.lo:batch.lo + batch.size], got)]
            nfe += list(np.asarray(batch.result.nfe[:batch.size]))
        rows[task.name] = {"accuracy": float(np.mean(correct)), "mean_nfe": float(np.mean(nfe))}
        log(f"verifier alone (AR)  {task.name:8s} acc {rows[task.name]['accuracy']:.3f}  NFE "
            f"{rows[task.name]['mean_nfe']:.2f}")
    rows["mean"] = {k: float(np.mean([r[k] for r in rows.values()])) for k in ("accuracy", "mean_nfe")}
    return rows


def plot(data: dict, path: Path) -> None:
    """Accuracy against mean forwards: APD's R sweep, the threshold sweep, one token per step and the
    verifier alone."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = data["results"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for prefix, style in (("apd", "o-"), ("threshold", "s--")):
        labels = [label for label in results if label.startswith(prefix)]
        points = sorted((results[label]["mean"]["mean_nfe"], 100 * results[label]["mean"]["accuracy"], label)
                        for label in labels)
        ax.plot([p[0] for p in points], [p[1] for p in points], style, label=prefix)
        for x, y, label in points:
            ax.annotate(label.split(" ", 1)[1], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    one = results["llada (1 token/step)"]["mean"]
    ax.plot([one["mean_nfe"]], [100 * one["accuracy"]], "k^", label="one token per step")
    ar = data["verifier_alone"]["mean"]
    ax.axhline(100 * ar["accuracy"], color="gray", ls=":", label=f"verifier alone (AR, {ar['mean_nfe']:.1f} fwd)")
    ax.set_xscale("log")
    ax.set_xlabel("mean diffusion-model forwards per prompt (log)")
    ax.set_ylabel("accuracy, mean over the six tasks (%)")
    ax.set_title(f"APD vs threshold on {MODEL} ({data['n']} held-out prompts per task, CPU)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    """Parse the flags, run every setting, write `<out>.json` and `<out>.png`."""
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.apd_pareto")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200, help="held-out prompts per task (seed 1234)")
    parser.add_argument("--thresholds", default="0.5,0.7,0.9,0.95,0.99")
    parser.add_argument("--mix", default="0.0,0.3,0.5,0.7,0.8,0.9,0.95,1.0", help="APD's R values")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--out", required=True, help="output path without extension (.json, .png)")
    args = parser.parse_args(argv)
    import jaxdllm

    thresholds = [float(t) for t in args.thresholds.split(",")]
    mixes = [float(r) for r in args.mix.split(",")]
    begin = time.perf_counter()
    verifiers = {}

    def params_of(label, config):
        if config.policy.name != "apd":
            return None
        if "v" not in verifiers:
            verifiers["v"] = jaxdllm.policy_params(MODEL, config)  # companions.json; tokenizers checked
        return verifiers["v"]

    data = run_model(MODEL, TASKS, args.n, [], [], args.batch_size,
                     settings_of=lambda d: settings(d, thresholds, mixes), params_of=params_of)
    data.update(n=args.n, command="python -m sampling.benchmarks.apd_pareto " + " ".join(argv or []))
    data["verifier_alone"] = verifier_alone(args.n, args.batch_size, data["canvas"]["gen_length"])
    data["wall_s"] = time.perf_counter() - begin
    write_report(args.out, data, plot)


if __name__ == "__main__":
    main()
