"""Chained list operations with a worked trace: a long answer whose later lines depend on earlier ones.

A prompt names a list of distinct digits and a few operations to apply in order, e.g.

    prompt:   "chain 3142 rev rot swp="
    response: "rev 3142>2413\\nrot: 4132\\n4132 -swp-> 1432\\n#### 1432"

The response writes one line per operation, each with the list after it, then `#### <final list>`.
Each line is computed from the line before it, so later tokens depend on earlier ones, and there
is exactly one right final list. Operations:
- `rev`: reverse the list (`3142` -> `2413`);
- `rot`: rotate left by one (`3142` -> `1423`);
- `swp`: swap the first two items (`3142` -> `1342`).

A step line has one of three phrasings of different lengths, drawn independently per line with
`form_weights` (default 0.5 / 0.3 / 0.2), the way human worked solutions have a usual style and
others:
- `"rev 3142>2413"` (operation, list before, list after);
- `"rev: 2413"` (operation, list after);
- `"3142 -rev-> 2413"` (list before, operation, list after).

Because the phrasings differ in length, where a later line sits in the answer is unknown until the
earlier lines' phrasings are chosen. A model trained on this mix is unsure of both the phrasing and
the position of everything after it; a model that always writes one phrasing knows every position
from the prompt. With 3 operations on 4 digits, answers are 39-60 characters (+ EOS).

Checking: `check` accepts exactly the responses the generator can write for the prompt (any
phrasing per line, the right list on every line, the right final list) and nothing else, so a
wrong intermediate list fails even when the final list is right. `check_final_answer` reads only
the list after `####`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

import numpy as np

from jaxdllm.data.tasks import Task, register_task
from jaxdllm.errors import ConfigError, DataError

OPERATIONS = {
    "rev": lambda items: items[::-1],
    "rot": lambda items: items[1:] + items[:1],
    "swp": lambda items: items[1::-1] + items[2:],
}
STEP_FORMS = ("{op} {before}>{after}", "{op}: {after}", "{before} -{op}-> {after}")
_FINAL = re.compile(r"####\s*(\d+)\s*$")


def apply_operations(items: str, operations: list[str] | tuple[str, ...]) -> list[str]:
    """The list after each operation in turn (`len(operations)` strings)."""
    states = []
    for op in operations:
        items = OPERATIONS[op](items)
        states.append(items)
    return states


def _normalise(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines() if line.strip()]


@dataclasses.dataclass(frozen=True)
class ListChainTask(Task):
    """`"chain 3142 rev rot swp="` -> one worked line per operation, then `"#### <final list>"`.

    Attributes:
      name: registry key.
      num_items: digits in the list (distinct), 2-10.
      num_steps: operations per prompt, drawn uniformly from `OPERATIONS` (repeats allowed).
      form_weights: probability of each phrasing in `STEP_FORMS`, drawn independently per line.
    """

    name: str = "chain"
    num_items: int = 4
    num_steps: int = 3
    form_weights: tuple[float, ...] = (0.5, 0.3, 0.2)
    many_answers: ClassVar[bool] = False  # one right final list; the lines' phrasing may vary
    description: ClassVar[str] = "apply 3 list operations to 4 digits, one worked line each, then #### and the result"

    def __post_init__(self):
        self._check_name()
        if not isinstance(self.num_items, int) or not 2 <= self.num_items <= 10:
            raise ConfigError(f"task {self.name!r}: num_items must be in [2, 10], got {self.num_items!r}")
        if not isinstance(self.num_steps, int) or not 1 <= self.num_steps <= 8:
            raise ConfigError(f"task {self.name!r}: num_steps must be in [1, 8], got {self.num_steps!r}")
        weights = tuple(self.form_weights)
        if (len(weights) != len(STEP_FORMS) or any(w < 0 for w in weights)
                or abs(sum(weights) - 1.0) > 1e-6):
            raise ConfigError(f"task {self.name!r}: form_weights needs {len(STEP_FORMS)} non-negative "
                              f"probabilities summing to 1 (one per phrasing {STEP_FORMS}), got {weights!r}")

    # -- generation ------------------------------------------------------------------------------
    def generate(self, rng: np.random.Generator) -> tuple[str, str]:
        items = "".join(str(int(d)) for d in rng.permutation(10)[:self.num_items])
        ops = [list(OPERATIONS)[int(i)] for i in rng.integers(len(OPERATIONS), size=self.num_steps)]
        states = apply_operations(items, ops)
        lines = []
        for op, before, after in zip(ops, [items] + states[:-1], states):
            form = STEP_FORMS[int(rng.choice(len(STEP_FORMS), p=self.form_weights))]
            lines.append(form.format(op=op, before=before, after=after))
        lines.append(f"#### {states[-1]}")
        return f"chain {items} {' '.join(ops)}=", "\n".join(lines)

    # -- checking --------------------------------------------------------------------------------
    def parse_prompt(self, prompt: str) -> tuple[str, list[str]]:
        """`(list, operations)` read from a prompt this task wrote; `DataError` otherwise."""
        words = prompt.strip().removesuffix("=").split(" ")
        if (len(words) != self.num_steps + 2 or words[0] != "chain" or not prompt.strip().endswith("=")
                or not words[1].isdigit() or len(words[1]) != self.num_items
                or any(op not in OPERATIONS for op in words[2:])):
            raise DataError(f"task {self.name!r} cannot read prompt {prompt!r}: expected "
                            f"'chain <{self.num_items} digits> <{self.num_steps} of {sorted(OPERATIONS)}>='")
        return words[1], words[2:]

    def answer(self, prompt: str) -> str:
        """The right final list for `prompt`."""
        items, ops = self.parse_prompt(prompt)
        return apply_operations(items, ops)[-1]

    def check(self, prompt, response):
        items, ops = self.parse_prompt(prompt)
        states = apply_operations(items, ops)
        lines = _normalise(response)
        if len(lines) != len(ops) + 1 or lines[-1] != f"#### {states[-1]}":
            return False
        for line, op, before, after in zip(lines, ops, [items] + states[:-1], states):
            if line not in {form.format(op=op, before=before, after=after) for form in STEP_FORMS}:
                return False
        return True

    def check_final_answer(self, prompt: str, response: str) -> bool:
        """Whether the list after the last line's `####` is the right final list."""
        lines = _normalise(response)
        match = _FINAL.fullmatch(lines[-1]) if lines else None
        return bool(match) and match[1] == self.answer(prompt)

    def final_answer(self, prompt, response):
        lines = _normalise(response)
        match = _FINAL.fullmatch(lines[-1]) if lines else None
        return match[1] if match else None


register_task(ListChainTask())
