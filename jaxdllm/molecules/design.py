"""GenMol's molecule design tasks on a masked diffusion model: SMILES in, SMILES out.

    from jaxdllm.molecules import Designer
    designer = Designer.load("moses-bert-small-genmol")      # a shipped model, or a checkpoint folder
    designer.denovo(8, seed=0)                               # 8 SMILES (None where a sample does not decode)
    designer.motif_extension("[*]c1ccc(Cl)cc1", 8)           # molecules that contain the motif
    designer.linker("[*]c1ccccc1.[*]N1CCOCC1", 8)            # linkers between two fragments

Every task is one GenMol canvas per sample (`jaxdllm.decoding.genmol_canvas`): `[CLS] prompt [MASK]*n
[SEP]`, where the prompt is the SAFE string of the given fragment(s) followed by `.` (nothing for de novo)
and n = max(a length drawn from the training set's length distribution - the prompt's length,
`min_add_len`), as the published `_insert_mask` does. The masks are decoded by the task's preset (the
published V1 constants, `genmol-*`), the result is decoded back through SAFE (fragments that do not decode
dropped, attachment digits fixed, the longest component kept), and fragment tasks keep only molecules
that contain the fragment (its attachment points removed), the published `filter_by_substructure`.

A model trained on GenMol V2's bracket SAFE (`jaxdllm.molecules.bracket_safe`: attachments written `<k>`)
gets its prompts in that form and its samples converted back before decoding; its folder says so in
`safe_format.json` (the data preparation and GenMol's checkpoint converter write it; absent: plain SAFE).

Linker design is the published two-step variant (each fragment grown alone, then joined through the
linkers cut from what grew) or, on request, the one-step one (both fragments in one prompt); superstructure
generation adds up to three attachment points to a fragment that has none (`list_individual_attach_points`
with depth 3, one drawn at random per sample) and then extends it as a motif.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Sequence

import jax
import numpy as np
from rdkit import Chem

from jaxdllm.decoding import SamplerConfig
from jaxdllm.decoding.genmol_canvas import genmol_canvas, genmol_generate, sample_lengths
from jaxdllm.decoding.policies.genmol import TASK_MIN_ADD_LEN
from jaxdllm.errors import InputError
from jaxdllm.molecules.bracket_safe import check_format, from_format, read_safe_format, to_format
from jaxdllm.molecules.safe_text import SafeEncodeError, decode_with_dummies, safe_to_smiles, smiles_to_safe
from jaxdllm.molecules.moses import LENGTHS_FILE, read_length_histogram

TASK_PRESETS = {"denovo": "genmol-denovo", "linker": "genmol-linker", "motif": "genmol-motif",
                "scaffold": "genmol-scaffold", "superstructure": "genmol-superstructure", "remask": "genmol-remask"}


def fragment_core(smiles: str) -> Chem.Mol:
    """The fragment without its attachment points (dummy atoms), the substructure a product must contain."""
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise InputError(f"not a valid fragment SMILES: {smiles!r}")
    core = Chem.DeleteSubstructs(mol, Chem.MolFromSmarts("[#0]"))
    Chem.SanitizeMol(core, catchErrors=True)
    return core


def contains(smiles: str | None, core: Chem.Mol) -> bool:
    """`smiles` parses and holds `core` as a substructure."""
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    return mol is not None and mol.HasSubstructMatch(core)


@dataclasses.dataclass
class Samples:
    """One task's output, in sample order.

    Attributes:
      smiles: a canonical SMILES per sample; None where the sample does not decode or (fragment
        tasks) does not contain the fragment.
      safe: the decoded texts, as the model wrote them (bracket SAFE for a bracket-SAFE model).
      nfe: each sample's forwards (two per step with context guidance).
      safe_format: the format of `safe` (`jaxdllm.molecules.bracket_safe`).
    """

    smiles: list[str | None]
    safe: list[str]
    nfe: list[int]
    safe_format: str = "safe"

    def plain_safe(self) -> list[str]:
        """`safe` as plain SAFE strings (bracket attachments renumbered as ring-closure labels)."""
        return [from_format(t, self.safe_format) for t in self.safe]

    def valid(self) -> list[str]:
        """The SMILES that decoded (and passed the fragment filter)."""
        return [s for s in self.smiles if s is not None]


@dataclasses.dataclass
class Designer:
    """A masked diffusion model over SAFE strings with GenMol's tasks.

    Args:
      model: a bidirectional model (the BERT family or any masked diffusion model of this library).
      tokenizer: its SAFE tokenizer (`jaxdllm.molecules.safe_tokenizer`).
      lengths: `(token lengths [K], probabilities [K])` of the training SAFE strings without [CLS]/[SEP]
        (`jaxdllm.molecules.moses.read_length_histogram`).
      batch_size: canvases decoded per compiled call.
      safe_format: how the model writes attachments: `"safe"` (GenMol V1) or `"bracket"` (V2's `<k>`).
    """

    model: object
    tokenizer: object
    lengths: tuple[np.ndarray, np.ndarray]
    batch_size: int = 64
    safe_format: str = "safe"

    def __post_init__(self):
        from jaxdllm.decoding.sampler import Sampler

        check_format(self.safe_format)
        self.sampler = Sampler(self.model)  # one compiled loop per preset and canvas shape, kept across calls

    @classmethod
    def load(cls, path: str | Path, *, lengths: str | Path | None = None, batch_size: int = 64) -> "Designer":
        """A checkpoint folder or shipped name; its `lengths.json` (or `lengths`) gives the length distribution,
        its `safe_format.json` the text format (plain SAFE when absent)."""
        import jaxdllm
        from jaxdllm.shipped import checkpoint_dir

        pretrained = jaxdllm.load(path)
        file = Path(lengths) if lengths else checkpoint_dir(path) / LENGTHS_FILE
        if not file.is_file():
            raise InputError(f"{file} is missing: GenMol draws each sample's length from the training set's "
                             "(pass lengths= a lengths.json written by `python -m jaxdllm.molecules.moses`)")
        return cls(pretrained.model, pretrained.tokenizer, read_length_histogram(file), batch_size,
                   read_safe_format(checkpoint_dir(path)))

    @functools.cached_property
    def _length_pool(self) -> np.ndarray:
        """The lengths `sample_lengths` draws from (with [CLS] and [SEP]), built once from the histogram."""
        values, probabilities = self.lengths
        return np.repeat(values + 2, np.maximum(np.round(probabilities * 100_000).astype(int), 0))

    @property
    def max_canvas(self) -> int:
        """The longest canvas the model decodes: its positions less the loop's one answer column and the
        prompt bucket's rounding."""
        return self.model.config.max_position - 4

    def _bucketed(self, rows: np.ndarray, fill: int) -> np.ndarray:
        """`rows [B, L]` right-padded with `fill` to a multiple of 16 columns (at most `max_canvas`): PAD is never
        attended, and canvases of a few widths compile a few loops."""
        width = min(max(self.max_canvas, rows.shape[1]), -(-rows.shape[1] // 16) * 16)
        return np.pad(rows, ((0, 0), (0, width - rows.shape[1])), constant_values=fill)

    # -- the shared engine --------------------------------------------------------------------------------
    def encode(self, smiles: str, slicer: str | None = "brics") -> str:
        """`smiles` (fragments with `[*]` attachment points allowed) as this model's text: canonical SAFE,
        in bracket form for a bracket-SAFE model. Raises `SafeEncodeError` when SAFE cannot write it."""
        return to_format(smiles_to_safe(smiles, slicer=slicer), self.safe_format)

    def decode(self, text: str) -> str | None:
        """One generated text -> canonical SMILES (GenMol's decoding: broken fragments dropped, attachment
        digits fixed, the longest component kept), or None when nothing decodes."""
        return safe_to_smiles(from_format(text, self.safe_format))

    def _ids(self, name: str) -> int:
        return self.tokenizer.token_to_id(self.tokenizer.special_tokens[name])

    def sample_safe(self, prompts: Sequence[str], num_masks: Sequence[int], preset: str | SamplerConfig,
                    seed: int = 0, **settings) -> tuple[list[str], list[int]]:
        """Decode one canvas per prompt: `prompts[i]` (a SAFE prefix, "" for none) then `num_masks[i]` MASKs.
        `preset`: a `genmol-*` name or a `SamplerConfig`; `settings` override it (e.g. `temperature=1.0`).
        Returns `(SAFE strings, forwards per sample)`."""
        config = SamplerConfig.preset(preset) if isinstance(preset, str) else preset
        # canvases are short and of many widths: a small prompt bucket keeps them inside max_position
        config = config.replace(**{"prompt_bucket": 4, **settings})
        bos, eos, pad, mask = (self._ids(k) for k in ("bos_token", "eos_token", "pad_token", "mask_token"))
        encoded = [self.tokenizer.encode(p, add_special_tokens=False) if p else [] for p in prompts]
        room = self.max_canvas - 2  # [CLS] and [SEP]
        num_masks = [max(0, min(int(n), room - len(e))) for n, e in zip(num_masks, encoded)]
        if any(len(e) >= room for e in encoded):
            raise InputError(f"a prompt of {max(len(e) for e in encoded)} tokens leaves no room for masks in this "
                             f"model's {self.model.config.max_position} positions")
        texts, nfe = [], []
        key = jax.random.key(seed)
        for start in range(0, len(prompts), self.batch_size):
            chunk = slice(start, start + self.batch_size)
            ids, attention = genmol_canvas(encoded[chunk], list(num_masks[chunk]), bos=bos, eos=eos, pad=pad, mask=mask)
            ids, attention = self._bucketed(ids, pad), self._bucketed(attention, 0)
            rows = len(ids)
            if rows < self.batch_size and len(prompts) > self.batch_size:  # one compiled shape for every chunk
                ids = np.concatenate([ids, np.repeat(ids[-1:], self.batch_size - rows, 0)])
                attention = np.concatenate([attention, np.repeat(attention[-1:], self.batch_size - rows, 0)])
            out = genmol_generate(self.sampler, ids, attention, config, key=jax.random.fold_in(key, start))
            tokens, forwards = np.asarray(out.tokens)[:rows], np.asarray(out.nfe)[:rows]
            texts += [self.tokenizer.decode(row.tolist()) for row in tokens]
            nfe += [int(n) for n in forwards]
        return texts, nfe

    def _lengths(self, prompt: str, task: str, n: int, rng: np.random.Generator, min_add_len: int | None):
        prompt_len = len(self.tokenizer.encode(prompt, add_special_tokens=False)) + 2  # with [CLS] and [SEP]
        return sample_lengths(self._length_pool, prompt_len, TASK_MIN_ADD_LEN[task] if min_add_len is None else min_add_len,
                              rng, num=n)

    def _run(self, prompts: list[str], task: str, seed: int, min_add_len: int | None, preset: str | None,
             core: Chem.Mol | None, **settings) -> Samples:
        rng = np.random.default_rng(seed)
        masks = [self._lengths(p, task, 1, rng, min_add_len)[0] for p in prompts]
        texts, nfe = self.sample_safe(prompts, masks, preset or TASK_PRESETS[task], seed, **settings)
        smiles = [self.decode(t) for t in texts]
        if core is not None:
            smiles = [s if contains(s, core) else None for s in smiles]
        return Samples(smiles, texts, nfe, self.safe_format)

    # -- the tasks -----------------------------------------------------------------------------------------
    def denovo(self, n: int, *, seed: int = 0, min_add_len: int | None = None, preset: str | None = None,
               **settings) -> Samples:
        """`n` new molecules (GenMol de novo: T 0.5, r 0.5, at least 40 masks)."""
        return self._run([""] * n, "denovo", seed, min_add_len, preset, None, **settings)

    def _fragment_prompt(self, fragment: str, slicer: str | None = "brics") -> str:
        if "*" not in fragment:
            raise InputError(f"fragment {fragment!r} has no attachment point: write one as [*] (or use "
                             "superstructure for a fragment to grow anywhere)")
        try:
            return self.encode(fragment, slicer=slicer) + "."
        except SafeEncodeError as error:
            raise InputError(str(error)) from None

    def motif_extension(self, motif: str, n: int, *, seed: int = 0, **settings) -> Samples:
        """Molecules grown from `motif` at its attachment points `[*]` (GenMol: T 1.2, r 1.2, guidance 0.3)."""
        return self._run([self._fragment_prompt(motif)] * n, "motif", seed, None, None, fragment_core(motif),
                         **settings)

    def scaffold_decoration(self, scaffold: str, n: int, *, seed: int = 0, **settings) -> Samples:
        """Molecules decorating `scaffold` at its attachment points (GenMol: T 1.2, r 2, guidance 0.3)."""
        return self._run([self._fragment_prompt(scaffold)] * n, "scaffold", seed, None, None, fragment_core(scaffold),
                         **settings)

    def linker(self, fragments: str, n: int, *, seed: int = 0, one_step: bool = False, **settings) -> Samples:
        """Molecules joining the two fragments of `fragments` ("A.B", one `[*]` each) through a generated
        linker, GenMol's linker design (T 1.2, r 3, at least 30 masks).

        Two steps (the default, as published): each fragment's SAFE string is grown on its own (n canvases
        each), and the linker cut from each grown molecule joins the two fragments
        (`fragments.link_through_grown`). Then `smiles` holds the distinct joined molecules that contain
        both fragments (None after them, n entries), and `safe`/`nfe` the 2n grown canvases (A's, then B's).
        `one_step=True`: both fragments in one prompt, the masks between them."""
        from jaxdllm.molecules.fragments import link_through_grown

        parts = fragments.split(".")
        if len(parts) != 2 or any("*" not in p for p in parts):
            raise InputError(f"linker design takes two fragments 'A.B' with one [*] each, got {fragments!r}")
        prompt = self._fragment_prompt(fragments, slicer=None)
        core = fragment_core(fragments)
        if one_step:
            return self._run([prompt] * n, "linker", seed, None, None, core, **settings)
        halves = prompt[:-1].split(".")  # each fragment's SAFE string, its attachment digit open
        head, tail = (decode_with_dummies(from_format(h, self.safe_format)) for h in halves)
        grown = self._run([h + "." for h in halves for _ in range(n)], "linker", seed, None, None, None, **settings)
        linked = [s for s in link_through_grown(grown.smiles, head, tail, n) if contains(s, core)]
        return Samples(linked + [None] * (n - len(linked)), grown.safe, grown.nfe, self.safe_format)

    def superstructure(self, fragment: str, n: int, *, seed: int = 0, **settings) -> Samples:
        """Molecules that contain `fragment` (no attachment points): each sample gets attachment points
        drawn from `safe.utils.list_individual_attach_points(depth=3)` and is extended as a motif
        (GenMol: T 1.2, r 2, guidance 0.4)."""
        from safe.utils import list_individual_attach_points

        mol = Chem.MolFromSmiles(fragment)
        if mol is None:
            raise InputError(f"not a valid SMILES: {fragment!r}")
        cores = list_individual_attach_points(mol, depth=3)
        if not cores:
            raise InputError(f"{fragment!r} has no atom to grow from")
        rng = np.random.default_rng(seed)
        prompts = [self._fragment_prompt(cores[int(i)]) for i in rng.integers(0, len(cores), n)]
        return self._run(prompts, "superstructure", seed, None, None, fragment_core(fragment), **settings)


def save_lengths_beside(model_dir: str | Path, data_dir: str | Path) -> Path:
    """Copy a prepared data folder's `lengths.json` next to an exported model (what `Designer.load` reads)."""
    source = Path(data_dir) / LENGTHS_FILE
    json.loads(source.read_text())  # a readable file, or an error naming it
    target = Path(model_dir) / LENGTHS_FILE
    target.write_bytes(source.read_bytes())
    return target


__all__ = ["Designer", "Samples", "TASK_PRESETS", "contains", "fragment_core", "save_lengths_beside"]
