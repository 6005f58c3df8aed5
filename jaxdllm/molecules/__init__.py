"""Molecules for GenMol-style discrete diffusion (needs the `molecules` extra: rdkit, safe-mol).

* `safe_text`: SMILES <-> SAFE strings, GenMol's decoding of generated strings.
* `safe_tokenizer`: SAFE's regex splitter with GenMol's special tokens.
* `moses`: the MOSES sets from the `molsets` wheel, prepared as SAFE data folders.
* `design` (`Designer`): GenMol's tasks, SMILES in and out; `causal_baseline` (`CausalDesigner`): a causal
  model over the same strings; `evaluation`, `remasking`: the benchmarks and fragment remasking.
* `metrics`, `oracles`, `fragments`, `drawing`: validity / uniqueness / quality / diversity, offline
  goal-directed oracles with PMO's AUC-top-10, fragment cutting and joining, molecule grids.
"""

from __future__ import annotations

_LAZY = {"Designer": "jaxdllm.molecules.design", "Samples": "jaxdllm.molecules.design",
         "CausalDesigner": "jaxdllm.molecules.causal_baseline"}


def __getattr__(name: str):
    """`Designer`, `Samples`, `CausalDesigner`, imported when first used (they need RDKit)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxdllm.molecules' has no attribute {name!r}")


__all__ = sorted(_LAZY)
