"""Read and write prompt/response datasets as JSONL, one `{"prompt", "response", "task"}` per line.

A malformed line (bad JSON, not an object, a missing or non-string field) is reported as
`file:line: reason`. `JsonlConfig(on_error="raise")` (the default) stops at the first one with a
`DataError`; `on_error="skip"` leaves it out, counts it in `JsonlDataset.skipped` and warns once
per file with the count and the first line numbers. Blank lines are ignored. A missing file
raises `DatasetNotFoundError` naming the path.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import Iterable, Iterator, Literal

from jaxdllm.data.records import Example
from jaxdllm.errors import ConfigError, DataError, DatasetNotFoundError
from jaxdllm.validation import check_fields

ON_ERROR = ("raise", "skip")


@dataclasses.dataclass(frozen=True)
class JsonlConfig:
    """How to read a JSONL dataset.

    Attributes:
      on_error: `"raise"` stops at the first malformed line; `"skip"` skips it with a warning.
      prompt_key, response_key: the fields holding the prompt and the response.
      task_key: the field holding the task name (optional in the file).
      answer_key: the field holding the final answer (optional in the file).
      default_task: the task name for lines without `task_key`.
    """

    on_error: Literal["raise", "skip"] = "raise"
    prompt_key: str = "prompt"
    response_key: str = "response"
    task_key: str = "task"
    answer_key: str = "answer"
    default_task: str = ""

    def __post_init__(self):
        check_fields(self, "JsonlConfig.")
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"JsonlConfig.on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        for name in ("prompt_key", "response_key", "task_key", "answer_key"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"JsonlConfig.{name} must be a non-empty string, got {getattr(self, name)!r}")
        if self.prompt_key == self.response_key:
            raise ConfigError(f"JsonlConfig.prompt_key and response_key are both {self.prompt_key!r}")


@dataclasses.dataclass
class JsonlDataset:
    """The records read from one file, and the lines skipped as `(line number, reason)`."""

    path: Path
    records: list[Example]
    skipped: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index):
        return self.records[index]

    def __iter__(self) -> Iterator[Example]:
        return iter(self.records)


def parse_line(line: str, config: JsonlConfig) -> Example:
    """One record from the text of one line; raises `ValueError` with the reason (no file/line)."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(data, dict):
        raise DataError(f"expected a JSON object, got {type(data).__name__}")
    for key in (config.prompt_key, config.response_key):
        if key not in data:
            raise DataError(f"missing field {key!r} (fields: {sorted(data)})")
        if not isinstance(data[key], str):
            raise DataError(f"field {key!r} must be a string, got {type(data[key]).__name__}")
    task = data.get(config.task_key, config.default_task)
    answer = data.get(config.answer_key)
    if not isinstance(task, str):
        raise DataError(f"field {config.task_key!r} must be a string, got {type(task).__name__}")
    if answer is not None and not isinstance(answer, (str, int, float)):
        raise DataError(f"field {config.answer_key!r} must be a string or number, got {type(answer).__name__}")
    return Example(data[config.prompt_key], data[config.response_key], task,
                   None if answer is None else str(answer))


def iter_jsonl_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """`(line number, text)` for each non-blank line of `path` (1-based line numbers)."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise DatasetNotFoundError(f"dataset file {path} {what}")
    with path.open(encoding="utf-8") as f:
        try:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    yield number, line
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not UTF-8 text ({e})") from None


def read_jsonl(path: str | os.PathLike, config: JsonlConfig | None = None) -> JsonlDataset:
    """Every record of the JSONL file `path` (see the module docstring for errors and skipping)."""
    config = config or JsonlConfig()
    path = Path(path)
    records, skipped = [], []
    for number, line in iter_jsonl_lines(path):
        try:
            records.append(parse_line(line, config))
        except ValueError as e:  # DataError is a ValueError
            if config.on_error == "raise":
                raise DataError(f"{path}:{number}: {e} (to skip malformed lines: on_error = \"skip\" in the "
                                "recipe's [data] section, or JsonlConfig(on_error='skip'))") from None
            skipped.append((number, str(e)))
    if skipped:
        first = ", ".join(str(n) for n, _ in skipped[:5]) + (", ..." if len(skipped) > 5 else "")
        warnings.warn(f"{path}: skipped {len(skipped)} malformed line(s) (lines {first}); "
                      f"first: {skipped[0][1]}", stacklevel=2)
    if not records:
        what = f"all {len(skipped)} of its lines are malformed" if skipped else "it is empty"
        raise DataError(f"{path} holds no records: {what}")
    return JsonlDataset(path, records, skipped)


def write_jsonl(path: str | os.PathLike, records: Iterable[Example | dict]) -> Path:
    """Write `records` (Examples or dicts) to `path`, one JSON object per line; returns the path.

    Parent directories are created. Non-ASCII text is written as is (UTF-8).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for record in records:
            data = record.to_dict() if isinstance(record, Example) else dict(record)
            f.write(json.dumps(data, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path
