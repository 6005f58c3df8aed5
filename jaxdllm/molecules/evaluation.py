"""GenMol's benchmarks on this library's models, written as JSON + PNG:

* `evaluate_denovo`: de novo samples of the masked model (GenMol's sampler) and, when given, of a causal
  model of the same size (temperature sampling), side by side with the training set's own quality share;
  validity, uniqueness, quality and diversity as GenMol defines them (`jaxdllm.molecules.metrics`).
* `evaluate_fragments`: the fragment-constrained tasks (linker design, motif extension, scaffold
  decoration, superstructure) on fragments cut from held-out molecules (`fragment_tasks`), with the
  distance of the products to the molecule each fragment came from.

    python -m jaxdllm.cli molecules eval --model moses-bert-small-genmol --causal moses-qwen2-small-causal
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np
from rdkit import Chem
from rdkit.Chem import BRICS
from rdkit.Chem.Scaffolds import MurckoScaffold

from jaxdllm.molecules.design import Designer, Samples
from jaxdllm.molecules.drawing import draw_grid
from jaxdllm.molecules.metrics import denovo_metrics, fragment_metrics, quality_share
from jaxdllm.molecules.safe_tokenizer import unpaired_digits

DENOVO_KEYS = ("validity", "uniqueness", "quality", "diversity")


def _timed(run) -> tuple[Samples, float]:
    start = time.perf_counter()
    samples = run()
    return samples, time.perf_counter() - start


def _denovo_row(samples: Samples, seconds: float, num_samples: int) -> dict:
    """GenMol's metrics of one model's samples, its time and forwards, and the share of its strings that write
    a ring or attachment label an odd number of times (they cannot decode whole: GenMol's decoding keeps a piece)."""
    unpaired = [bool(unpaired_digits(text)) for text in samples.plain_safe()]
    return {**denovo_metrics(samples.smiles, num_samples), "seconds": seconds,
            "mean_forwards": float(np.mean(samples.nfe)), "unpaired_digit_share": float(np.mean(unpaired)),
            "safe_format": samples.safe_format}


def evaluate_denovo(designer: Designer, num_samples: int, out: str | Path, *, causal=None,
                    causal_temperature: float = 1.0, training_smiles: Sequence[str] = (), seed: int = 0,
                    **settings) -> dict:
    """De novo metrics of `designer` (and of `causal`, a `CausalDesigner`) on `num_samples` each; writes
    `denovo.json`, `denovo.png` (the metrics side by side) and `denovo_molecules.png` (a grid of samples).
    `training_smiles`: molecules whose quality share is reported beside (GenMol's target)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    samples, seconds = _timed(lambda: designer.denovo(num_samples, seed=seed, **settings))
    rows = {"genmol": _denovo_row(samples, seconds, num_samples)}
    grids = {"genmol": samples.smiles}
    if causal is not None:
        baseline, seconds = _timed(lambda: causal.denovo(num_samples, temperature=causal_temperature, seed=seed))
        rows["causal"] = {**_denovo_row(baseline, seconds, num_samples), "temperature": causal_temperature}
        grids["causal"] = baseline.smiles
    result = {"num_samples": num_samples, "seed": seed, "models": rows}
    if training_smiles:
        result["training_quality"] = quality_share(list(training_smiles))
    (out / "denovo.json").write_text(json.dumps(result, indent=2) + "\n")
    _plot_denovo(result, out / "denovo.png")
    for name, smiles in grids.items():
        draw_grid([s for s in smiles if s][:20], out / f"denovo_molecules_{name}.png")
    return result


def _plot_denovo(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["models"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [result["models"][name][k] for k in DENOVO_KEYS]
        ax.bar(np.arange(4) + i * width, values, width, label=name)
    if "training_quality" in result:
        ax.axhline(result["training_quality"], color="grey", ls="--", lw=1, label="training set's quality")
    ax.set_xticks(np.arange(4) + width * (len(names) - 1) / 2, DENOVO_KEYS)
    ax.set_ylim(0, 1.05)
    ax.set_title(f"de novo, {result['num_samples']} samples")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fragment_tasks(smiles: str) -> dict[str, str] | None:
    """Fragments of one molecule for the four fragment tasks (None when it has too few BRICS bonds):
    `motif` (its largest BRICS fragment with its attachment points), `linker` (its two terminal
    BRICS fragments, 'A.B'), `scaffold` (its Murcko scaffold with an attachment point where each side
    chain was) and `superstructure` (its largest ring system without attachment points)."""
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None
    pieces = sorted(BRICS.BRICSDecompose(mol, keepNonLeafNodes=False, returnMols=False),
                    key=lambda s: -Chem.MolFromSmiles(s).GetNumHeavyAtoms())
    pieces = [_plain_dummies(p) for p in pieces]
    terminal = [p for p in pieces if p.count("*") == 1]
    if len(pieces) < 3 or len(terminal) < 2:
        return None
    scaffold = MurckoScaffold.GetScaffoldForMol(mol)
    decorated = Chem.ReplaceSidechains(mol, scaffold)
    rings = Chem.MolToSmiles(scaffold)
    return {"motif": pieces[0], "linker": f"{terminal[0]}.{terminal[1]}",
            "scaffold": _plain_dummies(Chem.MolToSmiles(decorated)) if decorated is not None else None,
            "superstructure": rings if rings and "*" not in rings else None}


def _plain_dummies(smiles: str) -> str:
    """Labelled dummies `[4*]` -> `[*]` (SAFE numbers attachment points itself)."""
    import re

    return re.sub(r"\[\d+\*\]", "[*]", smiles)


# task -> (Designer method, its settings, the `fragment_tasks` key of its fragment)
TASK_CALLS = {"linker": ("linker", {}, "linker"), "linker-1step": ("linker", {"one_step": True}, "linker"),
              "motif": ("motif_extension", {}, "motif"), "scaffold": ("scaffold_decoration", {}, "scaffold"),
              "superstructure": ("superstructure", {}, "superstructure")}


def evaluate_fragments(designer: Designer, molecules: Sequence[str], samples_per_fragment: int, out: str | Path,
                       *, seed: int = 0) -> dict:
    """GenMol's fragment-constrained benchmark on fragments of `molecules` (10 drugs in the paper; here any
    molecules, e.g. held-out test molecules): per task the metrics averaged over the fragments. Writes
    `fragments.json` and `fragments_molecules.png`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    per_task: dict[str, list[dict]] = {task: [] for task in TASK_CALLS}
    grid, legends = [], []
    for index, reference in enumerate(molecules):
        fragments = fragment_tasks(reference)
        if fragments is None:
            continue
        for task, (method, settings, key) in TASK_CALLS.items():
            fragment = fragments.get(key)
            if not fragment:
                continue
            samples = getattr(designer, method)(fragment, samples_per_fragment, seed=seed + index, **settings)
            per_task[task].append({"reference": reference, "fragment": fragment,
                                   **fragment_metrics(samples.smiles, fragment, reference, samples_per_fragment)})
            first = next((s for s in samples.smiles if s), None)
            if first and len(grid) < 20:
                grid.append(first)
                legends.append(task)
    keys = ("validity", "uniqueness", "quality", "diversity", "distance")
    summary = {task: {k: float(np.mean([r[k] for r in rows])) for k in keys} | {"fragments": len(rows)}
               for task, rows in per_task.items() if rows}
    result = {"samples_per_fragment": samples_per_fragment, "seed": seed, "tasks": summary, "per_fragment": per_task}
    (out / "fragments.json").write_text(json.dumps(result, indent=2) + "\n")
    if grid:
        draw_grid(grid, out / "fragments_molecules.png", legends=legends)
    return result


__all__ = ["evaluate_denovo", "evaluate_fragments", "fragment_tasks"]
