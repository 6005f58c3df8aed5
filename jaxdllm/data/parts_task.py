"""`parts`: a task of independent sub-computations and a combination, in a sequential and a Multiverse format.

A prompt names a few operations (from `jaxdllm/data/list_chains.py`'s `OPERATIONS`) and several 3-digit
lists, each labelled with its part's number (`k=`); every list goes through the same operations,
independently of the others:

    prompt:      "par rev rot swp: 1=314 2=520 3=761 4=802="
    sequential:  "rev:413 rot:134 swp:314;rev:025 rot:250 swp:520;rev:167 rot:671 swp:761;rev:208 rot:082 swp:802;=3578"
    multiverse:  "<Parallel><Goal><Outline>1</Outline><Outline>2</Outline><Outline>3</Outline><Outline>4</Outline></Goal>"
                 "<Path>1:rev:413 rot:134 swp:314</Path><Path>2:rev:025 rot:250 swp:520</Path>"
                 "<Path>3:rev:167 rot:671 swp:761</Path><Path>4:rev:208 rot:082 swp:802</Path>"
                 "<Conclusion>3578</Conclusion></Parallel>"

Each part writes one `op:list` step per operation. The labels make a part's list findable by content:
under Multiverse Attention path `<Path>2:` sees the prompt but not its siblings, so it finds its list by
looking up `2=` in the prompt rather than by counting lists. Both formats read the same prompt. The
combination (after `=`, or the Conclusion) is the first digit of every part's final list, in order, so it
needs every part's result. The Multiverse response has no separators between tags, so training positions
and a fork/merge decoder (children start with `<Path>` right after `</Goal>`) agree. `strip_tags` of the Multiverse response is the "tag-stripped"
text (`"12341:rev:413 ...2:rev:...3578"`).

`check` accepts exactly the three canonical texts (sequential, Multiverse, tag-stripped Multiverse) of
the prompt, so every part's steps and the combination must be right; `final_answer` reads the
combination. `PartsMultiverseTask` (`parts_mv`) is the same task whose `generate` writes the Multiverse
format (same instances for the same rng); `parts_small` (2 lists of 2 digits, one operation) is a short
variant for smoke tests.

Lengths (character tokenizer, tags one token each; `sequential_length` and `multiverse_chain_length`,
response + EOS, prompt excluded; the chain is Parallel/Goal/outlines + the longest path + the conclusion
+ EOS), 3 operations (the labels lengthen the prompt by 2 tokens a list, not the responses):

    parts | sequential | Multiverse chain | ratio
      2   |     52     |        42        | 1.24
      3   |     77     |        46        | 1.67
      4   |    102     |        50        | 2.04
    3-4 (the default draw, mean) |  89.5  |  48  | 1.86
"""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

import numpy as np

from jaxdllm.data.list_chains import OPERATIONS, apply_operations
from jaxdllm.data.multiverse_tags import strip_tags
from jaxdllm.data.records import Example
from jaxdllm.data.tasks import Task, register_task
from jaxdllm.errors import ConfigError, DataError

_PROMPT = re.compile(r"par ((?:[a-z]{3} ?)+): ((?:\d=\d+ ?)+)=")
_COMBINATION = re.compile(r"(?:=|<Conclusion>)(\d+)(?:</Conclusion></Parallel>)?\s*$")


