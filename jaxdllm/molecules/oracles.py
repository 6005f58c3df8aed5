"""Goal-directed oracles RDKit computes offline (GuacaMol's definitions, as TDC's PMO benchmark uses
them), an oracle-call budget, and PMO's AUC of the top-10 average.

Each oracle maps a SMILES to a score in [0, 1] (0 when it does not parse):

* `qed`: RDKit's QED.
* `<drug>_rediscovery` (celecoxib, troglitazone, thiothixene): Tanimoto similarity to the drug on ECFP4
  count fingerprints (Morgan radius 2, unhashed counts).
* `albuterol_similarity`: Tanimoto similarity to albuterol on FCFP4 count fingerprints (feature
  invariants), clipped: min(similarity / 0.75, 1).
* `isomers_c7h8n2o2`, `isomers_c9h10n2o2pf2cl`: the geometric mean of Gaussian modifiers on each element's
  atom count (hydrogens included; sigma 1) and on the total atom count (sigma 2), centred on the formula.
* `median1`: the geometric mean of the ECFP4 similarities to camphor and to menthol (a molecule between two).
"""

from __future__ import annotations

import math
import re
from typing import Callable, Sequence

import numpy as np
from rdkit import Chem, DataStructs
from rdkit.Chem import AllChem

from jaxdllm.errors import InputError
from jaxdllm.molecules.metrics import canonical, qed as qed_of

DRUGS = {
    "celecoxib": "CC1=CC=C(C=C1)C1=CC(=NN1C1=CC=C(C=C1)S(N)(=O)=O)C(F)(F)F",
    "troglitazone": "Cc1c(C)c2OC(C)(COc3ccc(CC4SC(=O)NC4=O)cc3)CCc2c(C)c1O",
    "thiothixene": "CN(C)S(=O)(=O)c1ccc2Sc3ccccc3C(=CCCN4CCN(C)CC4)c2c1",
    "albuterol": "CC(C)(C)NCC(O)c1ccc(O)c(CO)c1",
    "camphor": "CC1(C)C2CCC1(C)C(=O)C2",
    "menthol": "CC(C)C1CCC(C)CC1O",
}


def _mol(smiles: str):
    return Chem.MolFromSmiles(smiles) if smiles else None


def _ecfp4(mol):
    return AllChem.GetMorganFingerprint(mol, 2)


def _fcfp4(mol):
    return AllChem.GetMorganFingerprint(mol, 2, useFeatures=True)


def similarity(smiles: str, target: str, fingerprint=_ecfp4) -> float:
    """Tanimoto similarity of two molecules' count fingerprints (0 when either does not parse)."""
    a, b = _mol(smiles), _mol(target)
    return 0.0 if a is None or b is None else float(DataStructs.TanimotoSimilarity(fingerprint(a), fingerprint(b)))


def rediscovery(drug: str) -> Callable[[str], float]:
    """GuacaMol's rediscovery of `drug` (a name in `DRUGS`): ECFP4 Tanimoto similarity to it."""
    target = DRUGS[drug]
    return lambda smiles: similarity(smiles, target)


def albuterol_similarity(smiles: str) -> float:
    """FCFP4 similarity to albuterol, clipped at 0.75 (score 1 from there)."""
    return min(similarity(smiles, DRUGS["albuterol"], _fcfp4) / 0.75, 1.0)


def _formula_counts(formula: str) -> dict[str, int]:
    return {element: int(count or 1) for element, count in re.findall(r"([A-Z][a-z]?)(\d*)", formula)}


