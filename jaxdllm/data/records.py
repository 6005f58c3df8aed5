"""The record every data module passes around: `Example`."""

from __future__ import annotations

import dataclasses

from jaxdllm.errors import DataError


@dataclasses.dataclass(frozen=True)
class Example:
    """One prompt/response pair.

    Attributes:
      prompt: the text the model is conditioned on (kept clean in SFT).
      response: a reference response (for many-answer tasks: one valid answer among many).
      task: the name of the task or dataset it comes from (`"reverse"`, `"gsm8k"`, ...).
      answer: the final answer alone where there is one (GSM8K / word problems: the number after
        `####`; single-answer digit tasks: the response); None otherwise.
    """

    prompt: str
    response: str
    task: str = ""
    answer: str | None = None

    def __post_init__(self):
        for name in ("prompt", "response", "task"):
            if not isinstance(getattr(self, name), str):
                raise DataError(f"Example.{name} must be a string, got {type(getattr(self, name)).__name__}")
        if self.answer is not None and not isinstance(self.answer, str):
            raise DataError(f"Example.answer must be a string or None, got {type(self.answer).__name__}")

    def to_dict(self) -> dict:
        """`{"prompt", "response", "task"}` plus `"answer"` when it is set (the JSONL layout)."""
        out = {"prompt": self.prompt, "response": self.response, "task": self.task}
        if self.answer is not None:
            out["answer"] = self.answer
        return out
