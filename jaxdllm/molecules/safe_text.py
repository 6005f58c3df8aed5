"""SMILES <-> SAFE strings (Sequential Attachment-based Fragment Embedding; `safe-mol`), as GenMol
uses them.

A SAFE string writes a molecule as fragments joined by `.`; a bond cut between two fragments becomes
a ring-closure digit that appears once in each, so every SAFE string is itself a valid SMILES.
Encoding cuts BRICS bonds (the default slicer) and ignores stereochemistry, as GenMol's data
preparation does; a molecule with no bond to cut is kept whole (`allow_empty`).

Decoding follows GenMol's `safe_to_smiles`: fragments that do not decode on their own are dropped,
the rest decode with unpaired attachment digits fixed, and the longest `.`-component of the
result (by SMILES length, as the published sampler picks it) is the molecule.
"""

from __future__ import annotations

import functools

import safe
from rdkit import Chem, RDLogger

RDLogger.DisableLog("rdApp.*")  # a sampler's broken strings would print one RDKit line each


class SafeEncodeError(ValueError):
    """A SMILES that RDKit cannot parse or SAFE cannot fragment."""


@functools.lru_cache(maxsize=4)
def _converter(slicer: str | None, ignore_stereo: bool) -> safe.SAFEConverter:
    return safe.SAFEConverter(slicer=slicer, ignore_stereo=ignore_stereo)


def smiles_to_safe(smiles: str, *, slicer: str | None = "brics", ignore_stereo: bool = True,
                   allow_empty: bool = True, randomize: bool = False, seed: int | None = None) -> str:
    """One SMILES as a SAFE string (canonical fragment order, or one random view).

    Args:
      smiles: the molecule.
      slicer: which bonds to cut: `"brics"` (GenMol's data), `"hr"`, `"recap"`, `"mmpa"`,
        `"attach"`, `"rotatable"`, or None (no cut: the fragments already in the SMILES, e.g.
        `"A.B"` with `[*]` attachment points, as GenMol's linker prompts are written).
      ignore_stereo: drop stereo marks first (GenMol's preprocessing does).
      allow_empty: a molecule with no bond to cut stays one fragment instead of failing.
      randomize: write a random view instead of the canonical string: atoms and fragments in a random
        order (`seed`), the same molecule (GenMol V2's training views).

    Raises:
      SafeEncodeError: RDKit cannot parse it, or SAFE cannot write it.
    """
    if not smiles or Chem.MolFromSmiles(smiles) is None:
        raise SafeEncodeError(f"not a valid SMILES: {smiles!r}")
    try:
        return _converter(slicer, ignore_stereo).encoder(smiles, allow_empty=allow_empty, canonical=not randomize,
                                                          randomize=randomize, seed=seed)
    except Exception as error:  # safe raises several classes (fragmentation, encoding, RDKit)
        raise SafeEncodeError(f"SAFE cannot encode {smiles!r}: {error}") from error


def decode_safe(safe_string: str, *, fix: bool = True) -> str | None:
    """A SAFE string (or a SMILES) -> canonical SMILES, or None when it does not decode.
    `fix`: unpaired attachment digits get a dummy partner that is then removed (GenMol decodes so)."""
    if not safe_string:
        return None
    smiles = safe.decode(safe_string, canonical=True, fix=fix, ignore_errors=True)
    return smiles or None


def decode_with_dummies(safe_fragment: str) -> str:
    """One SAFE fragment with open attachment digits -> its SMILES with each open digit as a dummy atom
    `[*:k]` (how two-step linker design names the fragments it joins)."""
    smiles = safe.decode(safe_fragment, remove_dummies=False, fix=True, ignore_errors=True)
    if not smiles:
        raise SafeEncodeError(f"SAFE fragment {safe_fragment!r} does not decode")
    return smiles


def safe_to_smiles(safe_string: str, *, fix: bool = True, largest: bool = True) -> str | None:
    """GenMol's decoding of a generated SAFE string: drop the `.`-fragments that do not decode on
    their own, decode the rest (`fix` as in `decode_safe`), keep the longest `.`-component.

    Returns the canonical SMILES, or None when nothing decodes.
    """
    if fix:
        safe_string = ".".join(f for f in safe_string.split(".") if f and decode_safe(f, fix=True) is not None)
    smiles = decode_safe(safe_string, fix=fix)
    if smiles is None:
        return None
    if largest and "." in smiles:
        smiles = max(smiles.split("."), key=len)
        mol = Chem.MolFromSmiles(smiles)
        smiles = Chem.MolToSmiles(mol) if mol is not None else None
    return smiles


__all__ = ["SafeEncodeError", "decode_safe", "decode_with_dummies", "safe_to_smiles", "smiles_to_safe"]
