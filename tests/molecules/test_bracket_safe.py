"""GenMol V2's bracket SAFE: conversions checked by hand and against RDKit's canonical SMILES (every string,
canonical or a random view, decodes to the molecule it came from), the tokenizer's pieces, the prompts and
decoding of a bracket-SAFE designer, a prepared V2 data folder, and the converter's format record."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

pytest.importorskip("rdkit")
pytest.importorskip("safe")

from rdkit import Chem  # noqa: E402
from support.molecules import fake_molsets_wheel  # noqa: E402

from jaxdllm.molecules.bracket_safe import (bracket_to_safe, read_safe_format, safe_to_bracket,  # noqa: E402
                                            smiles_to_bracket_safe, write_safe_format)
from jaxdllm.molecules.safe_text import safe_to_smiles, smiles_to_safe  # noqa: E402
from jaxdllm.molecules.safe_tokenizer import build_safe_tokenizer, split_safe, unpaired_digits  # noqa: E402

# MOSES training molecules (lines of moses/dataset/data/train.csv.gz) and ibuprofen, SAFE's README example
MOSES = ["CCCS(=O)c1ccc2[nH]c(=NC(=O)OC)[nH]c2c1", "CC(C)(C)C(=O)C(Oc1ccc(Cl)cc1)n1ccnc1",
         "Cc1c(Cl)cccc1Nc1ncccc1C(=O)OCC(O)CO", "Cn1cnc2c1c(=O)n(CC(O)CO)c(=O)n2C",
         "CC1Oc2ccc(Cl)cc2N(CC(O)CO)C1=O", "CCOC(=O)c1cncn1C1CCCc2ccccc21",
         "COc1ccc(C(=O)N(C)Cc2ccccc2)cc1OC", "O=C(Nc1ccc(F)cc1)c1cccc(S(=O)(=O)N2CCCC2)c1",
         "Cc1cc(NC(=O)c2scnc2C2CC2)ncc1Br", "CC(Cc1ccc(cc1)C(C(=O)O)C)C"]


def canonical(smiles):
    return Chem.MolToSmiles(Chem.MolFromSmiles(smiles))


def test_attachments_become_brackets_and_ring_closures_stay():
    # ibuprofen: 1 closes the benzene ring; 2 and 3 are cut bonds, numbered <1>, <2> as they first appear
    assert safe_to_bracket("c12ccc3cc1.C3(C)C(=O)O.CC(C)C2") == "c1<1>ccc<2>cc1.C<2>(C)C(=O)O.CC(C)C<1>"
    # two cut bonds on one atom, a ring label reused after it closed, a prompt's open attachment point
    assert safe_to_bracket("C34=O.c1ccccc1C3.c1ccccc1C4") == "C<1><2>=O.c1ccccc1C<1>.c1ccccc1C<2>"
    assert safe_to_bracket("c12ccc(Cl)cc1.") == "c1<1>ccc(Cl)cc1."
    assert safe_to_bracket("[13CH3]2.C2") == "[13CH3]<1>.C<1>"  # digits inside a bracket atom are no labels
    # back to SAFE (GenMol's bracketsafe2safe): <k> -> max(ring labels) + k, `%` from 10 on
    assert bracket_to_safe("c1<1>ccc<2>cc1.C<2>(C)C(=O)O.CC(C)C<1>") == "c12ccc3cc1.C3(C)C(=O)O.CC(C)C2"
    assert bracket_to_safe("C1CC1<1>.C%10CC%10<2>") == "C1CC1%11.C%10CC%10%12"
    assert bracket_to_safe("CC<%12>") == "CC%12" and bracket_to_safe("CCO") == "CCO"
    assert bracket_to_safe("C1CC1<12>") == "C1CC1%13"
    # a model's malformed bracket stays (that fragment then fails to decode and is dropped)
    assert bracket_to_safe("c1ccccc1<.C<1>") == "c1ccccc1<.C2"
    assert safe_to_smiles(bracket_to_safe("c1ccccc1<1>.C<1>.C<2")) == canonical("Cc1ccccc1")


def test_every_string_canonical_or_random_view_decodes_to_its_molecule():
    views = collections.defaultdict(set)
    for smiles in MOSES:
        for seed in (None, 0, 1, 2, 3):
            text = smiles_to_bracket_safe(smiles, randomize=seed is not None, seed=seed)
            assert safe_to_smiles(bracket_to_safe(text)) == canonical(smiles), (smiles, seed, text)
            assert unpaired_digits(bracket_to_safe(text)) == []
            fragments = text.split(".")
            for k in set(p for p in _attachments(text)):  # each attachment joins two different fragments
                assert sorted(f.count(k) for f in fragments if k in f) == [1, 1], (text, k)
            views[smiles].add(text)
        assert text == smiles_to_bracket_safe(smiles, randomize=True, seed=3)  # a view is fixed by its seed
    assert smiles_to_bracket_safe(MOSES[-1]) == safe_to_bracket(smiles_to_safe(MOSES[-1]))
    assert sum(len(v) > 2 for v in views.values()) >= len(MOSES) // 2  # random views do differ


def _attachments(text):
    import re

    return re.findall(r"<%?[0-9]+>", text)


def test_the_tokenizer_reads_an_attachment_as_one_token_as_it_reads_a_ring_label():
    texts = [smiles_to_bracket_safe(s) for s in MOSES]
    tok = build_safe_tokenizer(texts)
    assert split_safe("C<%12><2>=O") == ["C", "<%12>", "<2>", "=", "O"]
    assert split_safe("C<.C<2") == ["C", "<", ".", "C", "<", "2"]  # a model's stray bracket
    for smiles, text in zip(MOSES, texts):
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text and len(ids) == len(split_safe(text))
        assert len(ids) == len(split_safe(smiles_to_safe(smiles)))  # as long as the plain SAFE string
        assert tok.token_to_id("[UNK]") not in ids


def test_a_bracket_designer_writes_its_prompts_and_reads_its_samples_in_brackets(monkeypatch):
    from test_design import _designer

    from jaxdllm.molecules.design import Samples, contains, fragment_core

    d = _designer(safe_format="bracket")
    assert d._fragment_prompt("[*]c1ccc(Cl)cc1") == "c1<1>ccc(Cl)cc1."
    assert d.decode("c1<1>ccc(Cl)cc1.C<1>") == canonical("Cc1ccc(Cl)cc1")
    assert d.decode("c1<1>ccc(Cl)cc1.CC") == canonical("Clc1ccccc1")  # open attachment fixed, longest kept
    assert _designer().decode("c1<1>ccc(Cl)cc1.C<1>") is None  # read as plain SAFE, the brackets break it
    calls = []

    def run(prompts, task, seed, min_add_len, preset, core, **settings):
        calls.append(prompts)
        grown = {"c1<2>ccccc1.": "c1ccccc1CCOc1ccncc1", "N1<1>CCOCC1.": "O=C(CC1CC1)N1CCOCC1"}
        return Samples([grown.get(p) for p in prompts], list(prompts), [1] * len(prompts))

    monkeypatch.setattr(d, "_run", run)
    samples = d.linker("[*]c1ccccc1.[*]N1CCOCC1", 2, seed=0)
    assert calls == [["N1<1>CCOCC1."] * 2 + ["c1<2>ccccc1."] * 2]  # SAFE's fragment order, each point open
    assert samples.safe_format == "bracket" and samples.plain_safe()[0] == "N12CCOCC1."  # <1> after ring 1: 2
    assert len(samples.valid()) == 2 and all(contains(s, fragment_core("[*]c1ccccc1.[*]N1CCOCC1"))
                                             for s in samples.valid())


def test_remasking_writes_its_canvases_in_the_models_format():
    from test_design import _designer

    from jaxdllm.molecules.remasking import RemaskingConfig, _grow_prompt, _mask_row

    d = _designer(safe_format="bracket")
    grown = _grow_prompt(d, "CCO", np.random.default_rng(1))
    assert grown.endswith(".") and "<1>" in grown and d.decode(grown[:-1]) == "CCO"  # the open point is <1>
    text = d.encode("CCOC(=O)c1cncn1C1CCCc2ccccc21", slicer="hr")
    assert "<" in text and d.decode(text) == canonical("CCOC(=O)c1cncn1C1CCCc2ccccc21")
    row = _mask_row(d, text, np.random.default_rng(0), RemaskingConfig(short_tokens=5))
    kept = [f for f in d.tokenizer.decode(row).split(".") if f]
    assert len(kept) == len(text.split(".")) - 1 and all(f in text.split(".") for f in kept)


def test_the_format_file_is_read_written_and_checked(tmp_path):
    assert read_safe_format(tmp_path) == "safe"  # no file: GenMol V1's plain SAFE
    write_safe_format(tmp_path, "bracket")
    assert read_safe_format(tmp_path) == "bracket"
    (tmp_path / "safe_format.json").write_text(json.dumps({"safe_format": "selfies"}))
    with pytest.raises(ValueError, match="safe_format.json.*safe_format must be one of"):
        read_safe_format(tmp_path)
    with pytest.raises(ValueError, match="must be one of"):
        write_safe_format(tmp_path, "smiles")


def test_prepare_writes_genmol_v2_data_random_views_in_brackets(tmp_path):
    from jaxdllm.molecules.moses import prepare, read_length_histogram, read_pairs
    from jaxdllm.tokenizer import Tokenizer

    fake_molsets_wheel(tmp_path / "wheels" / "molsets-0.3.1-py3-none-any.whl", MOSES[:8], MOSES[:2])
    stats = prepare(tmp_path / "v2", train=None, valid=2, test=2, cache_dir=tmp_path / "wheels",
                    safe_format="bracket", views=3)
    assert stats["splits"]["train"] == {"molecules": 6, "encoded": 18, "failed": 0, "failed_examples": []}
    assert read_safe_format(tmp_path / "v2") == "bracket"
    train = read_pairs(tmp_path / "v2" / "train.tsv.gz")
    valid = read_pairs(tmp_path / "v2" / "valid.tsv.gz")
    held_out = {s for s, _ in valid}
    assert collections.Counter(s for s, _ in train) == {s: 3 for s in MOSES[:8] if s not in held_out}
    assert all(safe_to_smiles(bracket_to_safe(text)) == canonical(s) for s, text in train)
    assert all("<" in text for _, text in train)  # every one of these molecules has a cut bond
    assert len({text for _, text in train}) > 6  # views of one molecule differ
    assert all(text == smiles_to_bracket_safe(s) for s, text in valid)  # held-out rows stay canonical
    tok = Tokenizer.from_pretrained(tmp_path / "v2" / "tokenizer")
    assert all(tok.token_to_id("[UNK]") not in tok.encode(t) for _, t in train)  # `<` and `>` are in the vocabulary
    lengths, p = read_length_histogram(tmp_path / "v2" / "lengths.json")
    assert np.isclose(p.sum(), 1.0) and sorted(lengths.tolist()) == sorted({len(split_safe(t)) for _, t in train})
