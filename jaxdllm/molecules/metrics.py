"""GenMol's molecule metrics (its `scripts/exps/denovo` and `frag` evaluation; TDC's definitions):

* validity: samples that decode to a molecule / all samples;
* uniqueness: distinct canonical SMILES / valid samples;
* quality: distinct valid molecules with QED >= 0.6 and SA <= 4 / all samples;
* diversity: TDC's `diversity` on the distinct valid molecules: the mean of the Tanimoto distance
  1 - sim(i, j) over all unordered pairs i < j (the upper triangle of the similarity matrix, no diagonal),
  on Morgan bit fingerprints of radius 2 and 2048 bits; that is 1 - the mean pairwise similarity. TDC
  returns NaN for fewer than two molecules; here 0.0;
* distance (fragment tasks): 1 - the mean Tanimoto similarity of the distinct valid products to the
  molecule the fragment came from, Morgan radius 2, 1024 bits (0.0 when there are no products);
* contains_fragment (fragment tasks): the share of the distinct valid products that hold the fragment,
  its attachment points removed, as a substructure (GenMol's `filter_by_substructure` criterion).

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
    """RDKit's canonical (isomeric) SMILES of `smiles`, or None for None, an empty or unparsable string, or a
    molecule without atoms."""
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    return Chem.MolToSmiles(mol) if mol is not None and mol.GetNumAtoms() else None


def sa_score(mol: Chem.Mol) -> float:
    """Ertl and Schuffenhauer's synthetic accessibility of an RDKit molecule, 1 (easy) .. 10 (hard), from the
    RDKit wheel's `Contrib/SA_Score/sascorer.py` (imported once)."""
    return float(_sascorer().calculateScore(mol))


def qed(mol: Chem.Mol) -> float:
    """Quantitative estimate of drug-likeness of an RDKit molecule, 0 .. 1 (`rdkit.Chem.QED.qed`)."""
    return float(QED.qed(mol))


def is_quality(mol: Chem.Mol) -> bool:
    """GenMol's quality criterion for an RDKit molecule: QED >= 0.6 and SA <= 4."""
    return qed(mol) >= 0.6 and sa_score(mol) <= 4


def fingerprints(smiles: Sequence[str], bits: int = 2048) -> list:
    """Morgan radius-2 bit vectors of `bits` bits of valid SMILES strings (RDKit ExplicitBitVects)."""
    return [_morgan(bits).GetFingerprint(Chem.MolFromSmiles(s)) for s in smiles]


def diversity(smiles: Sequence[str]) -> float:
    """TDC's diversity of valid SMILES `smiles` (pass distinct molecules): the mean Tanimoto distance over all
    unordered pairs i < j on Morgan r2 2048-bit fingerprints; 0.0 for fewer than two (TDC: NaN)."""
    fps = fingerprints(smiles)
    if len(fps) < 2:
        return 0.0
    total = sum(sum(DataStructs.BulkTanimotoSimilarity(fps[i], fps[i + 1:])) for i in range(len(fps) - 1))
    return float(1.0 - total / (len(fps) * (len(fps) - 1) / 2))


def denovo_metrics(samples: Sequence[str | None], num_samples: int | None = None) -> dict:
    """GenMol's de novo metrics of `samples` (SMILES or None) out of `num_samples` (default len(samples)):
    a dict with validity (valid / num_samples), uniqueness (distinct canonical / valid), quality (distinct
    valid with QED >= 0.6 and SA <= 4 / num_samples), diversity (TDC's, on the distinct set) and the counts
    num_samples, num_valid, num_unique, num_quality. Ratios with a zero denominator are 0."""
    total = len(samples) if num_samples is None else num_samples
    valid = [c for c in (canonical(s) for s in samples) if c]
    unique = sorted(set(valid))
    good = sum(is_quality(Chem.MolFromSmiles(s)) for s in unique)
    return {"validity": len(valid) / max(total, 1), "uniqueness": len(unique) / max(len(valid), 1),
            "quality": good / max(total, 1), "diversity": diversity(unique), "num_samples": total,
            "num_valid": len(valid), "num_unique": len(unique), "num_quality": good}


def fragment_core(fragment: str) -> Chem.Mol | None:
    """The molecule of `fragment` (SMILES, possibly with `[n*]` attachment points and `.`-separated parts)
    with its dummy atoms removed, as a substructure query; None when it does not parse."""
    mol = Chem.MolFromSmiles(fragment) if fragment else None
    if mol is None:
        return None
    core = Chem.DeleteSubstructs(mol, Chem.MolFromSmarts("[#0]"))
    Chem.SanitizeMol(core, catchErrors=True)
    return core


def fragment_metrics(samples: Sequence[str | None], fragment: str, reference: str, num_samples: int | None = None) -> dict:
    """`denovo_metrics` of fragment-task products `samples` out of `num_samples`, plus `distance` to
    `reference` (the molecule the fragment came from; 1 - mean Tanimoto, Morgan r2 1024 bits, over the
    distinct valid products), `contains_fragment` (the share of the distinct valid products that contain
    `fragment` without its attachment points), `num_with_fragment`, and `fragment` itself."""
    out = denovo_metrics(samples, num_samples)
    unique = sorted({c for c in (canonical(s) for s in samples) if c})
    if unique:
        ref = fingerprints([canonical(reference)], 1024)[0]
        out["distance"] = float(1.0 - np.mean(DataStructs.BulkTanimotoSimilarity(ref, fingerprints(unique, 1024))))
    else:
        out["distance"] = 0.0
    core = fragment_core(fragment)
    holding = 0 if core is None else sum(Chem.MolFromSmiles(s).HasSubstructMatch(core) for s in unique)
    out["num_with_fragment"] = int(holding)
    out["contains_fragment"] = holding / len(unique) if unique else 0.0
    out["fragment"] = fragment
    return out


def quality_share(smiles: Sequence[str]) -> float:
    """The share of `smiles` (e.g. a training set; unparsable ones count as not meeting it) with QED >= 0.6
    and SA <= 4; 0.0 for an empty list."""
    mols = [Chem.MolFromSmiles(s) for s in smiles]
    return float(np.mean([m is not None and is_quality(m) for m in mols])) if mols else 0.0


__all__ = ["canonical", "denovo_metrics", "diversity", "fingerprints", "fragment_core", "fragment_metrics", "is_quality", "qed",
           "quality_share", "sa_score"]
