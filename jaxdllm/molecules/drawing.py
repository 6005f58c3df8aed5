"""Molecule grids as PNG files (RDKit's drawing)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rdkit import Chem
from rdkit.Chem import Draw


def draw_grid(smiles: Sequence[str], path: str | Path, legends: Sequence[str] | None = None, per_row: int = 5,
              size: tuple[int, int] = (250, 250)) -> Path:
    """Draw the molecules of `smiles` in a grid (`per_row` per row, cells of `size` pixels) with RDKit's
    `MolsToGridImage` into the PNG file `path` (folders made); unparsable or empty ones are skipped with
    their legends. `legends` (one per SMILES) default to the SMILES, cut at 40 characters. A blank cell is
    written when nothing parses. Returns the path."""
    pairs = [(Chem.MolFromSmiles(s), (legends[i] if legends else s)) for i, s in enumerate(smiles) if s]
    pairs = [(m, legend) for m, legend in pairs if m is not None]
    if pairs:
        image = Draw.MolsToGridImage([m for m, _ in pairs], molsPerRow=per_row, subImgSize=size,
                                     legends=[str(legend)[:40] for _, legend in pairs], returnPNG=False)
    else:  # nothing to draw: one blank cell
        from PIL import Image

        image = Image.new("RGB", tuple(size), "white")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if hasattr(image, "save"):  # a PIL image
        image.save(str(path), format="PNG")
    else:  # IPython's rendering of RDKit grids (under IPythonConsole) holds the PNG bytes
        path.write_bytes(image.data)
    return path


__all__ = ["draw_grid"]
