"""GenMol's metrics, the offline oracles, PMO's AUC and the fragment tools against values computed here
by hand (fingerprint bit sets, formulas, a short call history)."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("rdkit")
pytest.importorskip("safe")

from rdkit import Chem  # noqa: E402
from rdkit.Chem import rdFingerprintGenerator  # noqa: E402

from jaxdllm.molecules.fragments import attach, cut, fragment_vocabulary, heavy_atoms, largest_component  # noqa: E402
from jaxdllm.molecules.metrics import denovo_metrics, fragment_metrics, qed, quality_share, sa_score  # noqa: E402
from jaxdllm.molecules.oracles import DRUGS, ORACLES, OracleBudget, oracle, top_k_auc  # noqa: E402

ASPIRIN, PARACETAMOL, IBUPROFEN = "CC(=O)Oc1ccccc1C(=O)O", "CC(=O)Nc1ccc(O)cc1", "CC(C)Cc1ccc(C(C)C(=O)O)cc1"


def _bits(smiles, size=2048):
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=size)
    return set(generator.GetFingerprint(Chem.MolFromSmiles(smiles)).GetOnBits())


def _tanimoto(a, b):
    return len(a & b) / len(a | b)


def test_denovo_metrics_count_as_genmol_defines_them():
    samples = [ASPIRIN, "O=C(C)Oc1ccccc1C(O)=O", PARACETAMOL, None, "C1CC(", IBUPROFEN]  # aspirin twice
    m = denovo_metrics(samples)
    assert m["validity"] == pytest.approx(4 / 6) and m["uniqueness"] == pytest.approx(3 / 4)
    good = sum(qed(Chem.MolFromSmiles(s)) >= 0.6 and sa_score(Chem.MolFromSmiles(s)) <= 4
               for s in (ASPIRIN, PARACETAMOL, IBUPROFEN))
    assert m["quality"] == pytest.approx(good / 6)
    a, p, i = _bits(ASPIRIN), _bits(PARACETAMOL), _bits(IBUPROFEN)
    mean = (_tanimoto(a, p) + _tanimoto(a, i) + _tanimoto(p, i)) / 3
    assert m["diversity"] == pytest.approx(1 - mean)
    assert quality_share([ASPIRIN, PARACETAMOL]) == pytest.approx(
        np.mean([qed(Chem.MolFromSmiles(s)) >= 0.6 and sa_score(Chem.MolFromSmiles(s)) <= 4
                 for s in (ASPIRIN, PARACETAMOL)]))


def test_fragment_distance_uses_1024_bit_fingerprints_of_the_reference():
    m = fragment_metrics([PARACETAMOL, IBUPROFEN, None], "[*]c1ccccc1", ASPIRIN, 3)
    ref = _bits(ASPIRIN, 1024)
    want = 1 - np.mean([_tanimoto(ref, _bits(PARACETAMOL, 1024)), _tanimoto(ref, _bits(IBUPROFEN, 1024))])
    assert m["distance"] == pytest.approx(want) and m["validity"] == pytest.approx(2 / 3)


def test_published_values_of_qed_and_sa():
    assert qed(Chem.MolFromSmiles(ASPIRIN)) == pytest.approx(0.55, abs=0.01)  # Bickerton et al. 2012, Table
    assert 1 <= sa_score(Chem.MolFromSmiles("c1ccccc1")) < 2  # benzene: trivially accessible
    assert sa_score(Chem.MolFromSmiles(DRUGS["troglitazone"])) > sa_score(Chem.MolFromSmiles(ASPIRIN))


def test_oracles_score_their_targets_and_counts():
    assert ORACLES["celecoxib_rediscovery"](DRUGS["celecoxib"]) == pytest.approx(1.0)
    assert ORACLES["albuterol_similarity"](DRUGS["albuterol"]) == pytest.approx(1.0)
    assert ORACLES["isomers_c7h8n2o2"]("Cc1cc([N+](=O)[O-])ccc1N") == pytest.approx(1.0)  # C7H8N2O2
    # one carbon too many (C8H10N2O2): every element factor 1 except C and H (off by 1 and 2), total off by 3
    want = (math.exp(-0.5) * math.exp(-2) * 1 * 1 * math.exp(-0.5 * (3 / 2) ** 2)) ** (1 / 5)
    assert ORACLES["isomers_c7h8n2o2"]("CCc1cc([N+](=O)[O-])ccc1N") == pytest.approx(want)
    assert all(f("not a molecule") == 0.0 for f in ORACLES.values())
    with pytest.raises(Exception, match="unknown oracle"):
        oracle("docking")


def test_the_budget_caches_by_molecule_and_stops():
    calls = []
    budget = OracleBudget(lambda s: calls.append(s) or 0.5, 2)
    assert budget("OCC") == 0.5 and budget("CCO") == 0.5 and budget.calls == 1  # the same molecule
    assert budget("C1CC(") == 0.0 and budget.calls == 1  # unparsable: free
    assert budget("CCN") == 0.5 and budget.exhausted and budget("CCCC") is None and len(calls) == 2


def test_top10_auc_is_pmos_trapezoid_with_the_last_value_extended():
    scores = [0.1] * 150 + [1.0] * 10 + [0.2] * 40  # 200 calls of a 400-call budget, read every 100
    top = lambda n: np.mean(sorted(scores[:n], reverse=True)[:10])  # noqa: E731
    area = 100 * (top(100) + 0) / 2 + 100 * (top(200) + top(100)) / 2 + 200 * top(200)
    assert top_k_auc(scores, k=10, budget=400, freq=100) == pytest.approx(area / 400)
    assert top_k_auc([0.7] * 400, budget=400, freq=100) == pytest.approx((50 * 0.7 + 300 * 0.7) / 400)  # from 0 at call 0


def test_cut_and_attach_take_a_molecule_apart_and_back():
    rng = np.random.default_rng(0)
    for smiles in (IBUPROFEN, PARACETAMOL, "COc1ccc(C(=O)N(C)Cc2ccccc2)cc1OC"):
        for _ in range(3):
            a, b = cut(smiles, rng)
            assert a.count("[1*]") == 1 and b.count("[1*]") == 1
            assert attach(a, b) == Chem.MolToSmiles(Chem.MolFromSmiles(smiles))
    assert cut("c1ccccc1", rng) is None  # no acyclic single bond
    vocab = fragment_vocabulary([IBUPROFEN, PARACETAMOL], [1.0, 0.0], rng, size=50)
    scores = dict((f, s) for f, s, _ in vocab)
    assert all(s in (0.0, 0.5, 1.0) for s in scores.values()) and max(scores.values()) == 1.0
    assert heavy_atoms(IBUPROFEN) == 15 and largest_component("CCO.c1ccccc1CC") == "CCc1ccccc1"
