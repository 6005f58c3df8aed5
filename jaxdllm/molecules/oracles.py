"""Goal-directed oracles RDKit computes offline, an oracle-call budget, and PMO's AUC of the top-10 average.

The oracles are GuacaMol's goal-directed scoring functions as TDC (`tdc.Oracle`, the PMO benchmark GenMol
reports) defines them, written here from those definitions. Each maps a SMILES to a score in [0, 1] and
gives 0 for a string that does not parse. The building blocks:

* fingerprints, all *count* vectors compared with the count Tanimoto sum(min) / (sum a + sum b - sum min):
  ECFP4 = Morgan radius 2, ECFP6 = Morgan radius 3, FCFP4 = Morgan radius 2 on feature invariants, AP =
  atom pairs up to distance 10 (RDKit's unhashed generators, the same numbers as the old
  `AllChem.GetMorganFingerprint(mol, r[, useFeatures=True])` / `GetAtomPairFingerprint(mol, maxLength=10)`);
* modifiers: `gaussian(x; mu, sigma) = exp(-((x - mu) / sigma)^2 / 2)`; `min_gaussian` is 1 for x <= mu and
  the Gaussian above; `max_gaussian` is 1 for x >= mu and the Gaussian below; `clipped(x; upper) =
  clip(x / upper, 0, 1)`;
* the geometric mean `prod(v) ** (1 / n)` (a zero term makes it 0).

The oracles (`ORACLES`):

* `qed`: RDKit's QED.
* `celecoxib_rediscovery`, `troglitazone_rediscovery`, `thiothixene_rediscovery`: ECFP4 Tanimoto to the drug.
* `albuterol_similarity`, `aripiprazole_similarity`: FCFP4 Tanimoto, clipped at 0.75;
  `mestranol_similarity`: AP Tanimoto, clipped at 0.75.
* `isomers_c7h8n2o2`, `isomers_c9h10n2o2pf2cl`: GuacaMol's isomer score, the geometric mean of one
  `gaussian(count; n_e, 1)` per element e of the formula (hydrogens counted after adding them) and
  `gaussian(all atoms with hydrogens; total of the formula, 2)`. (TDC's older `Isomer_scoring_prev` took the
  total from the letters of the SMILES string; its current `Isomer_scoring` and GuacaMol count atoms, as here.)
* `median1`: geometric mean of the ECFP4 similarities to camphor and menthol; `median2`: of the ECFP6
  similarities to tadalafil and sildenafil.
* `osimertinib_mpo`: gmean(clipped(FCFP4 sim, 0.8), min_gaussian(ECFP6 sim; 0.85, 0.1),
  max_gaussian(TPSA; 100, 10), min_gaussian(logP; 1, 1)).
* `fexofenadine_mpo`: gmean(clipped(AP sim, 0.8), max_gaussian(TPSA; 90, 10), min_gaussian(logP; 4, 1)).
* `ranolazine_mpo`: gmean(clipped(AP sim, 0.7), max_gaussian(TPSA; 95, 20), max_gaussian(logP; 7, 1),
  gaussian(fluorine atoms; 1, 1)).
* `perindopril_mpo`: gmean(ECFP4 sim, gaussian(aromatic rings; 2, 0.5)).
* `amlodipine_mpo`: gmean(ECFP4 sim, gaussian(rings; 3, 0.5)).
* `sitagliptin_mpo`: gmean(gaussian(ECFP4 sim; 0, 0.1), gaussian(logP; logP of sitagliptin, 0.2),
  gaussian(TPSA; TPSA of sitagliptin, 5), isomer score C16H15F6N5O).
* `zaleplon_mpo`: gmean(ECFP4 sim, isomer score C19H17N3O2).
* `valsartan_smarts`: gmean(1 if the SMARTS `CN(C=O)Cc1ccc(c2ccccc2)cc1` matches else 0, gaussian(TPSA;
  sitagliptin's, 5), gaussian(logP; sitagliptin's, 0.2), gaussian(BertzCT; sitagliptin's, 30)).
* `deco_hop`, `scaffold_hop`: the *arithmetic* mean of a clipped Tanimoto (0.85 / 0.75) on Gobbi 2D
  pharmacophore fingerprints to the query molecule and SMARTS indicators (present or absent) given below.

PMO's other three tasks (drd2, gsk3b, jnk3) are trained classifiers, not computed here.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Callable, Sequence

import numpy as np
from rdkit import Chem, DataStructs, RDLogger
from rdkit.Chem import Descriptors, rdFingerprintGenerator, rdMolDescriptors

from jaxdllm.errors import InputError
from jaxdllm.molecules.metrics import canonical, qed as qed_of

RDLogger.DisableLog("rdApp.*")

DRUGS = {
    "celecoxib": "CC1=CC=C(C=C1)C1=CC(=NN1C1=CC=C(C=C1)S(N)(=O)=O)C(F)(F)F",
    "troglitazone": "Cc1c(C)c2OC(C)(COc3ccc(CC4SC(=O)NC4=O)cc3)CCc2c(C)c1O",
    "thiothixene": "CN(C)S(=O)(=O)c1ccc2Sc3ccccc3C(=CCCN4CCN(C)CC4)c2c1",
    "albuterol": "CC(C)(C)NCC(O)c1ccc(O)c(CO)c1",
    "aripiprazole": "Clc4cccc(N3CCN(CCCCOc2ccc1c(NC(=O)CC1)c2)CC3)c4Cl",
    "mestranol": "COc1ccc2[C@H]3CC[C@@]4(C)[C@@H](CC[C@@]4(O)C#C)[C@@H]3CCc2c1",
    "camphor": "CC1(C)C2CCC1(C)C(=O)C2",
    "menthol": "CC(C)C1CCC(C)CC1O",
    "tadalafil": "O=C1N(CC(N2C1CC3=C(C2C4=CC5=C(OCO5)C=C4)NC6=C3C=CC=C6)=O)C",
    "sildenafil": "CCCC1=NN(C2=C1N=C(NC2=O)C3=C(C=CC(=C3)S(=O)(=O)N4CCN(CC4)C)OCC)C",
    "osimertinib": "COc1cc(N(C)CCN(C)C)c(NC(=O)C=C)cc1Nc2nccc(n2)c3cn(C)c4ccccc34",
    "fexofenadine": "CC(C)(C(=O)O)c1ccc(cc1)C(O)CCCN2CCC(CC2)C(O)(c3ccccc3)c4ccccc4",
    "ranolazine": "COc1ccccc1OCC(O)CN2CCN(CC(=O)Nc3c(C)cccc3C)CC2",
    "perindopril": "O=C(OCC)C(NC(C(=O)N1C(C(=O)O)CC2CCCCC12)C)CCC",
    "amlodipine": "Clc1ccccc1C2C(=C(/N/C(=C2/C(=O)OCC)COCCN)C)\\C(=O)OC",
    "sitagliptin": "Fc1cc(c(F)cc1F)CC(N)CC(=O)N3Cc2nnc(n2CC3)C(F)(F)F",
    "zaleplon": "O=C(C)N(CC)C1=CC=CC(C2=CC=NC3=C(C=NN23)C#N)=C1",
    "hop_query": "CCCOc1cc2ncnc(Nc3ccc4ncsc4c3)c2cc1S(=O)(=O)C(C)(C)C",  # deco_hop / scaffold_hop
}

_FINGERPRINTS = {
    "ECFP4": rdFingerprintGenerator.GetMorganGenerator(radius=2),
    "ECFP6": rdFingerprintGenerator.GetMorganGenerator(radius=3),
    "FCFP4": rdFingerprintGenerator.GetMorganGenerator(
        radius=2, atomInvariantsGenerator=rdFingerprintGenerator.GetMorganFeatureAtomInvGen()),
    "AP": rdFingerprintGenerator.GetAtomPairGenerator(maxDistance=10),
}


def _mol(smiles: str | None):
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    return mol if mol is not None and mol.GetNumAtoms() else None


def fingerprint(mol: Chem.Mol, kind: str = "ECFP4"):
    """The count fingerprint `kind` ("ECFP4", "ECFP6", "FCFP4", "AP", or "PHCO": Gobbi 2D pharmacophores)
    of an RDKit molecule."""
    if kind == "PHCO":
        from rdkit.Chem.Pharm2D import Generate, Gobbi_Pharm2D

        return Generate.Gen2DFingerprint(mol, Gobbi_Pharm2D.factory)
    return _FINGERPRINTS[kind].GetSparseCountFingerprint(mol)


@functools.lru_cache(maxsize=64)
def _target_fingerprint(smiles: str, kind: str):
    return fingerprint(Chem.MolFromSmiles(smiles), kind)


def _similarity(mol: Chem.Mol, target: str, kind: str) -> float:
    return float(DataStructs.TanimotoSimilarity(fingerprint(mol, kind), _target_fingerprint(target, kind)))


def similarity(smiles: str, target: str, fingerprint: str = "ECFP4") -> float:
    """Tanimoto similarity of `smiles` to `target` (a SMILES or a name in `DRUGS`) on the `fingerprint`
    kind; 0 when `smiles` does not parse."""
    mol = _mol(smiles)
    return 0.0 if mol is None else _similarity(mol, DRUGS.get(target, target), fingerprint)


def gaussian(x: float, mu: float, sigma: float) -> float:
    """exp(-((x - mu) / sigma)^2 / 2)."""
    return float(math.exp(-0.5 * ((x - mu) / sigma) ** 2))


def min_gaussian(x: float, mu: float, sigma: float) -> float:
    """1 for x <= mu, `gaussian` above (GuacaMol's MinGaussianModifier: smaller is fine)."""
    return gaussian(max(x, mu), mu, sigma)


def max_gaussian(x: float, mu: float, sigma: float) -> float:
    """1 for x >= mu, `gaussian` below (GuacaMol's MaxGaussianModifier: larger is fine)."""
    return gaussian(min(x, mu), mu, sigma)


def clipped(x: float, upper: float) -> float:
    """clip(x / upper, 0, 1) (GuacaMol's ClippedScoreModifier with lower 0)."""
    return float(min(max(x / upper, 0.0), 1.0))


def geometric_mean(values: Sequence[float]) -> float:
    """prod(values) ** (1 / len(values)); 0 when any value is 0."""
    values = [float(v) for v in values]
    return 0.0 if min(values) <= 0 else float(math.exp(sum(math.log(v) for v in values) / len(values)))


def _safe(score: Callable[[Chem.Mol], float]) -> Callable[[str], float]:
    """A SMILES oracle from a molecule score: 0 for what does not parse."""

    @functools.wraps(score)
    def oracle_fn(smiles: str) -> float:
        mol = _mol(smiles)
        return 0.0 if mol is None else float(score(mol))

    return oracle_fn


def _formula_counts(formula: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for element, count in re.findall(r"([A-Z][a-z]?)(\d*)", formula):
        counts[element] = counts.get(element, 0) + int(count or 1)
    return counts


def _isomer(mol: Chem.Mol, target: dict[str, int]) -> float:
    atoms = Chem.AddHs(mol).GetAtoms()
    counts: dict[str, int] = {}
    for atom in atoms:
        counts[atom.GetSymbol()] = counts.get(atom.GetSymbol(), 0) + 1
    parts = [gaussian(counts.get(e, 0), n, 1.0) for e, n in target.items()]
    parts.append(gaussian(len(atoms), sum(target.values()), 2.0))
    return geometric_mean(parts)


def isomer_score(formula: str) -> Callable[[str], float]:
    """GuacaMol's isomer oracle for `formula` (e.g. "C7H8N2O2"): geometric mean of a Gaussian (sigma 1) on
    each element's atom count and one (sigma 2) on the total atom count, hydrogens included."""
    target = _formula_counts(formula)
    return _safe(lambda mol: _isomer(mol, target))


def rediscovery(drug: str) -> Callable[[str], float]:
    """GuacaMol's rediscovery of `drug` (a name in `DRUGS`): ECFP4 count Tanimoto similarity to it."""
    target = DRUGS[drug]
    return _safe(lambda mol: _similarity(mol, target, "ECFP4"))


def similar_to(drug: str, kind: str = "FCFP4", threshold: float = 0.75) -> Callable[[str], float]:
    """GuacaMol's similarity oracle: `clipped(Tanimoto on kind, threshold)` to `drug` (a name in `DRUGS`)."""
    target = DRUGS[drug]
    return _safe(lambda mol: clipped(_similarity(mol, target, kind), threshold))


def median(drug_a: str, drug_b: str, kind: str) -> Callable[[str], float]:
    """Geometric mean of the `kind` similarities to two drugs (GuacaMol's median molecules)."""
    a, b = DRUGS[drug_a], DRUGS[drug_b]
    return _safe(lambda mol: geometric_mean([_similarity(mol, a, kind), _similarity(mol, b, kind)]))


@functools.lru_cache(maxsize=1)
def _sitagliptin_properties() -> tuple[float, float, float]:
    mol = Chem.MolFromSmiles(DRUGS["sitagliptin"])
    return Descriptors.MolLogP(mol), Descriptors.TPSA(mol), Descriptors.BertzCT(mol)


_C16H15F6N5O, _C19H17N3O2 = _formula_counts("C16H15F6N5O"), _formula_counts("C19H17N3O2")


def _osimertinib(mol):
    return geometric_mean([clipped(_similarity(mol, DRUGS["osimertinib"], "FCFP4"), 0.8),
                           min_gaussian(_similarity(mol, DRUGS["osimertinib"], "ECFP6"), 0.85, 0.1),
                           max_gaussian(Descriptors.TPSA(mol), 100, 10),
                           min_gaussian(Descriptors.MolLogP(mol), 1, 1)])


def _fexofenadine(mol):
    return geometric_mean([clipped(_similarity(mol, DRUGS["fexofenadine"], "AP"), 0.8),
                           max_gaussian(Descriptors.TPSA(mol), 90, 10), min_gaussian(Descriptors.MolLogP(mol), 4, 1)])


def _ranolazine(mol):
    fluorines = sum(a.GetSymbol() == "F" for a in mol.GetAtoms())
    return geometric_mean([clipped(_similarity(mol, DRUGS["ranolazine"], "AP"), 0.7),
                           max_gaussian(Descriptors.TPSA(mol), 95, 20), max_gaussian(Descriptors.MolLogP(mol), 7, 1),
                           gaussian(fluorines, 1, 1.0)])


def _perindopril(mol):
    return geometric_mean([_similarity(mol, DRUGS["perindopril"], "ECFP4"),
                           gaussian(rdMolDescriptors.CalcNumAromaticRings(mol), 2, 0.5)])


def _amlodipine(mol):
    return geometric_mean([_similarity(mol, DRUGS["amlodipine"], "ECFP4"),
                           gaussian(rdMolDescriptors.CalcNumRings(mol), 3, 0.5)])


def _sitagliptin(mol):
    logp, tpsa, _ = _sitagliptin_properties()
    return geometric_mean([gaussian(_similarity(mol, DRUGS["sitagliptin"], "ECFP4"), 0, 0.1),
                           gaussian(Descriptors.MolLogP(mol), logp, 0.2), gaussian(Descriptors.TPSA(mol), tpsa, 5),
                           _isomer(mol, _C16H15F6N5O)])


def _zaleplon(mol):
    return geometric_mean([_similarity(mol, DRUGS["zaleplon"], "ECFP4"), _isomer(mol, _C19H17N3O2)])


@functools.lru_cache(maxsize=16)
def _smarts(pattern: str) -> Chem.Mol:
    return Chem.MolFromSmarts(pattern)


def _has(mol, pattern: str) -> float:
    return 1.0 if mol.HasSubstructMatch(_smarts(pattern)) else 0.0


def _valsartan(mol):
    logp, tpsa, bertz = _sitagliptin_properties()
    return geometric_mean([_has(mol, "CN(C=O)Cc1ccc(c2ccccc2)cc1"), gaussian(Descriptors.TPSA(mol), tpsa, 5),
                           gaussian(Descriptors.MolLogP(mol), logp, 0.2), gaussian(Descriptors.BertzCT(mol), bertz, 30)])


_HOP_SCAFFOLD = "[#7]-c1n[c;h1]nc2[c;h1]c(-[#8])[c;h0][c;h1]c12"


def _deco_hop(mol):
    return float(np.mean([clipped(_similarity(mol, DRUGS["hop_query"], "PHCO"), 0.85),
                          1 - _has(mol, "CS([#6])(=O)=O"), 1 - _has(mol, "[#7]-c1ccc2ncsc2c1"), _has(mol, _HOP_SCAFFOLD)]))


def _scaffold_hop(mol):
    return float(np.mean([clipped(_similarity(mol, DRUGS["hop_query"], "PHCO"), 0.75),
                          _has(mol, "[#6]-[#6]-[#6]-[#8]-[#6]~[#6]~[#6]~[#6]~[#6]-[#7]-c1ccc2ncsc2c1"),
                          1 - _has(mol, _HOP_SCAFFOLD)]))


def qed(smiles: str) -> float:
    """QED of a SMILES (0 when it does not parse)."""
    mol = _mol(smiles)
    return 0.0 if mol is None else qed_of(mol)


albuterol_similarity = similar_to("albuterol")
median1 = median("camphor", "menthol", "ECFP4")

ORACLES: dict[str, Callable[[str], float]] = {
    "qed": qed,
    "celecoxib_rediscovery": rediscovery("celecoxib"),
    "troglitazone_rediscovery": rediscovery("troglitazone"),
    "thiothixene_rediscovery": rediscovery("thiothixene"),
    "albuterol_similarity": albuterol_similarity,
    "aripiprazole_similarity": similar_to("aripiprazole"),
    "mestranol_similarity": similar_to("mestranol", "AP"),
    "isomers_c7h8n2o2": isomer_score("C7H8N2O2"),
    "isomers_c9h10n2o2pf2cl": isomer_score("C9H10N2O2PF2Cl"),
    "median1": median1,
    "median2": median("tadalafil", "sildenafil", "ECFP6"),
    "osimertinib_mpo": _safe(_osimertinib),
    "fexofenadine_mpo": _safe(_fexofenadine),
    "ranolazine_mpo": _safe(_ranolazine),
    "perindopril_mpo": _safe(_perindopril),
    "amlodipine_mpo": _safe(_amlodipine),
    "sitagliptin_mpo": _safe(_sitagliptin),
    "zaleplon_mpo": _safe(_zaleplon),
    "valsartan_smarts": _safe(_valsartan),
    "deco_hop": _safe(_deco_hop),
    "scaffold_hop": _safe(_scaffold_hop),
}


def oracle(name: str) -> Callable[[str], float]:
    """The oracle called `name` (a key of `ORACLES`): a function SMILES -> score in [0, 1]. Raises
    `InputError` listing the names for an unknown one."""
    if name not in ORACLES:
        raise InputError(f"unknown oracle {name!r}; oracles: {', '.join(sorted(ORACLES))}")
    return ORACLES[name]


class OracleBudget:
    """An oracle with a budget of calls, counted as PMO counts them.

    `OracleBudget(oracle_fn, budget)(smiles)` returns the score of `smiles`. A molecule is scored once, keyed
    by its canonical SMILES: seeing it again costs nothing and returns the cached score. An unparsable or
    empty string costs nothing and scores 0. Once `budget` molecules have been scored, every new molecule
    gets None (`exhausted` is True). `history` holds `(canonical SMILES, score)` in call order, `scores` the
    scores alone, `calls` their number."""

    def __init__(self, oracle_fn: Callable[[str], float], budget: int):
        self.oracle, self.budget = oracle_fn, int(budget)
        self.cache: dict[str, float] = {}
        self.history: list[tuple[str, float]] = []

    @property
    def calls(self) -> int:
        """Oracle calls made so far (distinct valid molecules scored)."""
        return len(self.history)

    @property
    def exhausted(self) -> bool:
        """True once `budget` calls have been made."""
        return self.calls >= self.budget

    @property
    def scores(self) -> list[float]:
        """The scores of `history`, in call order."""
        return [score for _, score in self.history]

    def __call__(self, smiles: str | None) -> float | None:
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


def top_k_auc(history: Sequence, *, k: int = 10, budget: int, freq: int = 100, finish: bool = True) -> float:
    """PMO's AUC of the top-`k` average (`top_auc` of the mol_opt benchmark), normalised by `budget`.

    `history`: the scores in call order (floats, or `(smiles, score)` pairs as `OracleBudget.history`).
    At every `freq`-th call n below min(len, budget) the mean of the best `k` scores among the first n is
    read; the readings (starting from 0 at call 0) are integrated with the trapezoid rule, the last
    segment running to the last call with the mean over all calls. A run that ended before the budget
    (`finish`) keeps that last value for the calls it did not make. Returns area / budget in [0, 1]
    for scores in [0, 1]; 0 for an empty history."""
    scores = [float(h[1]) if isinstance(h, (tuple, list)) else float(h) for h in history][:budget]
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


__all__ = ["DRUGS", "ORACLES", "OracleBudget", "albuterol_similarity", "clipped", "fingerprint", "gaussian",
           "geometric_mean", "isomer_score", "max_gaussian", "median", "median1", "min_gaussian", "oracle", "qed",
           "rediscovery", "similar_to", "similarity", "top_k_auc"]
