"""PLACEHOLDER: the engine is being written; its public surface is fixed below."""

from __future__ import annotations

from typing import Callable

from jaxdllm.serving.requests import Event, Request


class Engine:
    """Row slots over the stepwise driver (see the final docstring when it lands).

    Args:
      model: a `Transformer`; tokenizer: its `Tokenizer` (incremental detokenisation, stop strings).
      slots: rows of one compiled program (per config and prompt shape bucket).
      max_queue: requests waiting for a row, at most (beyond: `QueueFull`).
      policy_params / companions: as for `generate` (a policy's own parameters or second model).
    """

    def __init__(self, model, tokenizer, *, slots: int = 8, max_queue: int = 64, steps_per_dispatch: int = 4,
                 policy_params=None, companions=None):
        raise NotImplementedError

    def check(self, request: Request) -> None:
        """Raise `InputError`/`ConfigError` (a message naming the limit) if `request` cannot decode."""

    def submit(self, request: Request, on_event: Callable[[Event], None]) -> None:
        """Queue `request`; `on_event` is called from the engine's thread with each `Event` (the last has
        `finished=True`). Raises `InputError`/`ConfigError` (bad request), `QueueFull`, `EngineStopped`."""

    def cancel(self, request_id: str) -> None:
        """Drop a waiting request or free a running one's row now (its last event: finish_reason "cancelled")."""

    def start(self) -> None:
        """Run the scheduling loop in a background thread."""

    def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop taking requests; with `drain`, finish the running and waiting ones first (up to `timeout` s;
        the rest end with finish_reason "error"); then stop the thread."""

    def run_until_idle(self) -> None:
        """Drive the loop from the caller's thread until nothing waits or runs (no thread needed)."""

    def stats(self) -> dict:
        """`{"running", "waiting", "programs" (compiled step programs), "compiles", ...}`."""
