"""Fragments for GenMol's fragment remasking: cutting a molecule at a random acyclic single bond, a
vocabulary of fragments scored by the molecules they come from, and joining two fragments at their
attachment points (GenMol's `scripts/exps/pmo/get_vocab.py` and its recombination reaction).
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
    """The two fragments of `smiles` cut at one acyclic single bond drawn at random, each with a `[1*]` at
    the cut; None when the molecule does not parse or has no such bond."""
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
    """`(fragment, score, heavy atoms)` of the `size` best fragments: each molecule is cut
    `cuts_per_molecule` times and a fragment's score is the mean score of the molecules it came from."""
    seen: dict[str, list[float]] = collections.defaultdict(list)
    for molecule, score in zip(smiles, scores):
        for _ in range(cuts_per_molecule):
            for fragment in cut(molecule, rng) or []:
                seen[fragment].append(float(score))
    ranked = sorted(((f, float(np.mean(s))) for f, s in seen.items()), key=lambda x: (-x[1], x[0]))[:size]
    return [(f, s, heavy_atoms(f)) for f, s in ranked]


def attach(fragment_a: str, fragment_b: str) -> str | None:
    """The molecule joining two fragments at their `[1*]` points (a single bond), or None."""
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
    """Heavy atoms of `smiles` without dummies (0 when it does not parse)."""
    mol = Chem.MolFromSmiles(smiles)
    return 0 if mol is None else sum(a.GetAtomicNum() > 1 for a in mol.GetAtoms())


def largest_component(smiles: str) -> str | None:
    """The `.`-component with the most heavy atoms, canonical; None when it does not parse."""
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    if mol is None:
        return None
    parts = Chem.GetMolFrags(mol, asMols=True)
    return Chem.MolToSmiles(max(parts, key=lambda m: m.GetNumHeavyAtoms())) if parts else None


__all__ = ["attach", "cut", "fragment_vocabulary", "heavy_atoms", "largest_component"]
