"""Training rows for Jacobi Forcing and CLLM from a causal model's recorded Jacobi trajectories
(`jaxdllm distill trajectories`, one JSON line per prompt: `prompt_ids`, `states`, `fixed_point`).

The answer region of a trajectory is cut into blocks of `n` tokens. For block `j` the *clean*
block is the fixed point's tokens and a *noisy* block is the same slice of one recorded state;
its noise ratio is the fraction of its tokens that differ from the fixed point. A row is

    prompt_ids ++ noisy_0 ++ clean_0 ++ noisy_1 ++ clean_1 ++ ...

where `noisy_j` and `clean_j` both take the position ids `P + j n + [0, n)` (`P` = prompt
length), and the `jacobi_forcing` attention mask keeps the two streams apart
(`jaxdllm.attention.mask`). Blocks after the one holding the fixed point's first EOS are
dropped: they are EOS fill.

Which state is the noisy block:

* `progressive` (Jacobi Forcing): block `j` targets the noise ratio
  `linspace(0, 1, window)[(j + shift) % window]` and takes the state closest to it (the first on
  a tie). The published schedule has `shift = 0`; with `shift_schedule` each trajectory draws its
  own shift, so that answers of only a few blocks still see every noise level.
* `one_state` (CLLM): one block, drawn uniformly among those the decoding did not get right in
  one forward, takes a state drawn uniformly among its states that differ from the fixed point;
  earlier blocks are clean in both streams (no consistency loss there) and later ones are dropped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Sequence

import numpy as np

from jaxdllm.data.batching import BatchConfig, TokenizedExample
from jaxdllm.data.jsonl import iter_jsonl_lines
from jaxdllm.errors import ConfigError, DataError

SELECTIONS = ("progressive", "one_state")


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """One prompt's Jacobi trajectory: `prompt_ids [P]`, `states [S, G]` (S >= 0 intermediate
    states, oldest first) and `fixed_point [G]`."""

    prompt_ids: np.ndarray
    states: np.ndarray
    fixed_point: np.ndarray
    task: str = ""


def read_trajectories(path: str | os.PathLike, keep: str = "correct") -> list[Trajectory]:
    """The trajectories of a `jaxdllm distill trajectories` file: those whose answer is correct
    (`keep="correct"`) or all of them (`keep="all"`). A line without the trajectory fields is an
    error naming the file and line."""
    out, total = [], 0
    for number, line in iter_jsonl_lines(path):
        try:
            record = json.loads(line)
            fixed = np.asarray(record["fixed_point"], np.int32)
            states = np.asarray(record["states"], np.int32).reshape(-1, fixed.shape[0])
            prompt = np.asarray(record["prompt_ids"], np.int32)
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{path}:{number}: not a trajectory record ({type(e).__name__}: {e}); write it with "
                            "`jaxdllm distill trajectories`") from None
        total += 1
        if keep == "all" or record.get("correct") is True:
            out.append(Trajectory(prompt, states, fixed, record.get("task") or ""))
    if not out:
        raise DataError(f"{path}: none of its {total} trajectories has a correct answer; nothing to train on "
                        "(set [data] keep = \"all\" to train on unchecked ones)")
    return out


def answer_blocks(fixed_point: np.ndarray, n: int, eos_id: int | None) -> int:
    """How many `n`-token blocks of the answer are kept: up to the one holding the first EOS."""
    g = fixed_point.shape[0]
    if g % n:
        raise DataError(f"the trajectories' answer length {g} is not a multiple of the block length {n}: "
                        f"collect them with gen_length a multiple of {n}, or choose a block length dividing {g}")
    hits = np.nonzero(fixed_point == eos_id)[0] if eos_id is not None else []
    end = int(hits[0]) + 1 if len(hits) else g
    return -(-end // n)


def noise_ratios(states: np.ndarray, fixed_point: np.ndarray, n: int) -> np.ndarray:
    """`[S, G // n]` fraction of each state's block tokens that differ from the fixed point."""
    wrong = states != fixed_point[None]
    return wrong.reshape(states.shape[0], -1, n).mean(-1)


