"""The one writer of benchmark results: `<out>.json` with the facts of the machine that measured
them, and `<out>.png` beside it.

    write_report("sampling/results/thing_cpu", result, plot)   # thing_cpu.json + thing_cpu.png

Scripts that write after every row call it with `plot=None` per row, then once with the plot.
"""

from __future__ import annotations

import json
import os
import platform as _platform
import re
from pathlib import Path
from typing import Callable


def device_facts() -> dict:
    """Where the numbers come from: `device` (JAX's `device_kind` of the first device: `cpu`,
    `NVIDIA H100 80GB HBM3`, `TPU v5 lite`), `platform` (`cpu`, `gpu`, `tpu`), `device_count`,
    `jax` and `jaxlib` versions, `python`, `cpu_count` (logical host CPUs) and `cpu_affinity` (those
    this process may run on). Starts JAX's backend."""
    import jax
    import jaxlib

    devices = jax.devices()
    return dict(device=devices[0].device_kind, platform=devices[0].platform, device_count=len(devices),
                jax=jax.__version__, jaxlib=jaxlib.__version__, python=_platform.python_version(),
                cpu_count=os.cpu_count(),
                cpu_affinity=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())


def torch_facts() -> dict:
    """`torch` version and `torch_threads` (intra-op threads) for the scripts that run torch."""
    import torch

    return dict(torch=torch.__version__, torch_threads=torch.get_num_threads())


def kind_slug(device_kind: str) -> str:
    """A device kind as a file-name part: `cpu`, `nvidia_h100_80gb_hbm3`."""
    return re.sub(r"[^a-z0-9]+", "_", device_kind.lower()).strip("_")


def write_report(out: str | Path, result: dict, plot: Callable[[dict, Path], None] | None = None, *,
                 facts: dict | None = None, quiet: bool = False) -> dict:
    """Write `<out>.json` (`facts`, default `device_facts()`, then `result`'s keys, which win) and,
    with `plot`, `<out>.png` as `plot(data, path)` draws it. `out` is a path stem (a `.json` or
    `.png` suffix is dropped). Creates the folder. Returns `data`, the dict written (facts and result; its values
    are `result`'s own objects, so a row appended to `result["rows"]` is in it too).

    `facts`: pass them when this process must not start a backend (they came from a child)."""
    out = Path(out)
    stem = out.with_suffix("") if out.suffix in (".json", ".png") else out
    json_path, png_path = Path(f"{stem}.json"), Path(f"{stem}.png")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    data = {**(device_facts() if facts is None else facts), **result}
    json_path.write_text(json.dumps(data, indent=1))
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        plot(data, png_path)
        plt.close("all")  # a script writing several reports must not keep every figure open
        if not quiet:
            print(f"wrote {json_path} and {png_path}", flush=True)
    return data
