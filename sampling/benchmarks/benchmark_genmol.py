"""GenMol's claims on the shipped CPU-scale models, in one process (JSON + PNG):

* **De novo** (`--samples` each): the masked model with GenMol's sampler at the published settings (T 0.5,
  r 0.5, one token per step), its faster variant (3 tokens per step) and GenMol V2's T 1.0, r 0.3, against the causal model of the
  same size trained on the same SAFE rows with the same budget, sampled at temperatures 1.0 and 0.7;
  validity, uniqueness, quality (QED >= 0.6 and SA <= 4), diversity, forwards per molecule, the share of
  generated strings with a ring/attachment digit written an odd number of times, seconds (compilation included);
  the training set's own quality share beside them.
* **Fragment-constrained** (`--fragments` held-out test molecules x `--per-fragment` samples): linker design
  (two steps and one step),
  motif extension, scaffold decoration and superstructure with the published constants.
* **Fragment remasking** (`--budget` oracle calls per oracle): GenMol's goal-directed loop against random
  sampling from the same model, AUC of the top-10 mean (PMO).

    python -m sampling.benchmarks.benchmark_genmol --out sampling/results/genmol_cpu
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from jaxdllm.extras import exit_if_missing

exit_if_missing(("rdkit", "safe", "matplotlib"), "molecules", "the GenMol benchmark")

from jaxdllm.molecules.causal_baseline import CausalDesigner  # noqa: E402
from jaxdllm.molecules.design import Designer  # noqa: E402
from jaxdllm.molecules.drawing import draw_grid  # noqa: E402
from jaxdllm.molecules.evaluation import evaluate_fragments, fragment_tasks  # noqa: E402
from jaxdllm.molecules.metrics import denovo_metrics, quality_share  # noqa: E402
from jaxdllm.molecules.moses import read_pairs, shipped_data_dir  # noqa: E402
from jaxdllm.molecules.oracles import oracle  # noqa: E402
from jaxdllm.molecules.remasking import RemaskingConfig, fragment_remasking, random_sampling, top10_curve  # noqa: E402
from jaxdllm.molecules.safe_tokenizer import unpaired_digits  # noqa: E402
from sampling.benchmarks.report import write_report  # noqa: E402

KEYS = ("validity", "uniqueness", "quality", "diversity")


def denovo_rows(designer, causal, n: int, seed: int) -> tuple[list[dict], dict]:
    runs = {"GenMol (T 0.5, r 0.5, 1 token/step)": lambda: designer.denovo(n, seed=seed),
            "GenMol (3 tokens/step)": lambda: designer.denovo(n, seed=seed, tokens_per_step=3),
            # GenMol V2's de novo temperature and randomness (its min_add_len of 60 is for ZINC's longer strings)
            "GenMol (T 1.0, r 0.3: V2's settings)": lambda: designer.denovo(n, seed=seed, temperature=1.0,
                                                                            randomness=0.3),
            "causal, T 1.0": lambda: causal.denovo(n, temperature=1.0, seed=seed),
            "causal, T 0.7": lambda: causal.denovo(n, temperature=0.7, seed=seed)}
    rows, samples = [], {}
    for name, run in runs.items():
        row, samples[name] = denovo_row(name, run, n)
        rows.append(row)
    return rows, samples


def denovo_row(name: str, run, n: int) -> tuple[dict, list]:
    """One de novo row: `run()`'s samples scored and timed (compilation included: GenMol's canvases come
    in a few widths), printed; returns `(row, the samples' SMILES)`."""
    start = time.perf_counter()
    out = run()
    row = {"model": name, **denovo_metrics(out.smiles, n), "forwards_per_molecule": float(np.mean(out.nfe)),
           "unpaired_digit_share": float(np.mean([bool(unpaired_digits(t)) for t in out.plain_safe()])),
           "seconds_with_compilation": time.perf_counter() - start}
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return row, out.smiles


def plot(data: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    rows = data["denovo"]
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        left.bar(np.arange(len(KEYS)) + i * width, [row[k] for k in KEYS], width, label=row["model"])
    left.axhline(data["training_quality"], color="grey", ls="--", lw=1, label="training set's quality share")
    left.set_xticks(np.arange(len(KEYS)) + width * (len(rows) - 1) / 2, KEYS)
    left.set_ylim(0, 1.05)
    left.set_title(f"de novo, {data['samples']} molecules each")
    left.legend(fontsize=7, loc="lower left")
    for name, runs in data["optimize"].items():
        for label, run in runs.items():
            right.plot(*top10_curve(run["history"]), label=f"{name}: {label} (AUC {run['auc_top10']:.3f})")
    right.set_xlabel("oracle calls")
    right.set_ylabel("mean of the top 10")
    right.set_title("fragment remasking vs random sampling")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="moses-bert-small-genmol")
    parser.add_argument("--extra-model", action="append", default=[], metavar="NAME=PATH",
                        help="another GenMol model to sample de novo at the published settings (e.g. a same-budget one)")
    parser.add_argument("--causal", default="moses-qwen2-small-causal")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--fragments", type=int, default=10)
    parser.add_argument("--per-fragment", type=int, default=100)
    parser.add_argument("--oracles", default="celecoxib_rediscovery,albuterol_similarity")
    parser.add_argument("--budget", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="sampling/results/genmol_cpu")
    args = parser.parse_args()
    data_dir = shipped_data_dir()
    designer, causal = Designer.load(args.model), CausalDesigner.load(args.causal)
    train = [s for s, _ in read_pairs(data_dir / "train.tsv.gz")]
    result = {"model": args.model, "causal": args.causal, "samples": args.samples, "seed": args.seed,
              "training_quality": quality_share(train[:args.samples])}
    result["denovo"], samples = denovo_rows(designer, causal, args.samples, args.seed)
    for spec in args.extra_model:
        name, path = spec.split("=", 1)
        result["denovo"].append(denovo_row(name, lambda: Designer.load(path).denovo(args.samples, seed=args.seed),
                                           args.samples)[0])
    out = Path(args.out)
    for name, smiles in samples.items():
        if name.startswith("GenMol (T") or name == "causal, T 1.0":
            tag = "genmol" if name.startswith("GenMol") else "causal"
            draw_grid([s for s in smiles if s][:20], out.parent / f"{out.name}_{tag}_molecules.png")
    test = [s for s, _ in read_pairs(data_dir / "test.tsv.gz")]
    chosen = [s for s in test[:args.fragments * 5] if fragment_tasks(s)][:args.fragments]
    result["fragments"] = evaluate_fragments(designer, chosen, args.per_fragment, out.parent / f"{out.name}_fragments",
                                             seed=args.seed)["tasks"]
    print(result["fragments"], flush=True)
    result["optimize"] = {}
    reference = train[:5000]
    for name in args.oracles.split(","):
        score = oracle(name)
        remasked = fragment_remasking(designer, score, name, args.budget, reference,
                                      config=RemaskingConfig(warmup=args.warmup), seed=args.seed)
        sampled = random_sampling(designer, score, args.budget, seed=args.seed)
        result["optimize"][name] = {"fragment remasking": remasked, "random sampling": sampled}
        print(name, {k: {m: v for m, v in r.items() if m != "history"} for k, r in result["optimize"][name].items()},
              flush=True)
    write_report(args.out, result, plot)


if __name__ == "__main__":
    main()
