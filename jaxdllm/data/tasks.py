"""The synthetic task suite: small text tasks a tiny model can learn offline, each with a checker.

A task is a `Task` object: `generate(rng) -> (prompt, response)` draws one instance from a numpy
`Generator` (deterministic per seed), and `check(prompt, response) -> bool` accepts every valid
response, not only the generated one. `many_answers` says whether a prompt has one right answer
(copy, reverse, sort, add) or many (any permutation, any k items, the word problems in
`word_problems.py`): the many-answer tasks are where decoding many tokens in parallel has
something to lose, because independently sampled positions can mix two valid answers into an
invalid one.

Texts are short and character-level friendly: digit lists are written without separators
(`"reverse 31415="` -> `"51413"`), every digit-task prompt ends with `=`. With the character
tokenizer (BOS + prompt + response + EOS) the longest example of the six card tasks is 27 tokens;
the long-answer variants `copy_long`, `reverse_long` and `sort_long` (10-16 digits) reach 43.

Extend the suite by subclassing `Task` and calling `register_task`; `get_task(name)` and
`task_names()` read the registry. Splits with a held-out test set are in `splits.py`.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections import Counter
from typing import ClassVar

import numpy as np

from jaxdllm.data.records import Example
from jaxdllm.errors import ConfigError, DataError

_NAME = re.compile(r"^[a-z0-9_]+$")


class Task(abc.ABC):
    """One synthetic task. Subclasses are frozen dataclasses with at least a `name` field.

    Attributes:
      name: registry key, lowercase letters, digits and `_`.
      many_answers: True when a prompt has more than one right response.
      description: one line for listings and model cards.
    """

    name: str
    many_answers: ClassVar[bool] = False
    description: ClassVar[str] = ""

    @abc.abstractmethod
    def generate(self, rng: np.random.Generator) -> tuple[str, str]:
        """One instance: `(prompt, response)`, drawn only from `rng`."""

    @abc.abstractmethod
    def check(self, prompt: str, response: str) -> bool:
        """Whether `response` is a right answer to `prompt` (leading/trailing whitespace ignored).

        Never raises on a malformed response (returns False); a prompt this task did not write
        raises `ValueError`.
        """

    def final_answer(self, prompt: str, response: str) -> str | None:
        """The final answer stored in `Example.answer`; the whole response for single-answer tasks."""
        return None if self.many_answers else response

    def example(self, rng: np.random.Generator) -> Example:
        """`generate` wrapped in an `Example` tagged with this task's name."""
        prompt, response = self.generate(rng)
        return Example(prompt, response, self.name, self.final_answer(prompt, response))

    def _check_name(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError(f"task name must be lowercase letters, digits or '_', got {self.name!r}")


def _digits_text(rng: np.random.Generator, length: int, distinct: bool) -> str:
    if distinct:
        values = rng.permutation(10)[:length]
    else:
        values = rng.integers(0, 10, size=length)
    return "".join(str(int(v)) for v in values)


@dataclasses.dataclass(frozen=True)
class DigitListTask(Task):
    """Base of the tasks on a list of digits, prompt `"<verb> <digits>="`.

    Attributes:
      name: registry key.
      min_len, max_len: list length, drawn uniformly in `[min_len, max_len]`.
      distinct: draw distinct digits (needs `max_len <= 10`).
    """

    name: str
    min_len: int = 4
    max_len: int = 8
    distinct: bool = False

    verb: ClassVar[str] = ""

    def __post_init__(self):
        self._check_name()
        if not (isinstance(self.min_len, int) and isinstance(self.max_len, int)
                and 1 <= self.min_len <= self.max_len):
            raise ConfigError(f"task {self.name!r}: need 1 <= min_len <= max_len, got "
                              f"min_len={self.min_len!r}, max_len={self.max_len!r}")
        if self.distinct and self.max_len > 10:
            raise ConfigError(f"task {self.name!r}: distinct digits allow at most 10 items, "
                              f"got max_len={self.max_len}")

    def _prefix(self) -> str:
        return f"{self.verb} "

    def _make_prompt(self, digits: str) -> str:
        return f"{self._prefix()}{digits}="

    def _digits(self, prompt: str) -> str:
        prefix = self._prefix()
        body = prompt[len(prefix):-1] if prompt.startswith(prefix) and prompt.endswith("=") else ""
        if not (body.isdigit() and body.isascii()):
            raise DataError(f"task {self.name!r} cannot read prompt {prompt!r}: expected "
                             f"{self._make_prompt('<digits>')!r}")
        return body

    def _draw(self, rng: np.random.Generator) -> str:
        length = int(rng.integers(self.min_len, self.max_len + 1))
        return _digits_text(rng, length, self.distinct)


class _SingleAnswerDigits(DigitListTask):
    """A digit-list task whose answer is a function of the list."""

    detail: ClassVar[str] = ""  # words after "<verb> a 4-8 digit list"

    @property
    def description(self) -> str:
        return f"{self.verb} a {self.min_len}-{self.max_len} digit list{self.detail}"

    def solve(self, digits: str) -> str:
        raise NotImplementedError

    def generate(self, rng):
        digits = self._draw(rng)
        return self._make_prompt(digits), self.solve(digits)

    def check(self, prompt, response):
        return response.strip() == self.solve(self._digits(prompt))


@dataclasses.dataclass(frozen=True)
class CopyTask(_SingleAnswerDigits):
    """`"copy 31415="` -> `"31415"`."""

    name: str = "copy"
    verb: ClassVar[str] = "copy"

    def solve(self, digits):
        return digits


@dataclasses.dataclass(frozen=True)
class ReverseTask(_SingleAnswerDigits):
    """`"reverse 31415="` -> `"51413"`."""

    name: str = "reverse"
    verb: ClassVar[str] = "reverse"

    def solve(self, digits):
        return digits[::-1]


@dataclasses.dataclass(frozen=True)
class SortTask(_SingleAnswerDigits):
    """`"sort 31415="` -> `"11345"`."""

    name: str = "sort"
    verb: ClassVar[str] = "sort"
    detail: ClassVar[str] = " ascending"

    def solve(self, digits):
        return "".join(sorted(digits))


@dataclasses.dataclass(frozen=True)
class PermutationTask(DigitListTask):
    """`"perm 3142="` -> any ordering of the same digits (`"1234"`, `"4213"`, ...).

    Lists have distinct digits by default, so a list of n digits has n! right answers.
    """

    name: str = "perm"
    distinct: bool = True
    verb: ClassVar[str] = "perm"
    many_answers: ClassVar[bool] = True
    description: ClassVar[str] = "write any permutation of a 4-8 digit list"

    def generate(self, rng):
        digits = self._draw(rng)
        return self._make_prompt(digits), "".join(rng.permutation(list(digits)))

    def check(self, prompt, response):
        digits = self._digits(prompt)
        response = response.strip()
        return response.isdigit() and sorted(response) == sorted(digits)


@dataclasses.dataclass(frozen=True)
class PickTask(DigitListTask):
    """`"pick 3 from 31425="` -> any `k` items of the list in any order, each item used once.

    Lists have distinct digits by default, so a list of n digits has n!/(n-k)! right answers.
    """

    name: str = "pick3"
    k: int = 3
    distinct: bool = True
    many_answers: ClassVar[bool] = True
    description: ClassVar[str] = "write any 3 items of a 4-8 digit list"

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.k, int) or not 1 <= self.k <= self.min_len:
            raise ConfigError(f"task {self.name!r}: need 1 <= k <= min_len ({self.min_len}), got k={self.k!r}")

    def _prefix(self):
        return f"pick {self.k} from "

    def generate(self, rng):
        digits = self._draw(rng)
        chosen = rng.choice(len(digits), size=self.k, replace=False)
        return self._make_prompt(digits), "".join(digits[int(i)] for i in chosen)

    def check(self, prompt, response):
        digits = self._digits(prompt)
        response = response.strip()
        return (len(response) == self.k and response.isdigit()
                and not Counter(response) - Counter(digits))


