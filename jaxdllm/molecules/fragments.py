"""Fragments for GenMol's fragment remasking: cutting a molecule at a random acyclic single bond, a
vocabulary of fragments scored by the molecules they come from, and joining two fragments at their
attachment points (GenMol's `scripts/exps/pmo/get_vocab.py` and its recombination reaction); and the
join of two-step linker design (`link_through_grown`).
"""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np
from rdkit import Chem
from rdkit.Chem import rdChemReactions

ACYCLIC_SINGLE = Chem.MolFromSmarts("[*]-;!@[*]")
JOIN = rdChemReactions.ReactionFromSmarts("[*:1]-[1*].[1*]-[*:2]>>[*:1]-[*:2]")


def cut(smiles: str, rng: np.random.Generator) -> list[str] | None:
    """The two fragment SMILES (each canonical, each with one `[1*]` at the cut) of `smiles` cut with
    `Chem.FragmentOnBonds` at one acyclic single bond (`[*]-;!@[*]`) drawn uniformly with `rng` (a numpy
    Generator); None when the molecule does not parse or has no such bond."""
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None
    bonds = mol.GetSubstructMatches(ACYCLIC_SINGLE)
    if not bonds:
        return None
    a, b = bonds[int(rng.integers(len(bonds)))]
    bond = mol.GetBondBetweenAtoms(a, b).GetIdx()
    pieces = Chem.FragmentOnBonds(mol, [bond], addDummies=True, dummyLabels=[(1, 1)])
    return [Chem.MolToSmiles(p) for p in Chem.GetMolFrags(pieces, asMols=True)]


def fragment_vocabulary(smiles: Sequence[str], scores: Sequence[float], rng: np.random.Generator, *,
                        cuts_per_molecule: int = 3, size: int = 1000) -> list[tuple[str, float, int]]:
    """GenMol's fragment vocabulary: `(fragment, score, size)` records of the `size` best fragments, best
    first (ties by fragment SMILES). Each molecule of `smiles` is `cut` `cuts_per_molecule` times; a
    fragment's score is the mean of `scores` over the molecules that gave it (a molecule counts once per
    fragment however many of its cuts gave that fragment); a record's size is the fragment's heavy atoms
    without the attachment point."""
    seen: dict[str, list[float]] = collections.defaultdict(list)
    for molecule, score in zip(smiles, scores):
        pieces = set()
        for _ in range(cuts_per_molecule):
            pieces.update(cut(molecule, rng) or [])
        for fragment in pieces:
            seen[fragment].append(float(score))
    ranked = sorted(((f, float(np.mean(s))) for f, s in seen.items()), key=lambda x: (-x[1], x[0]))[:size]
    return [(f, s, heavy_atoms(f)) for f, s in ranked]


def attach(fragment_a: str, fragment_b: str) -> str | None:
    """The canonical SMILES of the molecule joining two `[1*]` fragments with the reaction
    `[*:1]-[1*].[1*]-[*:2]>>[*:1]-[*:2]` (a single bond between the atoms that held the attachment points),
    sanitized; the first product that sanitizes and keeps no dummy atom, or None (unparsable input, no
    attachment point, impossible valence)."""
    a, b = Chem.MolFromSmiles(fragment_a), Chem.MolFromSmiles(fragment_b)
    if a is None or b is None:
        return None
    for products in JOIN.RunReactants((a, b)):
        product = products[0]
        try:
            Chem.SanitizeMol(product)
        except Exception:  # an impossible valence
            continue
        smiles = Chem.MolToSmiles(product)
        if Chem.MolFromSmiles(smiles) is not None and "*" not in smiles:
            return smiles
    return None


def heavy_atoms(smiles: str) -> int:
    """The number of heavy atoms of `smiles`, dummy atoms (`*`) not counted; 0 when it does not parse."""
    mol = Chem.MolFromSmiles(smiles)
    return 0 if mol is None else sum(a.GetAtomicNum() > 1 for a in mol.GetAtoms())


def largest_component(smiles: str) -> str | None:
    """The canonical SMILES of the `.`-component of `smiles` with the most heavy atoms (the first of equals);
    None when it is empty or does not parse."""
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    if mol is None:
        return None
    parts = Chem.GetMolFrags(mol, asMols=True)
    return Chem.MolToSmiles(max(parts, key=lambda m: m.GetNumHeavyAtoms())) if parts else None


def link_through_grown(grown: Sequence[str | None], head: str, tail: str, n: int) -> list[str]:
    """Two-step linker design's join (GenMol's `mix_sequences`, on safe-mol's `MolSlicer`): each molecule of
    `grown` (grown from `head` or from `tail`; None skipped) is sliced into head-linker-tail with
    `MolSlicer(require_ring_system=False)` around the fragment it contains, and each distinct linker, in
    order, joins `head` and `tail` (`MolSlicer.link_fragments`).

    Args:
      grown: SMILES of the molecules grown from either fragment.
      head, tail: the two fragments as SMILES with one attachment point each (`[*]` or `[*:k]`).
      n: at most this many molecules.

    Returns: up to `n` distinct canonical SMILES of `head`-linker-`tail` molecules.
    """
    from safe.utils import MolSlicer

    slicer = MolSlicer(require_ring_system=False)
    queries = [Chem.MolFromSmarts(f) for f in (head, tail)]
    linkers: dict[str, None] = {}
    for smiles in grown:
        mol = Chem.MolFromSmiles(smiles) if smiles else None
        if mol is None:
            continue
        query = next((q for q in queries if q is not None and mol.HasSubstructMatch(q)), None)
        try:
            linker = slicer(mol, query)[1]
        except Exception:  # the slicer's RDKit calls fail on a few odd molecules: no linker from those
            continue
        if linker is not None:
            linkers.setdefault(Chem.MolToSmiles(linker))
    linked: dict[str, None] = {}
    for linker in linkers:
        try:
            products = MolSlicer.link_fragments(linker, head, tail)
        except Exception:
            continue
        for product in products or []:
            mol = Chem.MolFromSmiles(product) if product else None
            if mol is not None:
                linked.setdefault(Chem.MolToSmiles(mol))
        if len(linked) >= n:
            break
    return list(linked)[:n]


__all__ = ["attach", "cut", "fragment_vocabulary", "heavy_atoms", "largest_component", "link_through_grown"]
