"""The GSM8K train/test files (`{"question", "answer"}` JSONL, answers ending in `#### <number>`).

`load_gsm8k(split, path)` returns `Example(prompt=question, response=worked solution,
task="gsm8k", answer=<final number>)`. By default the calculator annotations `<<48/2=24>>` are
removed from the solution (they are tool calls, not text a model should learn to write). The
directory is `path`, else the `JAXDLLM_GSM8K_DIR` environment variable, else
`../shared/data/gsm8k` next to a source checkout when it exists, else the copy of the test split
shipped in `jaxdllm/data/gsm8k_files/` (MIT, OpenAI; its `train_fewshot.jsonl` holds the train
split's first 8 problems for few-shot prompts); a missing directory or file raises
`DatasetNotFoundError` naming the path. Malformed lines are reported with their line
number (see `jsonl.py`; `on_error="skip"` skips them).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from jaxdllm.data.answers import extract_final_answer
from jaxdllm.data.jsonl import JsonlConfig, iter_jsonl_lines, parse_line
from jaxdllm.data.records import Example
from jaxdllm.errors import ConfigError, DataError, DatasetNotFoundError

ENV_VAR = "JAXDLLM_GSM8K_DIR"
SPLITS = ("train", "test")
_CALCULATOR = re.compile(r"<<[^<>]*>>")


SHIPPED_DIR = Path(__file__).resolve().parent / "gsm8k_files"  # test split + 8 few-shot problems


def default_gsm8k_dir() -> Path:
    """`$JAXDLLM_GSM8K_DIR`, else `<repository>/../shared/data/gsm8k` if it exists, else `SHIPPED_DIR`."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    beside = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
    return beside if beside.is_dir() else SHIPPED_DIR


def load_fewshot(k: int, path: str | os.PathLike | None = None) -> list[Example]:
    """The first `k` problems of the train split (`<path>/train.jsonl`, else the 8 shipped ones),
    the exemplars of a k-shot prompt."""
    if not isinstance(k, int) or k < 0:
        raise ConfigError(f"the number of few-shot examples must be an integer >= 0, got {k!r}")
    directory = Path(path) if path is not None else default_gsm8k_dir()
    if not (directory / "train.jsonl").is_file():
        directory = SHIPPED_DIR
        available = len((directory / "train_fewshot.jsonl").read_text().splitlines())
        if k > available:
            raise ConfigError(f"{k}-shot needs {k} train problems; only {available} are shipped: "
                              f"pass a GSM8K directory with train.jsonl (or set ${ENV_VAR})")
        return _read(directory / "train_fewshot.jsonl", limit=k)
    return load_gsm8k("train", directory, limit=k)


def strip_calculator(text: str) -> str:
    """Remove GSM8K calculator annotations: `"48/2 = <<48/2=24>>24"` -> `"48/2 = 24"`."""
    return _CALCULATOR.sub("", text)


def load_gsm8k(split: str = "test", path: str | os.PathLike | None = None, *, limit: int | None = None,
               keep_calculator: bool = False, on_error: str = "raise") -> list[Example]:
    """GSM8K `split` (`"train"` or `"test"`) from directory `path` as `Example`s, in file order.

    Args:
      split: which file, `<path>/<split>.jsonl`.
      path: the directory (default: `default_gsm8k_dir()`).
      limit: read only the first `limit` records.
      keep_calculator: keep the `<<...>>` annotations in the responses.
      on_error: `"raise"` or `"skip"` for malformed lines, as in `JsonlConfig`. A line whose
        answer has no `#### <number>` is malformed.
    """
    if split not in SPLITS:
        raise ConfigError(f"GSM8K split must be one of {SPLITS}, got {split!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ConfigError(f"limit must be a non-negative integer or None, got {limit!r}")
    JsonlConfig(on_error=on_error)  # a bad on_error fails before any file is read
    directory = Path(path) if path is not None else default_gsm8k_dir()
    if not directory.is_dir():
        raise DatasetNotFoundError(
            f"GSM8K directory {directory} does not exist; pass path=... or set ${ENV_VAR}")
    return _read(directory / f"{split}.jsonl", limit=limit, keep_calculator=keep_calculator, on_error=on_error)


def _read(file: Path, *, limit: int | None = None, keep_calculator: bool = False,
          on_error: str = "raise") -> list[Example]:
    config = JsonlConfig(on_error=on_error, prompt_key="question", response_key="answer",
                         default_task="gsm8k")
    out, skipped = [], 0
    for number, line in iter_jsonl_lines(file):
        if limit is not None and len(out) >= limit:
            break
        try:
            record = parse_line(line, config)
            answer = extract_final_answer(record.response)
            if answer is None:
                raise DataError("the answer has no '#### <number>' line")
        except ValueError as e:
            if config.on_error == "raise":
                raise DataError(f"{file}:{number}: {e}") from None
            skipped += 1
            continue
        response = record.response if keep_calculator else strip_calculator(record.response)
        out.append(Example(record.prompt, response, "gsm8k", answer))
    if skipped:
        warnings.warn(f"{file}: skipped {skipped} malformed line(s)", stacklevel=3)
    return out