@dataclasses.dataclass(frozen=True)
class TwinTask(DigitListTask):
    """`"twin 31425="` -> any one digit of the list written twice (`"33"`, `"11"`, ...).

    The ParallelBench-style agreement task: the two answer tokens must be the same digit. Each
    position alone is uniform over the list, so committing both in one step from independent
    marginals usually writes two different digits (`"34"`), an invalid combination.
    """

    name: str = "twin"
    distinct: bool = True
    verb: ClassVar[str] = "twin"
    many_answers: ClassVar[bool] = True
    description: ClassVar[str] = "write any one digit of a 4-8 digit list twice (both tokens must agree)"

    def generate(self, rng):
        digits = self._draw(rng)
        return self._make_prompt(digits), digits[int(rng.integers(len(digits)))] * 2

    def check(self, prompt, response):
        digits = self._digits(prompt)
        response = response.strip()
        return len(response) == 2 and response[0] == response[1] and response[0] in digits


@dataclasses.dataclass(frozen=True)
class AdditionTask(Task):
    """`"123+456="` -> `"579"`: the sum of two `num_digits`-digit numbers (no leading zeros)."""

    name: str = "add"
    num_digits: int = 3
    description: ClassVar[str] = "add two 3-digit numbers"

    def __post_init__(self):
        self._check_name()
        if not isinstance(self.num_digits, int) or not 1 <= self.num_digits <= 18:
            raise ConfigError(f"task {self.name!r}: num_digits must be in [1, 18], got {self.num_digits!r}")

    def generate(self, rng):
        low, high = (10 ** (self.num_digits - 1) if self.num_digits > 1 else 0), 10 ** self.num_digits
        a, b = (int(v) for v in rng.integers(low, high, size=2))
        return f"{a}+{b}=", str(a + b)

    def check(self, prompt, response):
        match = re.fullmatch(r"(\d+)\+(\d+)=", prompt)
        if not match:
            raise DataError(f"task {self.name!r} cannot read prompt {prompt!r}: expected 'A+B='")
        return response.strip() == str(int(match[1]) + int(match[2]))


