"""GenMol's fragment remasking: goal-directed generation with a masked model and an oracle (GenMol's PMO
loop, `scripts/exps/pmo`), against random sampling from the same model under the same oracle budget.

The loop keeps a population of scored fragments (`[1*]` attachment points), seeded from a fragment
vocabulary: every molecule of a reference set is cut at random acyclic single bonds three times and each
fragment is scored by the mean oracle score of the molecules it came from (`fragments.fragment_vocabulary`).
Each round:

1. two population fragments are joined at their attachment points (`fragments.attach`);
2. after `warmup` oracle calls the joined molecule is modified by the model: re-encoded as SAFE with
   every acyclic single bond cut (safe's `hr` slicer); a molecule under `short_tokens` tokens grows a new
   fragment at a random atom (masks after it, GenMol's `addmask` path); otherwise one of its fragments,
   drawn uniformly, is replaced in place by `randint(5, 15)` MASK tokens (GenMol's `remask`), and the
   canvas is decoded with the `genmol-remask` preset (T 1.2, r 2);
3. the largest component is kept if its heavy-atom count is in the oracle's range, and scored (one oracle
   call; a molecule seen before costs none);
4. a molecule scoring above the population's worst adds its cut fragments with its score; the population
   keeps its best `population_size`.

The published loop makes one molecule per oracle call; here a round makes `batch_size` candidates (one
compiled decode of `batch_size` canvases) before the population update, the usual batched form of the
same loop. The measure is PMO's AUC of the top-10 average against oracle calls (`oracles.top_k_auc`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np
from rdkit import Chem

from jaxdllm.decoding import SamplerConfig
from jaxdllm.decoding.genmol_canvas import genmol_generate
from jaxdllm.molecules.design import Designer
from jaxdllm.molecules.fragments import attach, cut, fragment_vocabulary, heavy_atoms
from jaxdllm.molecules.oracles import OracleBudget, top_k_auc
from jaxdllm.molecules.safe_text import SafeEncodeError

# The heavy-atom range a candidate must fall in (GenMol's PMO settings); other oracles take DEFAULT_RANGE.
HEAVY_ATOM_RANGES = {name: (10, 30) for name in ("albuterol_similarity", "isomers_c7h8n2o2", "isomers_c9h10n2o2pf2cl",
                                                  "median1", "qed", "sitagliptin_mpo", "zaleplon_mpo")}
HEAVY_ATOM_RANGES.update({"gsk3b": (30, 80), "jnk3": (30, 80)})
DEFAULT_RANGE = (20, 40)


@dataclasses.dataclass(frozen=True)
class RemaskingConfig:
    """The loop's settings (GenMol's PMO defaults where it has them).

    Attributes:
      population_size: fragments kept (100).
      warmup: oracle calls of pure recombination before the model modifies candidates (GenMol: 1000 of a
        10,000 budget; scale it with the budget).
      min_masks, max_masks: the masks that replace a fragment (5..15).
      short_tokens: a molecule shorter than this grows a fragment instead (30).
      batch_size: candidates per round.
      preset: the sampler preset of the modifications.
      heavy_atoms: the accepted heavy-atom range; None: the oracle's (`HEAVY_ATOM_RANGES`).
      tries: recombinations tried per candidate before giving up on it.
    """

    population_size: int = 100
    warmup: int = 100
    min_masks: int = 5
    max_masks: int = 15
    short_tokens: int = 30
    batch_size: int = 32
    preset: str = "genmol-remask"
    heavy_atoms: tuple[int, int] | None = None
    tries: int = 20


def _mask_row(designer: Designer, safe: str, rng: np.random.Generator, config: RemaskingConfig) -> list[int] | None:
    """Token ids `[CLS] ... [SEP]` of one modification canvas, or None when the molecule cannot be re-encoded."""
    tok = designer.tokenizer
    mask, bos, eos = (tok.token_to_id(tok.special_tokens[k]) for k in ("mask_token", "bos_token", "eos_token"))
    count = int(rng.integers(config.min_masks, config.max_masks + 1))
    fragments = safe.split(".")
    ids = tok.encode(safe, add_special_tokens=False)
    if len(ids) < config.short_tokens or len(fragments) < 2:
        return None  # grown instead (`_grow_prompt`)
    chosen = int(rng.integers(len(fragments)))
    pieces = [tok.encode(f, add_special_tokens=False) for f in fragments]
    dot = tok.token_to_id(".")
    row = [bos]
    for i, piece in enumerate(pieces):
        if i:
            row.append(dot)
        row += [mask] * count if i == chosen else piece
    return row + [eos]


def _grow_prompt(designer: Designer, smiles: str, rng: np.random.Generator) -> str | None:
    """A prompt in the model's SAFE format that grows `smiles` at one random atom that carries a hydrogen
    (`[*]` there, then `.`)."""
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None
    atoms = [a.GetIdx() for a in mol.GetAtoms() if a.GetTotalNumHs() > 0]
    if not atoms:
        return None
    editable = Chem.RWMol(mol)
    dummy = editable.AddAtom(Chem.Atom(0))
    editable.AddBond(int(rng.choice(atoms)), dummy, Chem.BondType.SINGLE)
    try:
        Chem.SanitizeMol(editable)
        return designer.encode(Chem.MolToSmiles(editable), slicer="brics") + "."
    except (SafeEncodeError, Exception):
        return None


def modify(designer: Designer, molecules: Sequence[str], rng: np.random.Generator, config: RemaskingConfig,
           seed: int) -> list[str | None]:
    """GenMol's `mask_modification` of each molecule (remask a fragment, or grow a short one), decoded by
    the model in one batch of canvases; None where a molecule could not be modified."""
    tok = designer.tokenizer
    pad, mask, bos, eos = (tok.token_to_id(tok.special_tokens[k]) for k in ("pad_token", "mask_token", "bos_token",
                                                                             "eos_token"))
    rows: list[list[int] | None] = []
    for smiles in molecules:
        try:
            safe = designer.encode(smiles, slicer="hr")
        except SafeEncodeError:
            rows.append(None)
            continue
        row = _mask_row(designer, safe, rng, config)
        if row is None:
            prompt = _grow_prompt(designer, smiles, rng)
            count = int(rng.integers(config.min_masks, config.max_masks + 1))
            row = None if prompt is None else [bos, *tok.encode(prompt, add_special_tokens=False), *[mask] * count, eos]
        rows.append(row)
    rows = [r if r is not None and len(r) <= designer.max_canvas else None for r in rows]  # too long: skipped
    live = [r for r in rows if r is not None]
    if not live:
        return [None] * len(rows)
    width = max(len(r) for r in live)
    batch = max(config.batch_size, len(live))
    ids = np.full((batch, width), pad, np.int32)
    for i, r in enumerate(live):
        ids[i, :len(r)] = r
    ids[len(live):] = ids[0]  # a fixed batch shape: the filler rows repeat the first
    ids = designer._bucketed(ids, pad)
    out = genmol_generate(designer.sampler, ids, (ids != pad).astype(np.int32),
                          SamplerConfig.preset(config.preset, prompt_bucket=4), key=jax.random.key(seed))
    texts = iter(tok.decode(row.tolist()) for row in np.asarray(out.tokens)[:len(live)])
    return [None if r is None else designer.decode(next(texts)) for r in rows]


def fragment_remasking(designer: Designer, oracle: Callable[[str], float], oracle_name: str, budget: int,
                       reference: Sequence[str], *, config: RemaskingConfig = RemaskingConfig(), seed: int = 0,
                       vocabulary_size: int = 1000) -> dict:
    """Run the loop until `budget` oracle calls; `reference`: molecules (SMILES) whose cut fragments, scored
    by `oracle` (not counted in the budget, as GenMol precomputes its vocabularies), seed the population.

    Returns `{"auc_top10", "top10_mean", "best", "calls", "history": [(smiles, score) in call order]}`."""
    rng = np.random.default_rng(seed)
    scores = [oracle(s) for s in reference]
    vocabulary = fragment_vocabulary(list(reference), scores, rng, size=vocabulary_size)
    population = sorted(((v[0], v[1]) for v in vocabulary), key=lambda x: -x[1])[:config.population_size]
    low, high = config.heavy_atoms or HEAVY_ATOM_RANGES.get(oracle_name, DEFAULT_RANGE)
    scorer = OracleBudget(oracle, budget)
    round_index = 0
    while not scorer.exhausted and round_index < 100 * budget:
        round_index += 1
        joined = []
        for _ in range(config.batch_size):
            for _ in range(config.tries):
                a, b = rng.choice(len(population), 2, replace=len(population) < 2)
                smiles = attach(population[int(a)][0], population[int(b)][0])
                if smiles:
                    joined.append(smiles)
                    break
        if scorer.calls >= config.warmup:
            joined = modify(designer, joined, rng, config, seed=seed * 100_003 + round_index)
        for smiles in joined:
            if smiles is None or not low <= heavy_atoms(smiles) <= high:
                continue
            score = scorer(smiles)
            if score is None:  # the budget ran out
                break
            if len(population) < config.population_size or score > population[-1][1]:
                for _ in range(3):  # GenMol adds the molecule's cut fragments with its score
                    pieces = cut(smiles, rng)
                    population += [(p, score) for p in pieces or []]
                population = sorted(dict(population).items(), key=lambda x: -x[1])[:config.population_size]
    return _summary(scorer, budget)


def random_sampling(designer: Designer, oracle: Callable[[str], float], budget: int, *, seed: int = 0,
                    batch: int = 256, **settings) -> dict:
    """The baseline: de novo samples of the model, `min(batch, budget)` per round, scored in order until
    `budget` oracle calls."""
    scorer = OracleBudget(oracle, budget)
    batch = min(batch, budget)  # a small budget draws no more samples than it can score
    round_index = 0
    while not scorer.exhausted and round_index < 100:
        samples = designer.denovo(batch, seed=seed * 1000 + round_index, **settings)
        round_index += 1
        for smiles in samples.smiles:
            if smiles is not None and scorer(smiles) is None:
                break
    return _summary(scorer, budget)


def _summary(scorer: OracleBudget, budget: int) -> dict:
    history = list(scorer.history)
    top = sorted((s for _, s in history), reverse=True)[:10]
    best = max(history, key=lambda x: x[1]) if history else (None, 0.0)
    return {"auc_top10": top_k_auc([s for _, s in history], k=10, budget=budget), "top10_mean": float(np.mean(top))
            if top else 0.0, "best": {"smiles": best[0], "score": best[1]}, "calls": scorer.calls, "history": history}


def top10_curve(history: Sequence[tuple[str, float]], every: int = 10) -> tuple[list[int], list[float]]:
    """`(calls, mean of the top 10 so far)` every `every` oracle calls (the curve PMO's AUC integrates)."""
    calls, values, best = [], [], []
    for i, (_, score) in enumerate(history, 1):
        best = sorted(best + [score], reverse=True)[:10]
        if i % every == 0 or i == len(history):
            calls.append(i)
            values.append(float(np.mean(best)))
    return calls, values


def write_comparison(out, oracle_name: str, budget: int, runs: dict[str, dict]) -> dict:
    """`optimize.json` (each run's AUC-top-10, top-10 mean, best molecule, calls; the histories) and
    `optimize.png` (the top-10 mean against oracle calls). Returns the summary without histories."""
    import json
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"oracle": oracle_name, "budget": budget,
               "runs": {name: {k: v for k, v in run.items() if k != "history"} for name, run in runs.items()}}
    (out / "optimize.json").write_text(json.dumps({**summary, "histories": {n: r["history"] for n, r in runs.items()}},
                                                  indent=1) + "\n")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, run in runs.items():
        ax.plot(*top10_curve(run["history"]), label=f"{name} (AUC top-10 {run['auc_top10']:.3f})")
    ax.set_xlabel("oracle calls")
    ax.set_ylabel(f"mean of the top 10 ({oracle_name})")
    ax.set_xlim(0, budget)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "optimize.png", dpi=120)
    plt.close(fig)
    return summary


__all__ = ["HEAVY_ATOM_RANGES", "RemaskingConfig", "fragment_remasking", "modify", "random_sampling", "top10_curve",
           "write_comparison"]
