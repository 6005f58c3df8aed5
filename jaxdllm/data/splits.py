"""Train/test splits of the synthetic tasks, disjoint by construction and deterministic per seed.

Which split an instance belongs to is a property of the instance, not of the seed: a stable hash
(BLAKE2b) of `task name + prompt` falls below `test_fraction` for test instances. `make_split`
draws instances from a seeded generator and keeps only those of the asked split, so a test
instance never appears in any training split, whatever the seeds, and the same
`(task, n, seed, split)` always gives the same examples (the generator is seeded with
`(seed, split, hash of the task name)`, so tasks and splits get independent streams).
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import numpy as np

from jaxdllm.data.records import Example
from jaxdllm.errors import DataError
from jaxdllm.data.tasks import Task, get_task
from jaxdllm.errors import ConfigError

SPLITS = ("train", "test")
DEFAULT_TEST_FRACTION = 0.1


def _stable_int(text: str, nbytes: int = 8) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=nbytes).digest(), "big")


def instance_split(task: str | Task, prompt: str, test_fraction: float = DEFAULT_TEST_FRACTION) -> str:
    """`"test"` or `"train"`: the split the instance `(task, prompt)` belongs to."""
    name = task.name if isinstance(task, Task) else task
    return "test" if _stable_int(f"{name}\x00{prompt}") / 2**64 < test_fraction else "train"


def make_split(task: str | Task, n: int, seed: int, split: str = "train", *,
               test_fraction: float = DEFAULT_TEST_FRACTION, unique: bool = True,
               max_tries: int | None = None) -> list[Example]:
    """`n` examples of `task` (a name or a `Task`) from the `split` partition.

    Args:
      task: a registered task name or a `Task`.
      n: number of examples.
      seed: non-negative integer; the same arguments give the same examples.
      split: `"train"` or `"test"`.
      test_fraction: share of all instances that form the test partition, in (0, 1). Use the
        same value for the train and the test split.
      unique: no prompt repeated within the returned list.
      max_tries: instances drawn before giving up (default `50 * n / share + 1000`); running
        out raises `DataError` (the task has too few distinct instances in this partition).
    """
    task = get_task(task)
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(n, int) or n < 0:
        raise ConfigError(f"n must be a non-negative integer, got {n!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    share = test_fraction if split == "test" else 1.0 - test_fraction
    if max_tries is None:
        max_tries = int(50 * n / share) + 1000
    rng = np.random.default_rng([seed, SPLITS.index(split), _stable_int(task.name, 4)])
    out: list[Example] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n:
        if tries >= max_tries:
            raise DataError(
                f"task {task.name!r}: found only {len(out)} of {n} {'unique ' if unique else ''}{split} "
                f"instances in {tries} draws; ask for fewer, pass unique=False, or widen the task")
        tries += 1
        example = task.example(rng)
        if instance_split(task.name, example.prompt, test_fraction) != split:
            continue
        if unique:
            if example.prompt in seen:
                continue
            seen.add(example.prompt)
        out.append(example)
    return out


def make_mixture(tasks: Iterable[str | Task], n_per_task: int, seed: int, split: str = "train",
                 **kwargs) -> list[Example]:
    """`make_split` for each task, concatenated in the given task order (shuffle when batching)."""
    out: list[Example] = []
    for task in tasks:
        out.extend(make_split(task, n_per_task, seed, split, **kwargs))
    return out