def progressive_noisy(t: Trajectory, n: int, blocks: int, window: int, shift: int) -> np.ndarray:
    """`[blocks, n]` noisy blocks by the progressive schedule (see the module docstring)."""
    clean = t.fixed_point[:blocks * n].reshape(blocks, n)
    if not len(t.states):
        return clean
    grid = np.linspace(0.0, 1.0, window)
    ratios = noise_ratios(t.states, t.fixed_point, n)[:, :blocks]      # [S, blocks]
    out = np.empty_like(clean)
    for j in range(blocks):
        target = grid[(j + shift) % window]
        s = int(np.argmin(np.abs(ratios[:, j] - target)))
        out[j] = t.states[s, j * n:(j + 1) * n]
    return out


def one_state_noisy(t: Trajectory, n: int, blocks: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """`([kept, n] noisy blocks, kept)`: CLLM's one random state of one random block (see the
    module docstring); every block clean when the decoding got all of them in one forward."""
    clean = t.fixed_point[:blocks * n].reshape(blocks, n)
    ratios = noise_ratios(t.states, t.fixed_point, n)[:, :blocks] if len(t.states) else np.zeros((0, blocks))
    noisy_blocks = np.nonzero((ratios > 0).any(0))[0]
    if not len(noisy_blocks):
        return clean, blocks
    j = int(rng.choice(noisy_blocks))
    s = int(rng.choice(np.nonzero(ratios[:, j] > 0)[0]))
    out = clean[:j + 1].copy()
    out[j] = t.states[s, j * n:(j + 1) * n]
    return out, j + 1


def pack(prompt_ids: np.ndarray, noisy: np.ndarray, clean: np.ndarray) -> TokenizedExample:
    """The row `prompt ++ noisy_0 ++ clean_0 ++ ...` with its position ids; `noisy`, `clean`:
    `[blocks, n]`."""
    p, (blocks, n) = len(prompt_ids), clean.shape
    body = np.stack([noisy, clean], 1).reshape(-1)
    block_positions = p + np.arange(blocks * n).reshape(blocks, 1, n)
    positions = np.concatenate([np.arange(p), np.broadcast_to(block_positions, (blocks, 2, n)).reshape(-1)])
    return TokenizedExample(np.concatenate([prompt_ids, body]).astype(np.int32), p,
                            positions=positions.astype(np.int32))


def trajectory_examples(trajectories: Sequence[Trajectory], n: int, *, selection: str, eos_id: int | None,
                        window: int = 16, shift_schedule: bool = True, seed: int = 0) -> list[TokenizedExample]:
    """Packed training rows (`pack`), one per trajectory, noisy blocks chosen by `selection`
    (`"progressive"` or `"one_state"`); draws are seeded by `seed` and the trajectory's index."""
    if selection not in SELECTIONS:
        raise ConfigError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    out = []
    for i, t in enumerate(trajectories):
        rng = np.random.default_rng([seed, i])
        blocks = answer_blocks(t.fixed_point, n, eos_id)
        if selection == "progressive":
            shift = int(rng.integers(window)) if shift_schedule else 0
            noisy = progressive_noisy(t, n, blocks, window, shift)
        else:
            noisy, blocks = one_state_noisy(t, n, blocks, rng)
        out.append(pack(t.prompt_ids, noisy, t.fixed_point[:blocks * n].reshape(blocks, n)))
    return out


def fit_rows(rows: list[TokenizedExample], config: BatchConfig) -> list[TokenizedExample]:
    """`rows` no longer than `config.seq_len`: longer ones raise `DataError` (or are skipped with a
    warning under `on_too_long = "skip"`)."""
    kept = [r for r in rows if len(r) <= config.seq_len]
    if len(kept) < len(rows):
        longest = max(len(r) for r in rows)
        if config.on_too_long == "error":
            raise DataError(f"{len(rows) - len(kept)} of {len(rows)} packed rows are longer than seq_len="
                            f"{config.seq_len} (the longest: {longest} tokens); raise [data] seq_len or set "
                            "on_too_long = \"skip\"")
        warnings.warn(f"skipped {len(rows) - len(kept)} of {len(rows)} packed rows longer than seq_len="
                      f"{config.seq_len}", stacklevel=2)
    return kept
