"""Molecules for GenMol-style discrete diffusion (needs the `molecules` extra: rdkit, safe-mol).

* `safe_text`: SMILES <-> SAFE strings, GenMol's decoding of generated strings.
* `safe_tokenizer`: SAFE's regex splitter with GenMol's special tokens.
* `moses`: the MOSES sets from the `molsets` wheel, prepared as SAFE data folders.
* `metrics`, `oracles`, `fragments`, `drawing`: validity / uniqueness / quality / diversity, offline
  goal-directed oracles with PMO's AUC-top-10, fragment cutting and joining, molecule grids.
"""
