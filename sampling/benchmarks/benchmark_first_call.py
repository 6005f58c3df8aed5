"""First-call time of a generation with and without JAX's persistent compilation cache, each in a
fresh process: what a user's next `jaxdllm generate`, or a notebook after a restart, waits for.

    python -m sampling.benchmarks.benchmark_first_call                       # GPU: llada-8b shapes, bf16
    python -m sampling.benchmarks.benchmark_first_call --size tiny --presets llada fast-dllm-dual   # CPU

(run from the repository root.) Per preset, three fresh processes on the same random weights and
prompts (batch `--batch`, prompt 64 and G 256 at 8b; prompt 16 and G 64 at small and tiny):

* `off`: `JAXDLLM_COMPILATION_CACHE=off`, so the loop compiles;
* `cold`: an empty cache folder, so it compiles and is written;
* `warm`: the same folder again, so it is loaded.

Each process turns the cache on as the command line does (`jaxdllm.enable_compilation_cache`),
makes the weights (not timed), then times the first `Sampler(model)(ids, config)` call (compile
or load, plus one generation) and a second call (the generation alone), and counts JAX's
persistent-cache hits and misses. `first_minus_second_s` is the compile (off, cold) or load
(warm) time plus first-call overheads. JAX's own cache settings in the environment
(`JAX_COMPILATION_CACHE_DIR`) are dropped for the three processes, and every program is
written whatever its compile time (`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0`; the command
line keeps JAX's 1-s default, which every 8B loop exceeds).

Writes `<out>.json` (default `sampling/results/first_call_<device>.json`, device `cpu` or the
GPU's kind) and `<out>.png`.
"""

from __future__ import annotations

from jaxdllm.extras import exit_if_missing
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = ("off", "cold", "warm")


def child(size: str, preset: str, batch: int) -> dict:
    """One fresh process's measurement (see the module docstring); returns the row."""
    import collections

    import jax

    events = collections.Counter()
    jax.monitoring.register_event_listener(lambda name, **kw: events.update([name]))
    import numpy as np

    import jaxdllm
    from jaxdllm.decoding import SamplerConfig
    from sampling.benchmarks.profile_sampler import build_model
    from sampling.benchmarks.report import device_facts
    from sampling.benchmarks.timing import timed

    folder = jaxdllm.enable_compilation_cache()
    lp, gen = (64, 256) if size == "8b" else (16, 64)
    model = build_model(size, None)
    cfg = SamplerConfig.preset(preset, gen_length=gen, steps=gen, prompt_bucket=lp)
    ids = np.random.default_rng(0).integers(0, model.config.mask_token_id - 4, (batch, lp)).astype(np.int32)
    sampler = jaxdllm.Sampler(model)
    t = timed(lambda: sampler(ids, cfg), repeats=1)  # the first call, then the second
    first, second = t.first_s, t.min_s
    return dict(first_call_s=first, second_call_s=second, first_minus_second_s=first - second,
                cache_hits=events["/jax/compilation_cache/cache_hits"],
                cache_misses=events["/jax/compilation_cache/cache_misses"],
                cache_folder=None if folder is None else str(folder), device=jax.devices()[0].device_kind,
                facts=device_facts())


def run_mode(mode: str, folder: Path, args, preset: str) -> dict:
    """Run `child` for `preset` in a fresh interpreter with the cache `mode` (folder: cold/warm)."""
    env = dict(os.environ, JAXDLLM_COMPILATION_CACHE="off" if mode == "off" else str(folder),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")  # small loops compile in about a second
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # JAX's own folder would win over the mode's
    cmd = [sys.executable, "-m", "sampling.benchmarks.benchmark_first_call", "--child", "--size", args.size,
           "--presets", preset, "--batch", str(args.batch)]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2],
                             timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {args.timeout} s"}
    if out.returncode:
        return {"error": out.stderr[-1500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.benchmark_first_call")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["8b", "small", "tiny"], default="8b")
    p.add_argument("--presets", nargs="*", default=["llada", "fast-dllm-prefix", "fast-dllm-dual", "dparallel"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--out", default=None)
    p.add_argument("--timeout", type=float, default=900, help="seconds per process")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from sampling.benchmarks.report import kind_slug, write_report

    if args.child:
        print(json.dumps(child(args.size, args.presets[0], args.batch)), flush=True)
        return 0

    rows = []
    out, facts = None, {}
    for preset in args.presets:
        with tempfile.TemporaryDirectory() as tmp:
            row = dict(preset=preset, batch=args.batch, size=args.size)
            for mode in MODES:
                row[mode] = run_mode(mode, Path(tmp) / "xla", args, preset)
                facts = row[mode].pop("facts", None) or facts
                print(f"{preset} {mode}: {json.dumps(row[mode])}", flush=True)
        rows.append(row)
        # the device as the children saw it: this process never starts a backend (on a GPU it would
        # hold memory the children need)
        kind = next((row[m]["device"] for m in MODES if "device" in row[m]), "unknown")
        out = Path(args.out or f"sampling/results/first_call_{kind_slug(kind)}")
        result = dict(size=args.size, batch=args.batch, modes=MODES, rows=rows)
        write_report(out, result, facts=facts)
    write_report(out, result, lambda r, path: plot(r["rows"], path), facts=facts)
    return 0


def plot(rows: list, path: Path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(rows)), 3.6))
    for i, mode in enumerate(MODES):
        ax.bar(x + (i - 1) * 0.27, [r[mode].get("first_call_s", np.nan) for r in rows], 0.27,
               label={"off": "cache off", "cold": "cache empty (compile + write)", "warm": "cache warm (load)"}[mode])
    ax.set_xticks(x, [r["preset"] for r in rows], fontsize=8)
    ax.set_ylabel("first call, s (compile or load + one generation)")
    ax.legend(fontsize=8)
    ax.set_title(f"First generation in a fresh process ({rows[0]['size']}, batch {rows[0]['batch']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