@dataclasses.dataclass(frozen=True)
class PartsTask(Task):
    """`"par rev rot swp: 1=314 2=520 3=761="` -> every list's steps, then the first digits of the results.

    Attributes:
      name: registry key.
      min_parts, max_parts: lists per prompt, drawn uniformly in `[min_parts, max_parts]` (2-9).
      num_items: digits per list (distinct).
      num_ops: operations per prompt, drawn uniformly from `OPERATIONS` (repeats allowed).
    """

    name: str = "parts"
    min_parts: int = 3
    max_parts: int = 4
    num_items: int = 3
    num_ops: int = 3
    fmt: ClassVar[str] = "sequential"
    description: ClassVar[str] = ("apply 3 list operations to each of 3-4 independent 3-digit lists, then the "
                                  "first digit of every result (sequential format)")

    def __post_init__(self):
        self._check_name()
        if not (isinstance(self.min_parts, int) and isinstance(self.max_parts, int)
                and 2 <= self.min_parts <= self.max_parts <= 9):
            raise ConfigError(f"task {self.name!r}: need 2 <= min_parts <= max_parts <= 9, got "
                              f"{self.min_parts!r}, {self.max_parts!r}")
        if not isinstance(self.num_items, int) or not 2 <= self.num_items <= 10:
            raise ConfigError(f"task {self.name!r}: num_items must be in [2, 10], got {self.num_items!r}")
        if not isinstance(self.num_ops, int) or not 1 <= self.num_ops <= 6:
            raise ConfigError(f"task {self.name!r}: num_ops must be in [1, 6], got {self.num_ops!r}")

    # -- instances -------------------------------------------------------------------------------
    def draw_prompt(self, rng: np.random.Generator) -> str:
        """One prompt, drawn only from `rng`."""
        n = int(rng.integers(self.min_parts, self.max_parts + 1))
        ops = [list(OPERATIONS)[int(i)] for i in rng.integers(len(OPERATIONS), size=self.num_ops)]
        lists = ["".join(str(int(d)) for d in rng.permutation(10)[:self.num_items]) for _ in range(n)]
        return f"par {' '.join(ops)}: {' '.join(f'{k}={x}' for k, x in enumerate(lists, 1))}="

    def parse_prompt(self, prompt: str) -> tuple[list[str], list[str]]:
        """`(operations, lists)` of a prompt this task wrote; `DataError` otherwise."""
        match = _PROMPT.fullmatch(prompt.strip())
        ops = match[1].split() if match else []
        labelled = [x.split("=") for x in match[2].split()] if match else []
        lists = [x for _, x in labelled]
        if (not match or len(ops) != self.num_ops or any(op not in OPERATIONS for op in ops)
                or [k for k, _ in labelled] != [str(k) for k in range(1, len(labelled) + 1)]
                or not self.min_parts <= len(lists) <= self.max_parts
                or any(len(x) != self.num_items for x in lists)):
            raise DataError(f"task {self.name!r} cannot read prompt {prompt!r}: expected 'par <{self.num_ops} of "
                            f"{sorted(OPERATIONS)}>: 1=<list> 2=<list> ...=' with {self.min_parts}-{self.max_parts} "
                            f"lists of {self.num_items} digits, labelled 1, 2, ... in order")
        return ops, lists

    def part_steps(self, prompt: str) -> list[str]:
        """Each part's worked text `"rev:413 rot:134 swp:314"`."""
        ops, lists = self.parse_prompt(prompt)
        return [" ".join(f"{op}:{state}" for op, state in zip(ops, apply_operations(items, ops))) for items in lists]

    def answer(self, prompt: str) -> str:
        """The combination: the first digit of every part's final list, in order."""
        ops, lists = self.parse_prompt(prompt)
        return "".join(apply_operations(items, ops)[-1][0] for items in lists)

    def sequential(self, prompt: str) -> str:
        return "".join(f"{steps};" for steps in self.part_steps(prompt)) + f"={self.answer(prompt)}"

    def multiverse(self, prompt: str) -> str:
        steps = self.part_steps(prompt)
        goal = "".join(f"<Outline>{i}</Outline>" for i in range(1, len(steps) + 1))
        paths = "".join(f"<Path>{i}:{s}</Path>" for i, s in enumerate(steps, 1))
        return (f"<Parallel><Goal>{goal}</Goal>{paths}"
                f"<Conclusion>{self.answer(prompt)}</Conclusion></Parallel>")

    def response(self, prompt: str, fmt: str | None = None) -> str:
        """The canonical response in `fmt` ("sequential", "multiverse" or "stripped"; default this task's)."""
        fmt = fmt or self.fmt
        if fmt == "sequential":
            return self.sequential(prompt)
        if fmt == "multiverse":
            return self.multiverse(prompt)
        if fmt == "stripped":
            return strip_tags(self.multiverse(prompt))
        raise ConfigError(f"format must be 'sequential', 'multiverse' or 'stripped', got {fmt!r}")

    def generate(self, rng):
        prompt = self.draw_prompt(rng)
        return prompt, self.response(prompt)

    # -- checking --------------------------------------------------------------------------------
    def check(self, prompt, response):
        return response.strip() in {self.response(prompt, f) for f in ("sequential", "multiverse", "stripped")}

    def final_answer(self, prompt, response):
        """The combination: after `=`, in the Conclusion, or (tag-stripped text) the last digits."""
        response = response.strip()
        match = _COMBINATION.search(response)
        if match:
            return match[1]
        n = len(self.parse_prompt(prompt)[1])
        stripped = strip_tags(response)
        return stripped[-n:] if stripped == response and stripped[-n:].isdigit() else None

    # -- lengths ---------------------------------------------------------------------------------
    @staticmethod
    def sequential_length(response: str) -> int:
        """Tokens of a sequential response with the character tokenizer, + EOS."""
        return len(response) + 1

    @staticmethod
    def multiverse_chain_length(response: str) -> int:
        """The longest chain of a one-block Multiverse response (tags one token each), + EOS: everything
        outside the paths plus the longest path."""
        count = lambda text: len(strip_tags(text)) + sum(text.count(t) for t in _TAG_LIST)
        paths = re.findall(r"<Path>.*?</Path>", response)
        outside = re.sub(r"<Path>.*?</Path>", "", response)
        return count(outside) + max((count(p) for p in paths), default=0) + 1


