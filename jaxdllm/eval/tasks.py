"""Evaluation task adapters: which prompts to ask, how to tokenize them, how to score an answer.

An `EvalTask` turns a benchmark into `EvalItem`s (a stable id, the text, the reference) and scores
a decoded response with the benchmark's own rule. Adapters:

- `SuiteEvalTask(name)`: a task of the synthetic suite (`jaxdllm.data.tasks`) on its held-out
  split, scored by the task's checker (any valid answer counts for many-answer tasks). The
  prompt is encoded as the models of `checkpoints/` were trained (BOS + text, no chat template).
- `Gsm8kEvalTask`: GSM8K's test split in file order, 0- or k-shot, with the chat template when
  the tokenizer has one. The answer read from a response is the number after its last `####`,
  else its last number (what lm-evaluation-harness' strict and flexible GSM8K filters read),
  compared numerically to the reference.

`resolve_tasks("suite,gsm8k")` expands the names a user types: `suite` (the six digit tasks of the
model cards), `parallelbench` (the tasks where tokens committed in parallel can form an invalid
combination: any permutation, any 3 items, and `twin`, whose two answer tokens must agree), `long`
(copy, reverse and sort of 10-16 digits: answers long enough for Jacobi decoding to accept many
tokens per forward; decode them with `gen_length` 32), `gsm8k`, or any registered suite task.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from pathlib import Path

from jaxdllm.data import get_task, make_split
from jaxdllm.data.answers import final_number, same_number
from jaxdllm.data.gsm8k import default_gsm8k_dir, load_fewshot, load_gsm8k
from jaxdllm.errors import ConfigError
from jaxdllm.tokenizer import Tokenizer

SUITE = ("copy", "reverse", "sort", "add", "perm", "pick3")
PARALLELBENCH = ("perm", "pick3", "twin")
LONG = ("copy_long", "reverse_long", "sort_long")
GROUPS = {"suite": SUITE, "parallelbench": PARALLELBENCH, "long": LONG}


@dataclasses.dataclass(frozen=True)
class EvalItem:
    """One question. `id` is unique within its task and stable across runs (resume key)."""

    id: str
    prompt: str
    reference: str | None


class EvalTask(abc.ABC):
    """A benchmark as items, an encoding and a scoring rule."""

    name: str

    @abc.abstractmethod
    def items(self, n: int | None, seed: int) -> list[EvalItem]:
        """The first `n` items (None: all) of the evaluation split; deterministic per `seed`."""

    @abc.abstractmethod
    def encode(self, tokenizer: Tokenizer, item: EvalItem) -> list[int]:
        """The prompt token ids `[Lp]` the model continues."""

    def extract(self, response: str) -> str:
        """What `score` compares: the answer read from a decoded response."""
        return response.strip()

    @abc.abstractmethod
    def score(self, item: EvalItem, response: str) -> bool:
        """Whether the decoded `response` answers `item` correctly."""

    def describe(self) -> dict:
        """The settings that change this task's items or scores (part of the resume key)."""
        return {"task": self.name}


@dataclasses.dataclass(frozen=True)
class SuiteEvalTask(EvalTask):
    """A synthetic-suite task on its held-out split (`make_split(..., split="test")`)."""

    name: str

    def __post_init__(self):
        get_task(self.name)  # an unknown name lists the registered ones

    def items(self, n, seed):
        if n is None:
            raise ConfigError(f"task {self.name!r} is generated: give the number of prompts (--n)")
        return [EvalItem(e.prompt, e.prompt, e.answer) for e in make_split(self.name, n, seed, split="test")]

    def encode(self, tokenizer, item):
        return tokenizer.encode(item.prompt)

    def score(self, item, response):
        return get_task(self.name).check(item.prompt, response)


QUESTION, ANSWER = "Question: ", "\nAnswer:"


def gsm8k_answer(response: str) -> str:
    """The answer a GSM8K response gives: cut at the next `"Question:"` (a few-shot continuation),
    then the number after the last `####`, else the last number; `""` if there is none."""
    return final_number(response.split("Question:")[0]) or ""


def gsm8k_correct(response: str, reference: str | None) -> bool:
    """Whether `gsm8k_answer(response)` equals the reference number (`"18"` == `"18.00"`)."""
    return same_number(gsm8k_answer(response), reference)


@dataclasses.dataclass(frozen=True)
class Gsm8kEvalTask(EvalTask):
    """GSM8K's test split. `shots` exemplars come from the train split's first problems.

    With `chat` and a tokenizer with a chat template, each exemplar is a user/assistant turn and
    the question the last user turn (lm-eval's `--apply_chat_template --fewshot_as_multiturn`);
    otherwise the prompt is `"Question: ...\\nAnswer: ...\\n\\n" * shots + "Question: q\\nAnswer:"`
    (lm-eval's `gsm8k` task). A response is cut at the next `"Question:"` before the answer is read.
    """

    name: str = "gsm8k"
    shots: int = 0
    chat: bool = True
    path: str | None = None

    def __post_init__(self):
        if not isinstance(self.shots, int) or self.shots < 0:
            raise ConfigError(f"gsm8k shots must be an integer >= 0, got {self.shots!r}")
        self._exemplars  # too many shots fail before any model is loaded

    def items(self, n, seed):
        examples = load_gsm8k("test", self.path, limit=n)
        return [EvalItem(f"test-{i}", e.prompt, e.answer) for i, e in enumerate(examples)]

    @functools.cached_property
    def _exemplars(self) -> list[tuple[str, str]]:
        """The few-shot (question, solution) pairs, read once."""
        return [(e.prompt, e.response) for e in load_fewshot(self.shots, self.path)]

    def encode(self, tokenizer, item):
        if self.chat and tokenizer.chat_template:
            messages = []
            for question, answer in self._exemplars:
                messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            messages.append({"role": "user", "content": item.prompt})
            return tokenizer.apply_chat_template(messages, tokenize=True)
        shots = "".join(f"{QUESTION}{q}{ANSWER} {a}\n\n" for q, a in self._exemplars)
        return tokenizer.encode(f"{shots}{QUESTION}{item.prompt}{ANSWER}")

    def extract(self, response):
        return gsm8k_answer(response)

    def score(self, item, response):
        return gsm8k_correct(response, item.reference)

    def describe(self):
        path = str(Path(self.path).resolve()) if self.path else str(default_gsm8k_dir())
        return {"task": self.name, "shots": self.shots, "chat": self.chat, "path": path}


def resolve_tasks(spec: str, *, gsm8k_shots: int = 0, gsm8k_chat: bool = True,
                  gsm8k_path: str | None = None) -> list[EvalTask]:
    """`"suite,gsm8k"` -> adapters, groups expanded, duplicates dropped, order kept."""
    names = [t.strip() for t in spec.split(",") if t.strip()]
    if not names:
        raise ConfigError("--tasks is empty: name one or more tasks, e.g. --tasks suite,gsm8k")
    expanded: list[str] = []
    for name in names:
        for task in GROUPS.get(name, (name,)):
            if task not in expanded:
                expanded.append(task)
    out: list[EvalTask] = []
    for name in expanded:
        if name == "gsm8k":
            out.append(Gsm8kEvalTask(shots=gsm8k_shots, chat=gsm8k_chat, path=gsm8k_path))
        else:
            try:
                out.append(SuiteEvalTask(name))
            except ConfigError as e:
                raise ConfigError(f"{e}; or a group: {sorted(GROUPS)}, or 'gsm8k'") from None
    return out
