"""SIGINT and SIGTERM for long commands: finished work is written whole, and a stop says so.

`deferred_signals` notes the signals so a loop can stop between two steps (training).
`stop_between_batches` does the same for batch loops (eval, teacher answers), with a second
Ctrl-C to stop at once. `terminate_as_interrupt` turns SIGTERM into `Interrupted` elsewhere, so a
`finally` or an `except KeyboardInterrupt` runs on `kill` as on Ctrl-C. Handlers can only be installed from the
main thread; elsewhere these leave signals as they are.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

from jaxdllm.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _handling(handler, signals=SIGNALS):
    """`handler` for `signals` inside the block (main thread only), the previous ones after it."""
    if not _main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in signals}
    for s in signals:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, handler_before in previous.items():
            signal.signal(s, handler_before)


@contextlib.contextmanager
def deferred_signals():
    """Yields a list that collects the SIGINT/SIGTERM numbers received inside the block (which
    are not acted on); a second Ctrl-C changes nothing."""
    caught: list[int] = []
    with _handling(lambda signum, frame: caught.append(signum)):
        yield caught


class StopRequest:
    """Set by the first SIGINT/SIGTERM inside `stop_between_batches`; a batch loop calls `check()`
    after each finished batch."""

    def __init__(self):
        self.signum: int | None = None

    def check(self) -> None:
        """Raise `Interrupted` if a stop was asked for."""
        from jaxdllm.distributed import agree_any

        # In a multi-process job every process stops after the same batch (a collective: each calls
        # `check` after each batch), also those the signal did not reach.
        if agree_any(self.signum is not None):
            raise Interrupted(self.signum or signal.SIGTERM)


@contextlib.contextmanager
def stop_between_batches(notice: str = "stopping after the batch in progress (press Ctrl-C again to stop now)"):
    """Yields a `StopRequest`. The first SIGINT/SIGTERM only sets it (and prints `notice` on
    stderr), so the batch in progress finishes and is written whole; a second one interrupts at
    once. (A KeyboardInterrupt raised at an arbitrary point can land in a garbage-collection
    callback, where Python ignores it: a flag read between batches cannot be lost.)"""
    request = StopRequest()

    def handler(signum, frame):
        if request.signum is not None:
            raise Interrupted(signum)
        request.signum = signum
        print(notice, file=sys.stderr, flush=True)

    with _handling(handler):
        yield request


@contextlib.contextmanager
def terminate_as_interrupt():
    """Inside the block SIGTERM raises `Interrupted(SIGTERM)` (and Ctrl-C its usual
    `KeyboardInterrupt`)."""
    def stop(signum, frame):
        raise Interrupted(signum)

    with _handling(stop, (signal.SIGTERM,)):
        yield


def signal_number(interrupt: BaseException) -> int:
    """The signal behind a `KeyboardInterrupt` (SIGINT unless it is an `Interrupted`)."""
    return getattr(interrupt, "signum", signal.SIGINT)
