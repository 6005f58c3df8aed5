"""SAFE strings, the SAFE tokenizer and the MOSES preparation: round trips against RDKit's canonical
SMILES, the published SAFE example, GenMol's special ids, a prepared folder from a wheel built here,
and the rows the `safe_molecules` source feeds a recipe."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("rdkit")
pytest.importorskip("safe")

from rdkit import Chem  # noqa: E402
from support.molecules import fake_molsets_wheel  # noqa: E402

from jaxdllm.molecules.moses import prepare, read_length_histogram, read_pairs, write_pairs  # noqa: E402
from jaxdllm.molecules.safe_text import SafeEncodeError, safe_to_smiles, smiles_to_safe  # noqa: E402
from jaxdllm.molecules.safe_tokenizer import (SPECIAL_TOKENS, build_safe_tokenizer, split_safe,  # noqa: E402
                                              unpaired_digits)

# MOSES training molecules (the first lines of moses/dataset/data/train.csv.gz)
MOSES = ["CCCS(=O)c1ccc2[nH]c(=NC(=O)OC)[nH]c2c1", "CC(C)(C)C(=O)C(Oc1ccc(Cl)cc1)n1ccnc1",
         "Cc1c(Cl)cccc1Nc1ncccc1C(=O)OCC(O)CO", "Cn1cnc2c1c(=O)n(CC(O)CO)c(=O)n2C",
         "CC1Oc2ccc(Cl)cc2N(CC(O)CO)C1=O", "CCOC(=O)c1cncn1C1CCCc2ccccc21",
         "COc1ccc(C(=O)N(C)Cc2ccccc2)cc1OC", "O=C(Nc1ccc(F)cc1)c1cccc(S(=O)(=O)N2CCCC2)c1"]
IBUPROFEN = "CC(Cc1ccc(cc1)C(C(=O)O)C)C"


def canonical(smiles):
    return Chem.MolToSmiles(Chem.MolFromSmiles(smiles))


def test_safe_round_trips_to_the_same_molecule():
    for smiles in MOSES + [IBUPROFEN, "c1ccccc1"]:  # benzene has no BRICS bond: kept whole
        safe = smiles_to_safe(smiles)
        assert Chem.MolFromSmiles(safe) is not None  # a SAFE string is a SMILES
        assert safe_to_smiles(safe) == canonical(smiles)


def test_the_published_safe_example_and_bad_input():
    assert smiles_to_safe(IBUPROFEN) == "c12ccc3cc1.C3(C)C(=O)O.CC(C)C2"  # datamol-io/safe README
    with pytest.raises(SafeEncodeError, match="not a valid SMILES"):
        smiles_to_safe("C1CC(")
    # a fragment that does not parse is dropped; the longest component of the rest is the molecule
    assert safe_to_smiles("c1ccccc1C2.C2O.((N") == canonical("c1ccccc1CCO")  # ring bond 2 joins the two
    assert safe_to_smiles("c1ccccc1.CCO") == canonical("c1ccccc1")
    assert safe_to_smiles("((") is None and safe_to_smiles("") is None


def test_the_tokenizer_splits_pieces_with_genmols_special_ids():
    text = "c12ccc3cc1.C3(C)C(=O)O.CC(C)C2"
    assert split_safe(text) == list("c12ccc3cc1.C3(C)C(=O)O.CC(C)C2")
    assert split_safe("[nH]1Cl%12Br.[C@@H]") == ["[nH]", "1", "Cl", "%12", "Br", ".", "[C@@H]"]
    tok = build_safe_tokenizer([smiles_to_safe(s) for s in MOSES])
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    ids = tok.encode(text)
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) == len(split_safe(text)) + 2
    assert tok.decode(ids) == text
    assert tok.encode("[Se]", add_special_tokens=False) == [0]  # unseen bracket atom: [UNK]


def test_unpaired_digits_names_the_labels_written_an_odd_number_of_times():
    assert [unpaired_digits(smiles_to_safe(s)) for s in MOSES] == [[]] * len(MOSES)  # SAFE pairs every label
    assert unpaired_digits("c12ccc3cc1.C3(C)C(=O)O.CC(C)C2") == []
    assert unpaired_digits("c1ccccc1.c1ccccc1") == []  # a label reused after it closed
    assert unpaired_digits("c16ccc7cc1.c17ccccc1.C37=O.CC7") == ["3", "6"]  # a model's sample: 7 four times
    assert unpaired_digits("C%12CC%12.C%13") == ["%13"]
    assert safe_to_smiles("c16ccc7cc1.c17ccccc1.C37=O.CC7") is not None  # decodes, fragments dropped


def test_prepare_writes_splits_tokenizer_lengths_and_counts_failures(tmp_path):
    fake_molsets_wheel(tmp_path / "wheels" / "molsets-0.3.1-py3-none-any.whl", MOSES + ["C1CC(", "not a molecule"],
                       MOSES[:3])
    stats = prepare(tmp_path / "data", train=None, valid=2, test=2, cache_dir=tmp_path / "wheels")
    s = stats["splits"]
    assert s["valid"]["molecules"] == 2 and s["test"]["encoded"] == 2
    assert s["train"]["molecules"] == 8 and s["train"]["failed"] + s["valid"]["failed"] == 2
    pairs = read_pairs(tmp_path / "data" / "train.tsv.gz")
    assert all(safe_to_smiles(safe) == canonical(smiles) for smiles, safe in pairs)
    lengths, p = read_length_histogram(tmp_path / "data" / "lengths.json")
    assert p.sum() == pytest.approx(1.0)
    assert sorted(lengths.tolist()) == sorted(set(len(split_safe(safe)) for _, safe in pairs))
    assert json.loads((tmp_path / "data" / "stats.json").read_text())["vocab_size"] == stats["vocab_size"]


def test_the_data_source_rows_are_cls_safe_sep_then_pad(tmp_path):
    from jaxdllm.molecules.safe_tokenizer import save_safe_tokenizer
    from jaxdllm.train import TrainConfig
    from jaxdllm.train import setup
    from jaxdllm.train.objectives import make_objective

    pairs = [(s, smiles_to_safe(s)) for s in MOSES]
    write_pairs(tmp_path / "train.tsv.gz", pairs)
    save_safe_tokenizer(build_safe_tokenizer(safe for _, safe in pairs), tmp_path / "tokenizer")
    config = TrainConfig.from_dict({
        "model": {"preset": "tiny-llada", "tokenizer": str(tmp_path / "tokenizer"), "attention": "bidirectional"},
        "data": {"source": "safe_molecules", "path": str(tmp_path), "seq_len": 64, "batch_size": 8},
        "objective": {"kind": "mdlm"}})
    tok = setup.load_tokenizer(config)
    batch = next(iter(setup.make_batches(config, tok, make_objective("mdlm"))))
    for row, seg in zip(batch["tokens"], batch["segment_ids"]):
        n = int((seg > 0).sum())
        assert row[0] == 1 and row[n - 1] == 2 and (row[n:] == 3).all()  # [CLS] ... [SEP] [PAD]...
        assert tok.decode(row[:n].tolist()) in {safe for _, safe in pairs}
    assert np.asarray(batch["target_mask"]).sum() > 0


def test_an_exported_molecule_model_carries_the_length_distribution_and_format_the_designer_reads(tmp_path):
    """`jaxdllm train ... --export DIR` on SAFE data writes the data folder's lengths.json and safe_format.json
    beside the weights, so `Designer.load(DIR)` samples lengths as the training set's and writes its text
    format without a copy by hand."""
    from jaxdllm.molecules.bracket_safe import write_safe_format
    from jaxdllm.molecules.design import Designer
    from jaxdllm.molecules.moses import write_length_histogram
    from jaxdllm.molecules.safe_tokenizer import save_safe_tokenizer
    from jaxdllm.sharding import make_mesh
    from jaxdllm.train import TrainConfig, Trainer

    import jax

    pairs = [(s, smiles_to_safe(s)) for s in MOSES]
    write_pairs(tmp_path / "train.tsv.gz", pairs)
    write_length_histogram(tmp_path / "lengths.json", [len(split_safe(safe)) for _, safe in pairs])
    save_safe_tokenizer(build_safe_tokenizer(safe for _, safe in pairs), tmp_path / "tokenizer")
    config = TrainConfig.from_dict({
        "model": {"preset": "tiny-bert", "tokenizer": str(tmp_path / "tokenizer"), "max_position": 72},
        "data": {"source": "safe_molecules", "path": str(tmp_path), "seq_len": 64, "batch_size": 4},
        "objective": {"kind": "mdlm"}, "log": {"progress": False}, "mesh": {"data": 1}})
    write_safe_format(tmp_path, "bracket")  # what the strings' format is (these are plain; only the file travels)
    out = Trainer(config, mesh=make_mesh(devices=jax.devices()[:1])).export(tmp_path / "model")
    assert (out / "lengths.json").read_text() == (tmp_path / "lengths.json").read_text()
    assert Designer.load(out).safe_format == "bracket"
    lengths, probabilities = Designer.load(out).lengths
    want, p = read_length_histogram(tmp_path / "lengths.json")
    assert lengths.tolist() == want.tolist() and probabilities.tolist() == p.tolist()
