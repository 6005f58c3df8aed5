"""GenMol's molecule metrics (its `scripts/exps/denovo` and `frag` evaluation; TDC's definitions):

* validity: samples that decode to a molecule / all samples;
* uniqueness: distinct canonical SMILES / valid samples;
* quality: distinct valid molecules with QED >= 0.6 and SA <= 4 / all samples;
* diversity: 1 - the mean Tanimoto similarity over all pairs of distinct molecules, on Morgan
  fingerprints of radius 2 and 2048 bits (TDC's `diversity`);
* distance (fragment tasks): 1 - the mean Tanimoto similarity of the distinct valid products to the
  molecule the fragment came from, Morgan radius 2, 1024 bits.

SA is Ertl and Schuffenhauer's synthetic accessibility score (1 easy .. 10 hard) from the RDKit wheel's
`Contrib/SA_Score`; QED is RDKit's (Bickerton et al.).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Sequence

import numpy as np
from rdkit import Chem, DataStructs, RDConfig, RDLogger
from rdkit.Chem import QED, rdFingerprintGenerator

RDLogger.DisableLog("rdApp.*")


@functools.lru_cache(maxsize=1)
def _sascorer():
    path = os.path.join(RDConfig.RDContribDir, "SA_Score")
    if path not in sys.path:
        sys.path.append(path)
    import sascorer  # the RDKit wheel ships it with its fragment scores

    return sascorer


@functools.lru_cache(maxsize=4)
def _morgan(bits: int):
    return rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=bits)


def canonical(smiles: str | None) -> str | None:
    """RDKit's canonical SMILES, or None for an empty or unparsable string."""
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    return Chem.MolToSmiles(mol) if mol is not None and mol.GetNumAtoms() else None


def sa_score(mol: Chem.Mol) -> float:
    """Synthetic accessibility, 1 (easy) .. 10 (hard)."""
    return float(_sascorer().calculateScore(mol))


def qed(mol: Chem.Mol) -> float:
    """Quantitative estimate of drug-likeness, 0 .. 1."""
    return float(QED.qed(mol))


def is_quality(mol: Chem.Mol) -> bool:
    """GenMol's quality criterion: QED >= 0.6 and SA <= 4."""
    return qed(mol) >= 0.6 and sa_score(mol) <= 4


def fingerprints(smiles: Sequence[str], bits: int = 2048) -> list:
    """Morgan radius-2 bit vectors of `bits` bits."""
    return [_morgan(bits).GetFingerprint(Chem.MolFromSmiles(s)) for s in smiles]


def diversity(smiles: Sequence[str]) -> float:
    """1 - mean Tanimoto similarity over all unordered pairs of `smiles` (Morgan r2, 2048 bits); 0 for fewer than two."""
    fps = fingerprints(smiles)
    if len(fps) < 2:
        return 0.0
    total = sum(sum(DataStructs.BulkTanimotoSimilarity(fps[i], fps[i + 1:])) for i in range(len(fps) - 1))
    return float(1.0 - total / (len(fps) * (len(fps) - 1) / 2))


def denovo_metrics(samples: Sequence[str | None], num_samples: int | None = None) -> dict:
    """Validity, uniqueness, quality, diversity (and the counts) of `samples` (SMILES or None), out of
    `num_samples` (default: len(samples))."""
    total = len(samples) if num_samples is None else num_samples
    valid = [c for c in (canonical(s) for s in samples) if c]
    unique = sorted(set(valid))
    good = sum(is_quality(Chem.MolFromSmiles(s)) for s in unique)
    return {"validity": len(valid) / max(total, 1), "uniqueness": len(unique) / max(len(valid), 1),
            "quality": good / max(total, 1), "diversity": diversity(unique), "num_samples": total,
            "num_valid": len(valid), "num_unique": len(unique), "num_quality": good}


def fragment_metrics(samples: Sequence[str | None], fragment: str, reference: str, num_samples: int | None = None) -> dict:
    """`denovo_metrics` of fragment-task products plus `distance` to `reference` (the molecule the fragment
    came from; 1 - mean Tanimoto, Morgan r2 1024 bits, over the distinct valid products) and `fragment`
    itself recorded."""
    out = denovo_metrics(samples, num_samples)
    unique = sorted({c for c in (canonical(s) for s in samples) if c})
    if unique:
        ref = fingerprints([canonical(reference)], 1024)[0]
        out["distance"] = float(1.0 - np.mean(DataStructs.BulkTanimotoSimilarity(ref, fingerprints(unique, 1024))))
    else:
        out["distance"] = 0.0
    out["fragment"] = fragment
    return out


def quality_share(smiles: Sequence[str]) -> float:
    """The share of `smiles` (valid molecules, e.g. a training set) that meet the quality criterion."""
    mols = [Chem.MolFromSmiles(s) for s in smiles]
    return float(np.mean([m is not None and is_quality(m) for m in mols])) if mols else 0.0


__all__ = ["canonical", "denovo_metrics", "diversity", "fingerprints", "fragment_metrics", "is_quality", "qed",
           "quality_share", "sa_score"]
