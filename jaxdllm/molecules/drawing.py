"""Molecule grids as PNG files (RDKit's drawing)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rdkit import Chem
from rdkit.Chem import Draw


def draw_grid(smiles: Sequence[str], path: str | Path, legends: Sequence[str] | None = None, per_row: int = 5,
              size: tuple[int, int] = (250, 250)) -> Path:
    """Draw the molecules of `smiles` (unparsable ones skipped, with their legends) into the PNG `path`."""
    pairs = [(Chem.MolFromSmiles(s), (legends[i] if legends else s)) for i, s in enumerate(smiles) if s]
    pairs = [(m, legend) for m, legend in pairs if m is not None]
    image = Draw.MolsToGridImage([m for m, _ in pairs], molsPerRow=per_row, subImgSize=size,
                                 legends=[legend[:40] for _, legend in pairs])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(str(path))
    return path


__all__ = ["draw_grid"]