# -- registry -----------------------------------------------------------------------------------
_REGISTRY: dict[str, Task] = {}


def register_task(task: Task, *, overwrite: bool = False) -> Task:
    """Add `task` to the registry under `task.name` (an existing name needs `overwrite=True`)."""
    if not isinstance(task, Task):
        raise ConfigError(f"register_task needs a Task instance, got {type(task).__name__}")
    if task.name in _REGISTRY and not overwrite:
        raise ConfigError(f"a task named {task.name!r} is already registered; "
                          "pass overwrite=True or choose another name")
    _REGISTRY[task.name] = task
    return task


def get_task(name: str | Task) -> Task:
    """The registered task called `name` (a `Task` is returned as is)."""
    if isinstance(name, Task):
        return name
    if name not in _REGISTRY:
        raise ConfigError(f"unknown task {name!r}; registered tasks: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def task_names(many_answers: bool | None = None) -> list[str]:
    """Registered task names in registration order, optionally only single- or many-answer ones."""
    return [n for n, t in _REGISTRY.items() if many_answers is None or t.many_answers == many_answers]


# Long-answer variants (11-17 answer tokens with EOS): answers long enough for Jacobi decoding to
# accept many tokens per forward, as it does on the published benchmarks' long answers.
LONG_MIN_LEN, LONG_MAX_LEN = 10, 16

for _task in (CopyTask(), ReverseTask(), SortTask(), AdditionTask(), PermutationTask(), PickTask(), TwinTask(),
              CopyTask(name="copy_long", min_len=LONG_MIN_LEN, max_len=LONG_MAX_LEN),
              ReverseTask(name="reverse_long", min_len=LONG_MIN_LEN, max_len=LONG_MAX_LEN),
              SortTask(name="sort_long", min_len=LONG_MIN_LEN, max_len=LONG_MAX_LEN)):
    register_task(_task)
