"""The one wall-clock timer of the benchmarks: warm-up calls, then timed repeats.

    t = timed(lambda: jaxdllm.generate(model, ids, config), repeats=3)
    t.first_s, t.min_s, t.median_s, t.out
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

import jax


@dataclasses.dataclass(frozen=True)
class Timing:
    """What `timed` measured.

    first_s: the first warm-up call (compile plus one run; None without warm-up).
    samples_s: seconds per call of each timed repeat, in order.
    out: the last call's output.
    """

    first_s: float | None
    samples_s: tuple[float, ...]
    out: Any

    @property
    def min_s(self) -> float:
        return min(self.samples_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)


def timed(fn: Callable[[], Any], *, warmup: int = 1, repeats: int = 3, iters: int = 1,
          sync: Callable[[Any], Any] = jax.block_until_ready) -> Timing:
    """Call `fn()` `warmup` times untimed (the first one clocked as `first_s`), then take `repeats`
    samples of `iters` back-to-back calls each, per call.

    `sync(out)` runs before each clock stops, so asynchronously dispatched work is counted: JAX
    arrays in the output are waited for by default (anything else passes through untouched); for
    torch on a GPU pass `lambda out: torch.cuda.synchronize()`. Within a sample only the last
    output is waited for, so `iters > 1` keeps the device busy between calls (dispatch pipelined).
    """
    if repeats < 1 or iters < 1:
        raise ValueError(f"timed needs repeats >= 1 and iters >= 1, got {repeats} and {iters}")
    first, out = None, None
    for i in range(warmup):
        t0 = time.perf_counter()
        out = fn()
        sync(out)
        if i == 0:
            first = time.perf_counter() - t0
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            out = fn()
        sync(out)
        samples.append((time.perf_counter() - t0) / iters)
    return Timing(first, tuple(samples), out)
