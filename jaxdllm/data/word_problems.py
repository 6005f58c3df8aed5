"""Templated GSM-style word problems whose worked solutions come in many valid forms.

A problem gives two people's counts and asks for the total, e.g.

    prompt:   "ann has 4 pens, gets 3. bob has 2 pens, gets 5. how many now?"
    response: "bob: 2+5=7\\n4+3=7 for ann\\ntotal: 7+7=14\\n#### 14"

The solution has three lines, then `#### <number>`:
- one line per person, the two in random order, each in one of three phrasings
  (`"ann: 4+3=7"`, `"4+3=7 for ann"`, `"for ann, 4+3=7"`) with the operands of `+` and `*` in
  either order;
- the combining line last, in one of three phrasings (`"total: 7+7=14"`, `"7+7=14 in all"`,
  `"so 7+7=14"`), operands in either order.

Checking (decided here): `check` accepts exactly the responses the generator can write for the
prompt, i.e. every line order and phrasing above with the right numbers, and nothing else; so
the lines are checked, not only the final number (a response that mixes two valid solutions
line by line, as a parallel decoder may, is still valid; one that mixes them inside a line, or
gets an intermediate number wrong, is not). Whitespace around lines and blank lines are ignored.
`check_final_answer` checks only the number after `####`, the GSM8K metric. A
`WordProblemTask(check_lines=False)` makes `check` use the final-number rule.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
import string
from typing import ClassVar


from jaxdllm.data.answers import extract_final_answer, same_number
from jaxdllm.data.tasks import Task, register_task
from jaxdllm.errors import ConfigError, DataError

NAMES = ("ann", "bob", "eve", "tom", "sam", "max", "liz", "ben", "kim", "joe")
ITEMS = ("pens", "eggs", "cards", "books", "cups", "hats")

PERSON_LINES = ("{n}: {e}={v}", "{e}={v} for {n}", "for {n}, {e}={v}")
TOTAL_LINES = ("total: {e}={v}", "{e}={v} in all", "so {e}={v}")


@dataclasses.dataclass(frozen=True)
class Template:
    """One problem shape: two people, one operation each on two numbers, then a sum.

    Attributes:
      key: short name.
      prompt: format string with fields `A`, `B` (names), `it` (item, plural), and `a`, `b`
        (the first person's numbers), `c`, `d` (the second's).
      op: `+`, `-` or `*`, the per-person operation (`a op b`, `c op d`).
      first, second: inclusive ranges of the first and second operand.
    """

    key: str
    prompt: str
    op: str
    first: tuple[int, int]
    second: tuple[int, int]

    def apply(self, x: int, y: int) -> int:
        return {"+": x + y, "-": x - y, "*": x * y}[self.op]

    @functools.cached_property
    def pattern(self) -> re.Pattern:
        """A regex reading the fields back from a prompt written with this template."""
        out, seen = [], set()
        for literal, field, _, _ in string.Formatter().parse(self.prompt):
            out.append(re.escape(literal))
            if field is None:
                continue
            if field in seen:
                out.append(f"(?P={field})")
            else:
                seen.add(field)
                out.append(f"(?P<{field}>[a-z]+)" if field in ("A", "B", "it") else f"(?P<{field}>\\d+)")
        return re.compile("".join(out))


TEMPLATES = (
    Template("gain", "{A} has {a} {it}, gets {b}. {B} has {c} {it}, gets {d}. how many now?",
             "+", (2, 9), (2, 9)),
    Template("lose", "{A} has {a} {it}, loses {b}. {B} has {c} {it}, loses {d}. how many now?",
             "-", (10, 19), (1, 9)),
    Template("bags", "{A} has {a} bags of {b} {it}. {B} has {c} bags of {d} {it}. how many?",
             "*", (2, 9), (2, 9)),
)


def _exprs(x: int, y: int, op: str) -> list[str]:
    forms = [f"{x}{op}{y}"]
    if op in "+*":
        forms.append(f"{y}{op}{x}")
    return list(dict.fromkeys(forms))


def _normalise(text: str) -> str:
    return "\n".join(line.strip() for line in text.strip().splitlines() if line.strip())


@dataclasses.dataclass(frozen=True)
class WordProblemTask(Task):
    """GSM-style word problems with shuffled, rephrased solution lines before `#### <number>`.

    Attributes:
      name: registry key.
      templates: the problem shapes to draw from (uniformly).
      check_lines: `check` demands a valid worked solution (True) or only the final number.
    """

    name: str = "word_problems"
    templates: tuple[Template, ...] = TEMPLATES
    check_lines: bool = True
    many_answers: ClassVar[bool] = True
    description: ClassVar[str] = "two-step word problems, solution lines in any order and phrasing"

    def __post_init__(self):
        self._check_name()
        if not self.templates or not all(isinstance(t, Template) for t in self.templates):
            raise ConfigError(f"task {self.name!r}: templates must be a non-empty tuple of Template")
        for t in self.templates:
            if t.op not in ("+", "-", "*"):
                raise ConfigError(f"template {t.key!r}: op must be '+', '-' or '*', got {t.op!r}")
            if t.op == "-" and t.first[0] <= t.second[1]:
                raise ConfigError(f"template {t.key!r}: with '-', the first range must start above "
                                  "the second's end so every count stays positive")

    # -- generation ------------------------------------------------------------------------------
    def generate(self, rng):
        template = self.templates[int(rng.integers(len(self.templates)))]
        names = rng.choice(len(NAMES), size=2, replace=False)
        values = {"A": NAMES[int(names[0])], "B": NAMES[int(names[1])],
                  "it": ITEMS[int(rng.integers(len(ITEMS)))]}
        for key, (lo, hi) in zip("abcd", (template.first, template.second) * 2):
            values[key] = int(rng.integers(lo, hi + 1))
        prompt = template.prompt.format(**values)
        people = [(values["A"], values["a"], values["b"]), (values["B"], values["c"], values["d"])]
        lines = []
        for person in (people if rng.integers(2) == 0 else people[::-1]):
            name, x, y = person
            exprs = _exprs(x, y, template.op)
            lines.append(PERSON_LINES[int(rng.integers(len(PERSON_LINES)))].format(
                n=name, e=exprs[int(rng.integers(len(exprs)))], v=template.apply(x, y)))
        partial = [template.apply(x, y) for _, x, y in people]
        exprs = _exprs(*partial, "+")
        total = sum(partial)
        lines.append(TOTAL_LINES[int(rng.integers(len(TOTAL_LINES)))].format(
            e=exprs[int(rng.integers(len(exprs)))], v=total))
        lines.append(f"#### {total}")
        return prompt, "\n".join(lines)

    # -- checking --------------------------------------------------------------------------------
    def _parse(self, prompt: str) -> tuple[Template, dict]:
        for template in self.templates:
            match = template.pattern.fullmatch(prompt.strip())
            if match:
                fields = match.groupdict()
                return template, {k: (v if k in ("A", "B", "it") else int(v)) for k, v in fields.items()}
        raise DataError(f"task {self.name!r} cannot read prompt {prompt!r}: it matches none of the "
                         f"templates {[t.key for t in self.templates]}")

    def solutions(self, prompt: str) -> frozenset[str]:
        """Every valid response to `prompt` (whitespace-normalised), the set `check` accepts."""
        template, v = self._parse(prompt)
        people = [(v["A"], v["a"], v["b"]), (v["B"], v["c"], v["d"])]
        per_person = []
        for name, x, y in people:
            per_person.append([form.format(n=name, e=e, v=template.apply(x, y))
                               for form in PERSON_LINES for e in _exprs(x, y, template.op)])
        partial = [template.apply(x, y) for _, x, y in people]
        total = sum(partial)
        totals = [form.format(e=e, v=total) for form in TOTAL_LINES for e in _exprs(*partial, "+")]
        out = set()
        for first, second in (per_person, per_person[::-1]):
            for l1, l2, l3 in itertools.product(first, second, totals):
                out.add("\n".join((l1, l2, l3, f"#### {total}")))
        return frozenset(out)

    def answer(self, prompt: str) -> int:
        """The right final number for `prompt`."""
        template, v = self._parse(prompt)
        return template.apply(v["a"], v["b"]) + template.apply(v["c"], v["d"])

    def check_final_answer(self, prompt: str, response: str) -> bool:
        """Whether the number after the last `####` in `response` is the right total."""
        return same_number(extract_final_answer(response), str(self.answer(prompt)))

    def check(self, prompt, response):
        if not self.check_lines:
            return self.check_final_answer(prompt, response)
        return _normalise(response) in self.solutions(prompt)

    def final_answer(self, prompt, response):
        return extract_final_answer(response)


register_task(WordProblemTask())