@dataclasses.dataclass(frozen=True)
class PartsMultiverseTask(PartsTask):
    """`parts` whose `generate` writes the Multiverse format (the same instances for the same rng)."""

    name: str = "parts_mv"
    fmt: ClassVar[str] = "multiverse"
    description: ClassVar[str] = "the parts task in the Multiverse format (<Parallel>, one <Path> per list)"


from jaxdllm.data.multiverse_tags import TAGS as _TAG_LIST  # noqa: E402  (used by multiverse_chain_length)

STAGES = ("sequential x2", "10% multiverse", "mixed first halves", "mixed second halves", "90% multiverse",
          "multiverse x2")


def curriculum(task: PartsTask, num_instances: int, seed: int = 0, multiverse: bool = True) -> list[Example]:
    """Multiverse's AR-to-Multiverse curriculum (`data/tokenization_multiverse.py` of the published code),
    in training order (no shuffle across stages), over `num_instances` instances drawn with `seed`.

    Stages, each a concatenation over the instances S (sequential) and M (Multiverse) of the same prompts:
      1. S twice;
      2. 10 % of the instances in M, the rest in S;
      3. the first half of the instances, in both S and M;
      4. the second half, in both S and M;
      5. 90 % in M, 10 % in S;
      6. M twice.
    8 x `num_instances` examples. Within a stage the order is a fixed shuffle (`seed`), so both formats are
    mixed; the stages follow each other in order. `multiverse=False` gives the sequential baseline with the
    same prompts, the same order and the same number of rows, every response sequential.
    """
    rng = np.random.default_rng([seed, 7])
    prompts = [task.draw_prompt(rng) for _ in range(num_instances)]
    n, half = len(prompts), len(prompts) // 2
    S = [(p, "sequential") for p in prompts]
    M = [(p, "multiverse" if multiverse else "sequential") for p in prompts]
    pick = lambda frac: [M[i] if i < round(frac * n) else S[i] for i in range(n)]
    stages = [S + S, pick(0.1), M[:half] + S[:half], M[half:] + S[half:], pick(0.9), M + M]
    out = []
    for k, stage in enumerate(stages):
        order = np.random.default_rng([seed, 11, k]).permutation(len(stage)) if k not in (0, 5) else range(len(stage))
        out.extend(Example(stage[i][0], task.response(stage[i][0], stage[i][1]), task.name,
                           task.answer(stage[i][0])) for i in order)
    return out


register_task(PartsTask())
register_task(PartsMultiverseTask())
# a short variant (2 lists of 2 digits, one operation: 34-token sequential rows) for smoke tests
register_task(PartsTask(name="parts_small", min_parts=2, max_parts=2, num_items=2, num_ops=1))
