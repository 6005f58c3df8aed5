"""GenMol's metrics (jaxdllm.molecules.metrics) against counts and fingerprint bit sets worked out here."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

pytest.importorskip("rdkit")

from rdkit import Chem, RDLogger  # noqa: E402
from rdkit.Chem import AllChem, rdFingerprintGenerator  # noqa: E402

from jaxdllm.molecules.metrics import (canonical, denovo_metrics, diversity, fragment_core,  # noqa: E402
                                       fragment_metrics, qed, quality_share, sa_score)

ASPIRIN, PARACETAMOL, IBUPROFEN = "CC(=O)Oc1ccccc1C(=O)O", "CC(=O)Nc1ccc(O)cc1", "CC(C)Cc1ccc(C(C)C(=O)O)cc1"
ASPIRIN_AGAIN = "O=C(C)Oc1ccccc1C(O)=O"  # the same molecule written differently


def _bits(smiles: str, size: int = 2048) -> set[int]:
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=size)
    return set(generator.GetFingerprint(Chem.MolFromSmiles(smiles)).GetOnBits())


def _tanimoto(a: set[int], b: set[int]) -> float:
    return len(a & b) / len(a | b)


def _mol(smiles):
    return Chem.MolFromSmiles(smiles)


def test_canonical_smiles_and_what_does_not_parse():
    assert canonical("OCC") == canonical("CCO") == "CCO"
    assert canonical(ASPIRIN_AGAIN) == canonical(ASPIRIN)
    assert canonical(None) is None and canonical("") is None and canonical("C1CC(") is None


def test_published_qed_and_sa_values():
    assert qed(_mol(ASPIRIN)) == pytest.approx(0.55, abs=0.01)  # Bickerton et al. 2012
    assert sa_score(_mol("c1ccccc1")) == pytest.approx(1.0)  # the easiest end of Ertl's 1..10 scale
    assert 1.0 <= sa_score(_mol(ASPIRIN)) < 2.5  # small drugs score "easy" (Ertl & Schuffenhauer 2009, Fig. 5)
    assert sa_score(_mol("CC12CCC3C(CCC4CC(O)CCC34C)C1CCC2O")) > sa_score(_mol(ASPIRIN))  # a steroid: stereocentres


def test_denovo_counts_with_a_duplicate_and_invalid_samples():
    samples = [ASPIRIN, ASPIRIN_AGAIN, PARACETAMOL, None, "C1CC(", "", IBUPROFEN]
    m = denovo_metrics(samples)
    # valid: aspirin twice, paracetamol, ibuprofen = 4 of 7; unique: 3 of 4
    assert (m["num_samples"], m["num_valid"], m["num_unique"]) == (7, 4, 3)
    assert m["validity"] == pytest.approx(4 / 7) and m["uniqueness"] == pytest.approx(3 / 4)
    # quality needs QED >= 0.6 and SA <= 4: aspirin (QED 0.55) and paracetamol (0.595) miss, ibuprofen (0.82) meets
    assert qed(_mol(ASPIRIN)) < 0.6 and qed(_mol(PARACETAMOL)) < 0.6
    assert qed(_mol(IBUPROFEN)) >= 0.6 and sa_score(_mol(IBUPROFEN)) <= 4
    assert m["num_quality"] == 1 and m["quality"] == pytest.approx(1 / 7)
    # a duplicate of a quality molecule counts once; num_samples sets the denominator
    m = denovo_metrics([IBUPROFEN, IBUPROFEN, "CC(C)Cc1ccc(cc1)C(C)C(O)=O"], num_samples=10)
    assert (m["validity"], m["uniqueness"], m["quality"]) == pytest.approx((0.3, 1 / 3, 0.1))
    assert denovo_metrics([None, ""])["validity"] == 0.0 and denovo_metrics([None])["diversity"] == 0.0


def test_diversity_is_tdcs_mean_over_unordered_pairs():
    # two molecules: 1 - their Tanimoto on explicit Morgan r2 2048-bit sets
    a, p = _bits(ASPIRIN), _bits(PARACETAMOL)
    assert denovo_metrics([ASPIRIN, PARACETAMOL])["diversity"] == pytest.approx(1 - _tanimoto(a, p))
    # three: the mean of the three pairwise distances (TDC averages the upper triangle, not the full matrix)
    smiles = [ASPIRIN, PARACETAMOL, IBUPROFEN]
    pairs = [1 - _tanimoto(_bits(x), _bits(y)) for x, y in itertools.combinations(smiles, 2)]
    assert len(pairs) == 3
    assert diversity(smiles) == pytest.approx(np.mean(pairs))
    full_matrix_mean = sum(pairs) * 2 / 9  # with the zero-distance diagonal: a different number
    assert diversity(smiles) != pytest.approx(full_matrix_mean)
    # duplicates do not count twice: de novo diversity is over the distinct molecules
    assert denovo_metrics(smiles + [ASPIRIN_AGAIN])["diversity"] == pytest.approx(np.mean(pairs))


def test_fingerprints_are_the_ones_tdc_uses():
    RDLogger.DisableLog("rdApp.*")  # the legacy call TDC makes is deprecated
    for smiles in (ASPIRIN, IBUPROFEN):
        legacy = AllChem.GetMorganFingerprintAsBitVect(_mol(smiles), 2, nBits=2048, useChirality=False)
        assert set(legacy.GetOnBits()) == _bits(smiles)


def test_fragment_metrics_distance_and_fragment_share():
    samples = [PARACETAMOL, IBUPROFEN, IBUPROFEN, None]
    m = fragment_metrics(samples, "[1*]c1ccc(O)cc1", ASPIRIN, 4)
    ref = _bits(ASPIRIN, 1024)
    want = 1 - np.mean([_tanimoto(ref, _bits(PARACETAMOL, 1024)), _tanimoto(ref, _bits(IBUPROFEN, 1024))])
    assert m["distance"] == pytest.approx(want)
    assert m["validity"] == pytest.approx(3 / 4) and m["uniqueness"] == pytest.approx(2 / 3)
    # the fragment without its attachment point is a phenol: paracetamol holds it, ibuprofen does not
    assert m["num_with_fragment"] == 1 and m["contains_fragment"] == pytest.approx(1 / 2)
    assert m["fragment"] == "[1*]c1ccc(O)cc1"
    assert Chem.MolToSmiles(fragment_core("[1*]c1ccc(O)cc1")) == "Oc1ccccc1"
    empty = fragment_metrics([None], "[1*]C", ASPIRIN, 1)
    assert empty["distance"] == 0.0 and empty["contains_fragment"] == 0.0


def test_quality_share():
    assert quality_share([ASPIRIN, IBUPROFEN, PARACETAMOL, "C1CC("]) == pytest.approx(1 / 4)
    assert quality_share([]) == 0.0