def isomer_score(formula: str) -> Callable[[str], float]:
    """GuacaMol's isomer scoring for `formula` (e.g. "C7H8N2O2")."""
    target = _formula_counts(formula)
    total = sum(target.values())

    def score(smiles: str) -> float:
        mol = _mol(smiles)
        if mol is None:
            return 0.0
        counts: dict[str, int] = {}
        for atom in Chem.AddHs(mol).GetAtoms():
            counts[atom.GetSymbol()] = counts.get(atom.GetSymbol(), 0) + 1
        parts = [math.exp(-0.5 * (counts.get(e, 0) - n) ** 2) for e, n in target.items()]
        parts.append(math.exp(-0.5 * ((sum(counts.values()) - total) / 2.0) ** 2))
        return float(np.prod(parts) ** (1.0 / len(parts)))

    return score


def median1(smiles: str) -> float:
    """Geometric mean of the ECFP4 similarities to camphor and menthol."""
    return math.sqrt(similarity(smiles, DRUGS["camphor"]) * similarity(smiles, DRUGS["menthol"]))


def qed(smiles: str) -> float:
    """QED of a SMILES (0 when it does not parse)."""
    mol = _mol(smiles)
    return 0.0 if mol is None else qed_of(mol)


ORACLES: dict[str, Callable[[str], float]] = {
    "qed": qed,
    "celecoxib_rediscovery": rediscovery("celecoxib"),
    "troglitazone_rediscovery": rediscovery("troglitazone"),
    "thiothixene_rediscovery": rediscovery("thiothixene"),
    "albuterol_similarity": albuterol_similarity,
    "isomers_c7h8n2o2": isomer_score("C7H8N2O2"),
    "isomers_c9h10n2o2pf2cl": isomer_score("C9H10N2O2PF2Cl"),
    "median1": median1,
}


def oracle(name: str) -> Callable[[str], float]:
    """The oracle called `name` (`ORACLES`)."""
    if name not in ORACLES:
        raise InputError(f"unknown oracle {name!r}; oracles: {', '.join(sorted(ORACLES))}")
    return ORACLES[name]


class OracleBudget:
    """An oracle with a budget of calls, as PMO counts them: a molecule is scored once (by canonical SMILES;
    seeing it again costs nothing and returns the same score), unparsable molecules cost nothing, and
    after `budget` calls every new molecule gets None. `history`: `(canonical SMILES, score)` in call order."""

    def __init__(self, oracle_fn: Callable[[str], float], budget: int):
        self.oracle, self.budget = oracle_fn, int(budget)
        self.cache: dict[str, float] = {}
        self.history: list[tuple[str, float]] = []

    @property
    def calls(self) -> int:
        return len(self.history)

    @property
    def exhausted(self) -> bool:
        return self.calls >= self.budget

    def __call__(self, smiles: str) -> float | None:
        key = canonical(smiles)
        if key is None:
            return 0.0
        if key in self.cache:
            return self.cache[key]
        if self.exhausted:
            return None
        score = float(self.oracle(key))
        self.cache[key] = score
        self.history.append((key, score))
        return score


def top_k_auc(scores: Sequence[float], *, k: int = 10, budget: int, freq: int = 100, finish: bool = True) -> float:
    """PMO's AUC of the top-`k` average against oracle calls, normalised by `budget`: the mean of the best
    `k` scores so far, read every `freq` calls and integrated with the trapezoid rule; a run that ends
    before the budget keeps its last value to the budget (`finish`). `scores`: in call order."""
    scores = list(scores)[:budget]
    if not scores:
        return 0.0

    def top_mean(n: int) -> float:
        return float(np.mean(sorted(scores[:n], reverse=True)[:k]))

    area, previous, called = 0.0, 0.0, 0
    for n in range(freq, len(scores), freq):
        now = top_mean(n)
        area += freq * (now + previous) / 2
        previous, called = now, n
    now = top_mean(len(scores))
    area += (len(scores) - called) * (now + previous) / 2
    if finish and len(scores) < budget:
        area += (budget - len(scores)) * now
    return area / budget


__all__ = ["DRUGS", "ORACLES", "OracleBudget", "albuterol_similarity", "isomer_score", "median1", "oracle", "qed",
           "rediscovery", "similarity", "top_k_auc"]
