"""Every error jaxdllm raises on purpose (the shared validators are in `jaxdllm.validation`).

All of them derive from `JaxdllmError` and from the built-in type they replace (`ValueError`,
`TypeError`, `RuntimeError`), so `except ValueError` keeps working. Each message says what was
seen and what to change; the command line prints it as one line and exits 2 (`--debug` shows the
traceback).
"""

from __future__ import annotations


class JaxdllmError(Exception):
    """Base of every error a user's input or environment can cause; the command line catches it."""


class ConfigError(JaxdllmError, ValueError):
    """A model, sampler or training configuration that cannot work; the message says what to change."""


class ConfigTypeError(JaxdllmError, TypeError):
    """An argument of the wrong type (a dict where a `SamplerConfig` is expected, ...)."""


class InputError(JaxdllmError, ValueError):
    """Arrays passed to the library that cannot be used as given (shapes, dtypes, ids outside the
    vocabulary, empty attention-mask rows); the message names the row or value."""


class CheckpointError(JaxdllmError, ValueError):
    """A checkpoint directory that cannot be loaded; the message names the file or tensor."""


class DataError(JaxdllmError, ValueError):
    """A dataset that cannot be used; the message names the file, line or example and the fix."""


class DatasetNotFoundError(DataError, FileNotFoundError):
    """A dataset file or directory that does not exist (the message names the path)."""


class TrainingError(JaxdllmError, RuntimeError):
    """Training cannot go on (a NaN loss, a checkpoint from another model)."""


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped training between two steps, after a checkpoint of that step was
    written: the same run resumes from it. A `KeyboardInterrupt`, so `except Exception` does not
    swallow it."""

    def __init__(self, step: int, signum: int, saved: bool):
        super().__init__(f"interrupted at step {step}")
        self.step, self.signum, self.saved = step, signum, saved
