"""Fragment cutting and joining, the fragment vocabulary (jaxdllm.molecules.fragments) and molecule grids."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rdkit")

from rdkit import Chem  # noqa: E402

from jaxdllm.molecules.drawing import draw_grid  # noqa: E402
from jaxdllm.molecules.fragments import attach, cut, fragment_vocabulary, heavy_atoms, largest_component  # noqa: E402

MOLECULES = ("CC(C)Cc1ccc(C(C)C(=O)O)cc1", "CC(=O)Nc1ccc(O)cc1", "COc1ccc(C(=O)N(C)Cc2ccccc2)cc1OC",
             "Cc1ccc(-c2cc(C(F)(F)F)nn2-c2ccc(S(N)(=O)=O)cc2)cc1")


def _canonical(smiles):
    return Chem.MolToSmiles(Chem.MolFromSmiles(smiles))


def test_cut_gives_two_pieces_that_attach_back():
    rng = np.random.default_rng(0)
    for smiles in MOLECULES:
        acyclic = len(Chem.MolFromSmiles(smiles).GetSubstructMatches(Chem.MolFromSmarts("[*]-;!@[*]")))
        seen = set()
        for _ in range(12 * acyclic):
            pieces = cut(smiles, rng)
            assert len(pieces) == 2 and all(p.count("[1*]") == 1 and p.count("*") == 1 for p in pieces)
            assert attach(*pieces) == _canonical(smiles)
            seen.add(tuple(sorted(pieces)))
        assert len(seen) > 1  # different bonds are drawn
    assert cut("c1ccccc1", rng) is None  # no acyclic single bond
    assert cut("C1CC(", rng) is None


def test_attach_joins_at_the_attachment_points():
    assert attach("[1*]C", "[1*]O") == "CO"
    assert attach("[1*]c1ccccc1", "[1*]C(=O)O") == "O=C(O)c1ccccc1"
    assert attach("CC", "[1*]O") is None  # no attachment point
    assert attach("C1CC(", "[1*]O") is None


def test_fragment_vocabulary_scores_by_the_molecules_holding_each_fragment():
    rng = np.random.default_rng(1)
    # both molecules share the benzene side of every cut; many cuts per molecule reach every bond
    vocab = fragment_vocabulary(["OCCc1ccccc1", "NCCc1ccccc1"], [1.0, 0.0], rng, cuts_per_molecule=40, size=100)
    scores = {f: s for f, s, _ in vocab}
    for shared in ("[1*]c1ccccc1", "[1*]Cc1ccccc1", "[1*]CCc1ccccc1"):
        assert scores[shared] == pytest.approx(0.5)  # one molecule counts once, however often it was cut there
    assert scores["[1*]CCO"] == scores["[1*]CO"] == scores["[1*]O"] == 1.0
    assert scores["[1*]CCN"] == scores["[1*]CN"] == scores["[1*]N"] == 0.0
    assert len(vocab) == 9 and [s for _, s, _ in vocab] == sorted((s for _, s, _ in vocab), reverse=True)
    assert all(size == heavy_atoms(f) for f, _, size in vocab)
    top = fragment_vocabulary(["OCCc1ccccc1", "NCCc1ccccc1"], [1.0, 0.0], np.random.default_rng(1),
                              cuts_per_molecule=40, size=3)
    assert [f for f, _, _ in top] == ["[1*]CCO", "[1*]CO", "[1*]O"]  # ties broken by SMILES


def test_heavy_atoms_and_largest_component():
    assert heavy_atoms("CC(C)Cc1ccc(C(C)C(=O)O)cc1") == 15 and heavy_atoms("[1*]CCO") == 3
    assert heavy_atoms("C1CC(") == 0
    assert largest_component("CCO.c1ccccc1CC") == "CCc1ccccc1" and largest_component("[Na+].CC(=O)[O-]") == "CC(=O)[O-]"
    assert largest_component("") is None and largest_component("C1CC(") is None


def test_draw_grid_writes_a_png(tmp_path):
    path = draw_grid(list(MOLECULES) + ["C1CC(", None], tmp_path / "grid" / "molecules.png", per_row=3, size=(120, 120))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 0
    from PIL import Image

    assert Image.open(path).size == (360, 240)  # 4 drawable molecules, 3 per row
    labelled = draw_grid(["CCO", "xx"], tmp_path / "labelled.png", legends=["ethanol", "bad"])
    assert labelled.stat().st_size > 0
    assert draw_grid([None, "xx"], tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"


def test_two_step_linker_join_cuts_each_grown_linker_and_joins_the_two_fragments():
    """GenMol's `mix_sequences`: a molecule grown from the phenyl with an ethoxy-pyridine gives the linker
    -CH2CH2O- (cut where the phenyl and the pyridine start), which joins phenyl and morpholine both ways
    round; a molecule with no second ring has no linker, and None (a sample that did not decode) is skipped."""
    from jaxdllm.molecules.fragments import link_through_grown

    grown = ["c1ccccc1CCOc1ccncc1", None, "CCCc1ccccc1", "O=C(CC1CC1)N1CCOCC1"]
    got = link_through_grown(grown, "[*]c1ccccc1", "[*]N1CCOCC1", 10)
    want = ["c1ccccc1CCON1CCOCC1", "c1ccccc1OCCN1CCOCC1",  # the first molecule's linker, both orientations
            "O=C(Cc1ccccc1)N1CCOCC1", "O=C(CN1CCOCC1)c1ccccc1"]  # the last one's -CH2C(=O)- (grown from morpholine)
    assert sorted(got) == sorted(set(Chem.MolToSmiles(Chem.MolFromSmiles(s)) for s in want))
    assert len(link_through_grown(grown, "[*]c1ccccc1", "[*]N1CCOCC1", 1)) == 1
