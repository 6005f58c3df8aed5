"""Offline oracles, the call budget and PMO's AUC (jaxdllm.molecules.oracles) against values worked out here."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("rdkit")

from rdkit import Chem  # noqa: E402
from rdkit.Chem import rdFingerprintGenerator  # noqa: E402

from jaxdllm.errors import InputError  # noqa: E402
from jaxdllm.molecules.oracles import DRUGS, ORACLES, OracleBudget, oracle, similarity, top_k_auc  # noqa: E402

ASPIRIN = "CC(=O)Oc1ccccc1C(=O)O"
C7H8N2O2 = "Cc1cc([N+](=O)[O-])ccc1N"  # 2-methyl-4-nitroaniline


def _counts(smiles: str, **generator) -> dict[int, int]:
    gen = rdFingerprintGenerator.GetMorganGenerator(**generator)
    return dict(gen.GetSparseCountFingerprint(Chem.MolFromSmiles(smiles)).GetNonzeroElements())


def _count_tanimoto(a: dict[int, int], b: dict[int, int]) -> float:
    both = sum(min(a[k], b[k]) for k in a.keys() & b.keys())
    return both / (sum(a.values()) + sum(b.values()) - both)


def test_rediscovery_is_ecfp4_count_tanimoto():
    assert ORACLES["celecoxib_rediscovery"](DRUGS["celecoxib"]) == pytest.approx(1.0)
    assert ORACLES["celecoxib_rediscovery"]("Cc1ccc(-c2cc(C(F)(F)F)nn2-c2ccc(S(N)(=O)=O)cc2)cc1") == pytest.approx(1.0)
    want = _count_tanimoto(_counts(ASPIRIN, radius=2), _counts(DRUGS["celecoxib"], radius=2))
    assert 0 < want < 1 and ORACLES["celecoxib_rediscovery"](ASPIRIN) == pytest.approx(want)
    assert similarity(ASPIRIN, "celecoxib") == pytest.approx(want)


def test_albuterol_similarity_is_fcfp4_clipped_at_075():
    assert ORACLES["albuterol_similarity"](DRUGS["albuterol"]) == pytest.approx(1.0)
    feature = dict(radius=2, atomInvariantsGenerator=rdFingerprintGenerator.GetMorganFeatureAtomInvGen())
    for smiles in ("CC(C)(C)NCC(O)c1ccc(O)cc1", ASPIRIN):
        sim = _count_tanimoto(_counts(smiles, **feature), _counts(DRUGS["albuterol"], **feature))
        assert ORACLES["albuterol_similarity"](smiles) == pytest.approx(min(sim / 0.75, 1.0))


def test_isomer_scores():
    assert ORACLES["isomers_c7h8n2o2"](C7H8N2O2) == pytest.approx(1.0)
    assert ORACLES["isomers_c7h8n2o2"]("Nc1ccc(cc1)C(=O)NO") == pytest.approx(1.0)  # another C7H8N2O2
    # C8H10N2O2: C off by 1, H by 2, N and O exact; 22 atoms against 19 (sigma 2): geometric mean of 5 terms
    want = (math.exp(-0.5) * math.exp(-2) * 1 * 1 * math.exp(-0.5 * (3 / 2) ** 2)) ** (1 / 5)
    assert ORACLES["isomers_c7h8n2o2"]("CCc1cc([N+](=O)[O-])ccc1N") == pytest.approx(want)
    assert ORACLES["isomers_c7h8n2o2"]("CCc1cc([N+](=O)[O-])ccc1N") < 1.0
    # an element missing altogether counts 0: C7H8N2O2 against C9H10N2O2PF2Cl (7 terms, 19 vs 27 atoms)
    want = math.prod([math.exp(-0.5 * d ** 2) for d in (2, 2, 0, 0, 1, 2, 1)] + [math.exp(-0.5 * (8 / 2) ** 2)]) ** (1 / 8)
    assert ORACLES["isomers_c9h10n2o2pf2cl"](C7H8N2O2) == pytest.approx(want)


def test_mpo_and_hop_values_on_their_own_query_molecules():
    # perindopril has no aromatic ring: sqrt(1 * exp(-0.5 (0-2)^2 / 0.25)) = exp(-4)
    assert ORACLES["perindopril_mpo"](DRUGS["perindopril"]) == pytest.approx(math.exp(-4))
    # amlodipine has 2 rings against 3: sqrt(exp(-2)) = exp(-1)
    assert ORACLES["amlodipine_mpo"](DRUGS["amlodipine"]) == pytest.approx(math.exp(-1))
    # deco_hop's query keeps both decorations (0, 0) and the scaffold (1); scaffold_hop's keeps deco and scaffold
    assert ORACLES["deco_hop"](DRUGS["hop_query"]) == pytest.approx(0.5)
    assert ORACLES["scaffold_hop"](DRUGS["hop_query"]) == pytest.approx(2 / 3)
    assert ORACLES["median1"](DRUGS["camphor"]) == pytest.approx(math.sqrt(similarity(DRUGS["camphor"], "menthol")))


def test_every_oracle_is_in_range_and_zero_on_invalid():
    for name, fn in ORACLES.items():
        assert fn("not a molecule") == 0.0 and fn("") == 0.0, name
        for smiles in (ASPIRIN, C7H8N2O2, DRUGS["osimertinib"]):
            assert 0.0 <= fn(smiles) <= 1.0, name
    assert oracle("qed") is ORACLES["qed"] and ORACLES["qed"](ASPIRIN) == pytest.approx(0.55, abs=0.01)
    with pytest.raises(InputError, match="unknown oracle 'docking'.*celecoxib_rediscovery"):
        oracle("docking")


def test_the_budget_caches_by_canonical_smiles_and_stops():
    calls = []
    scorer = OracleBudget(lambda s: calls.append(s) or len(s) / 10, 3)
    assert scorer("OCC") == pytest.approx(0.3) and scorer("CCO") == pytest.approx(0.3)  # same molecule: one call
    assert scorer.calls == 1 and calls == ["CCO"]
    assert scorer("C1CC(") == 0.0 and scorer(None) == 0.0 and scorer.calls == 1  # unparsable: free
    assert scorer("CCN") == pytest.approx(0.3) and scorer("CCCC") == pytest.approx(0.4)
    assert scorer.exhausted and scorer("CCCCC") is None and scorer.calls == 3
    assert scorer("OCC") == pytest.approx(0.3)  # cached molecules still answer after the budget
    assert scorer.history == [("CCO", 0.3), ("CCN", 0.3), ("CCCC", 0.4)] and scorer.scores == [0.3, 0.3, 0.4]


def test_top10_auc_on_a_hand_computed_history_of_250_calls():
    scores = [i / 1000 for i in range(1, 251)]  # call i scores i/1000: the top 10 of n calls average (n - 4.5)/1000
    # readings every 100 calls: 0.0955 at 100, 0.1955 at 200; the run ends at 250 with 0.2455 and the
    # budget of 400 keeps that value for the remaining 150 calls; the curve starts at 0
    area = 100 * (0 + 0.0955) / 2 + 100 * (0.0955 + 0.1955) / 2 + 50 * (0.1955 + 0.2455) / 2 + 150 * 0.2455
    assert area == pytest.approx(67.175)
    assert top_k_auc(scores, k=10, budget=400, freq=100) == pytest.approx(67.175 / 400)
    assert top_k_auc([("C" * i, s) for i, s in enumerate(scores)], budget=400) == pytest.approx(67.175 / 400)
    unfinished = 100 * (0 + 0.0955) / 2 + 100 * (0.0955 + 0.1955) / 2 + 50 * (0.1955 + 0.2455) / 2
    assert top_k_auc(scores, budget=400, finish=False) == pytest.approx(unfinished / 400)
    # a run that used its whole budget: calls past the budget are ignored; a constant 1 scores (1 - 50/budget)
    assert top_k_auc([1.0] * 250, budget=200, freq=100) == pytest.approx((50 + 100) / 200)
    assert top_k_auc([], budget=100) == 0.0
