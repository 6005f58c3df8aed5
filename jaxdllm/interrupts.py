"""SIGINT and SIGTERM for long commands: finished work is written whole, and a stop says so.

`deferred_signals` notes the signals so a loop can stop between two steps (training).
`held_signals` lets one write finish and then delivers a signal that came during it (an append
of results). `terminate_as_interrupt` turns SIGTERM into `Interrupted`, so a `finally` or an
`except KeyboardInterrupt` runs on `kill` as on Ctrl-C. Handlers can only be installed from the
main thread; elsewhere these leave signals as they are.
"""

from __future__ import annotations

import contextlib
import signal
import threading

from jaxdllm.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def deferred_signals():
    """Yields a list that collects the SIGINT/SIGTERM numbers received inside the block (which
    are not acted on); a second Ctrl-C changes nothing."""
    caught: list[int] = []
    if not _main_thread():
        yield caught
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def held_signals():
    """Run the block whole (a file write); a SIGINT/SIGTERM received meanwhile is delivered after
    it, to the handler that was there before."""
    with deferred_signals() as caught:
        yield
    if caught:
        signal.raise_signal(caught[0])


@contextlib.contextmanager
def terminate_as_interrupt():
    """Inside the block SIGTERM raises `Interrupted(SIGTERM)` (and Ctrl-C its usual
    `KeyboardInterrupt`)."""
    if not _main_thread():
        yield
        return

    def stop(signum, frame):
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def signal_number(interrupt: BaseException) -> int:
    """The signal behind a `KeyboardInterrupt` (SIGINT unless it is an `Interrupted`)."""
    return getattr(interrupt, "signum", signal.SIGINT)
