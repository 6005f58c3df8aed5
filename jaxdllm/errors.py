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


class OutputPathError(JaxdllmError, ValueError):
    """An output path that cannot be written (a file where a folder is expected, a read-only
    place); raised before any work starts, naming the path and the fix."""


class DeviceMemoryError(JaxdllmError, MemoryError):
    """The accelerator ran out of memory (XLA's RESOURCE_EXHAUSTED); the message gives the sizes
    XLA reported and the settings that lower them."""


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM stopped a command after it had kept its finished work
    (`kept` says what and where): the same command resumes. A `KeyboardInterrupt`, so
    `except Exception` does not swallow it."""

    def __init__(self, signum: int, kept: str = ""):
        super().__init__(f"interrupted ({kept})" if kept else "interrupted")
        self.signum, self.kept = signum, kept


class TrainingInterrupted(Interrupted):
    """SIGINT or SIGTERM stopped training between two steps, after a checkpoint of that step was
    written: the same run resumes from it."""

    def __init__(self, step: int, signum: int, saved: bool):
        super().__init__(signum, f"at step {step}" + ("; checkpoint saved" if saved else ""))
        self.step, self.saved = step, saved


def out_of_memory_message(error: BaseException, sizes: str = "") -> str | None:
    """For an XLA RESOURCE_EXHAUSTED error: one line with the allocation XLA reports, `sizes`
    (what the caller was running) and what to lower; None for any other error."""
    import re

    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text:
        return None
    found = re.search(r"allocat\w*\s+([0-9]+)\s*bytes", text)
    seen = f"an allocation of {int(found.group(1)) / 2**30:.2f} GiB failed" if found else text.strip().splitlines()[0][:160]
    return (f"the device ran out of memory ({seen}{'; ' + sizes if sizes else ''}): lower the batch size, "
            "gen_length or the prompt length, use a lower-precision dtype, or shard the model over more "
            "devices with a mesh")
