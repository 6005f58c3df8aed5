"""Every error jaxdllm raises on purpose (the shared validators are in `jaxdllm.validation`).

Each error's message says what to change; the command line prints it as one line and exits 2.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A model, sampler or training configuration that cannot work; the message says what to change."""


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message names the file or tensor."""


class DataError(ValueError):
    """A dataset that cannot be used; the message names the file, line or example and the fix."""


class DatasetNotFoundError(DataError, FileNotFoundError):
    """A dataset file or directory that does not exist (the message names the path)."""


class TrainingError(RuntimeError):
    """Training cannot go on (a NaN loss, a checkpoint from another model)."""

