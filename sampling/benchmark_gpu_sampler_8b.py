"""The compiled dLLM sampler on an 8B-shaped random LLaDA in bf16 on one GPU, against the
memory-bandwidth floor of a decoding step (issue 3).

    python sampling/benchmark_gpu_sampler_8b.py                        # GPU: llada-8b shapes, default rows
    python sampling/benchmark_gpu_sampler_8b.py --rows all             # every row (longer)
    python sampling/benchmark_gpu_sampler_8b.py --rows llada-b1,dual-b1
    python sampling/benchmark_gpu_sampler_8b.py --size tiny --out /tmp/tiny.json   # CPU smoke run

Model: `ModelConfig.preset("llada-8b")` (bf16 params and compute), random weights created on
the device by a jitted constructor (no host copy of the ~16 GB). Sampler: `jaxdllm.generate`
(one jit holding one while_loop) with the `SAMPLER_PRESETS` settings: `llada` (low-confidence
remasking, one token per step, gen 256, block 32, steps 256), `fast-dllm-parallel` (threshold
0.9, no cache) and `fast-dllm-prefix` / `fast-dllm-dual` (threshold 0.9 with Fast-dLLM's
approximate caches).

Per row:
  * compile_s: tracing + lowering + XLA compile of the first call, summed from JAX's own
    compile events (`jax.monitoring`); first_call_s is the whole first call (compile + one run),
    which is also the warm-up;
  * steady state: median wall time of `--reps` (>= 3) further calls; `generate` returns numpy
    arrays, so each call has finished on the device when it returns;
  * tokens/s = batch * gen_length / wall; ms/step = wall / loop steps (`GenerateResult.steps`,
    one batched forward each); NFE per row and generated tokens per forward (gen_length / NFE);
  * floor: the weight bytes (counted from the parameters) / bandwidth, the time one step needs
    to read every weight once. The bandwidth is measured here (`y = 2 * x` over a large bf16
    array, read + write bytes counted); the nominal H100 SXM figure (3.35 TB/s) is reported too;
  * FLOPs of the forwards actually run (2 * matmul params * tokens, plus attention QK^T and PV
    over the keys each forward sees, plus the LM head on the block's positions) and the
    achieved TFLOP/s against a bf16 matmul measured here (8192^3).

Random weights are not confident: the threshold policies commit about one token per step
(top-1 only), so their NFE is close to gen_length; tokens per forward is reported so that is
visible. `--head-scale` multiplies the random LM head to sharpen the logits (off by default).

Writes the JSON (`--out`) after every row, so a run that is cut off keeps what it measured,
and a PNG next to it; prints a markdown table at the end.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import platform
import statistics
import sys
import time
import traceback
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# `import jaxdllm` also imports its checkpoint and tokenizer modules (safetensors, tokenizers,
# jinja2), which this benchmark never calls. A GPU box with only jax + flax + numpy +
# matplotlib lacks them: serve empty stand-ins for those three when, and only when, they are
# not installed (the finder sits last on sys.meta_path, after the real ones).
_OPTIONAL = ("safetensors", "tokenizers", "jinja2")
STUBBED: list[str] = []


class _Absent(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (Exception,), {"__module__": self.__name__})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _OPTIONAL:
            STUBBED.append(name)
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Absent(spec.name)

    def exec_module(self, module):
        pass


_STUB_FINDER = _StubFinder()
sys.meta_path.append(_STUB_FINDER)
try:
    from jaxdllm.models.config import ModelConfig  # noqa: E402
    from jaxdllm.models.transformer import Transformer  # noqa: E402
    from jaxdllm.sampler.config import SAMPLER_PRESETS  # noqa: E402
    from jaxdllm.sampler.engine import generate  # noqa: E402
finally:
    sys.meta_path.remove(_STUB_FINDER)  # later optional imports elsewhere see the truth

NOMINAL_BANDWIDTH = 3.35e12  # H100 SXM5 HBM3, bytes/s (datasheet)

# name -> (sampler preset, batch). The default set, in this order, is what fits the time budget;
# `--rows all` runs every row.
ROWS = {
    "llada-b1": ("llada", 1),
    "parallel-b1": ("fast-dllm-parallel", 1),
    "dual-b1": ("fast-dllm-dual", 1),
    "prefix-b1": ("fast-dllm-prefix", 1),
    "llada-b8": ("llada", 8),
    "dual-b8": ("fast-dllm-dual", 8),
    "parallel-b8": ("fast-dllm-parallel", 8),
    "prefix-b8": ("fast-dllm-prefix", 8),
}
DEFAULT_ROWS = ["llada-b1", "parallel-b1", "dual-b1", "prefix-b1", "llada-b8", "dual-b8"]

SIZES = {  # model preset, bandwidth-probe bytes, matmul probe n
    "8b": ("llada-8b", 4 << 30, 8192),
    "tiny": ("tiny-llada", 64 << 20, 1024),
}


# -- device probes ----------------------------------------------------------------------------
def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_bandwidth(nbytes: int, reps: int = 10) -> dict:
    """Device memory bandwidth from `y = 2 * x` on a bf16 array of `nbytes` (read + write)."""
    x = jax.jit(lambda: jnp.ones((nbytes // 2,), jnp.bfloat16))()
    f = jax.jit(lambda x: x * 2)
    jax.block_until_ready(f(x))
    t = _median_time(lambda: f(x), reps)
    moved = 2 * x.nbytes
    del x
    return {"probe": "y = 2 * x, bf16", "array_bytes": nbytes, "bytes_moved": moved, "median_s": t,
            "bytes_per_s": moved / t}


def measure_matmul_peak(n: int, reps: int = 20) -> dict:
    """bf16 [n, n] @ [n, n] (float32 accumulation, XLA default) FLOP/s: best of 3 bursts of `reps`."""
    ka, kb = jax.random.split(jax.random.PRNGKey(1))
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    b = jax.random.normal(kb, (n, n), jnp.bfloat16)
    f = jax.jit(lambda a, b: a @ b)
    jax.block_until_ready(f(a, b))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            out = f(a, b)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / reps)
    return {"n": n, "dtype": "bfloat16", "seconds": best, "flops_per_s": 2 * n ** 3 / best}


# -- model ------------------------------------------------------------------------------------
def random_model(config: ModelConfig, head_scale: float = 1.0) -> Transformer:
    """A random `Transformer` whose weights are drawn on the device inside one jit."""
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))

    @jax.jit
    def init():
        model = Transformer(config, rngs=nnx.Rngs(0))
        if head_scale != 1.0:
            head = model.lm_head if model.lm_head is not None else model.embed
            head.set_value((head[...] * head_scale).astype(head[...].dtype))
        return nnx.state(model)

    return nnx.merge(graphdef, init())


def weight_bytes(model: Transformer) -> dict:
    params = jax.tree.leaves(nnx.state(model, nnx.Param))
    dtypes = sorted({str(p.dtype) for p in params})
    return {"param_count": int(sum(p.size for p in params)), "param_bytes": int(sum(p.nbytes for p in params)),
            "embed_bytes": int(model.embed[...].nbytes), "param_dtypes": dtypes}


def forward_flops(c: ModelConfig, q: int, kv: int, logits: int) -> float:
    """FLOPs of one forward of one row: `q` query tokens, `kv` keys seen by each, LM head on
    `logits` positions (the sampler slices the block before the head)."""
    per_token = 2 * c.num_layers * (c.embed_dim * c.head_dim * (c.num_heads + 2 * c.num_kv_heads)
                                    + c.num_heads * c.head_dim * c.embed_dim + 3 * c.embed_dim * c.mlp_dim)
    attention = 4 * c.num_layers * q * kv * c.num_heads * c.head_dim
    return per_token * q + attention + 2 * c.embed_dim * c.vocab_size * logits


def run_flops(c: ModelConfig, sc, prompt_len: int, steps: int, batch: int) -> tuple[float, dict]:
    """FLOPs of a whole generation of `steps` loop iterations, with the forward shapes used.

    cache none: every step runs the canvas (T = Lp + G). dual/prefix: the first step of each
    block refreshes the cache with the full canvas, the others run the block (dual, keys T) or
    the block-and-after window of G tokens (prefix, keys T + G)."""
    G, bl, nb = sc.gen_length, sc.block_length, sc.num_blocks
    T = prompt_len + G
    if sc.cache == "none":
        shapes = {"full": (steps, T, T)}
    elif sc.cache == "dual":
        shapes = {"refresh": (nb, T, T), "cached": (steps - nb, bl, T)}
    elif sc.cache == "prefix":
        shapes = {"refresh": (nb, T, T + G), "cached": (steps - nb, G, T + G)}
    else:
        raise ValueError(f"cache {sc.cache!r} is not counted here")
    total = sum(n * forward_flops(c, q, kv, bl) for n, q, kv in shapes.values()) * batch
    return total, {k: {"forwards": n, "q_tokens_per_row": q, "kv_tokens": kv} for k, (n, q, kv) in shapes.items()}


# -- compile-time accounting ----------------------------------------------------------------------
_COMPILE_EVENTS: dict[str, float] = {}


def _on_duration(event, duration, *args, **kwargs):
    if str(event).startswith("/jax/core/compile/"):
        _COMPILE_EVENTS[event] = _COMPILE_EVENTS.get(event, 0.0) + float(duration)


try:
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    _HAVE_EVENTS = True
except Exception:  # noqa: BLE001 - the API is absent in some versions: fall back below
    _HAVE_EVENTS = False


# -- one row ------------------------------------------------------------------------------------
def run_row(name, model, args, floor_s, peak) -> dict:
    preset, batch = ROWS[name]
    sc = SAMPLER_PRESETS[preset]
    c = model.config
    rng = np.random.RandomState(0)
    # random prompt tokens below every special id (LLaDA's specials sit at the top of the vocab)
    high = min(x for x in (c.mask_token_id, c.eos_token_id, c.eot_token_id, c.pad_token_id, c.bos_token_id)
               if x is not None)
    ids = rng.randint(0, high, (batch, args.prompt_len)).astype(np.int32)
    mask = np.ones_like(ids)
    key = jax.random.PRNGKey(0)
    row = {"row": name, "preset": preset, "batch": batch, "policy": sc.policy, "cache": sc.cache,
           "threshold": sc.threshold if sc.policy == "threshold" else None, "gen_length": sc.gen_length,
           "block_length": sc.block_length, "steps_config": sc.steps if sc.policy == "llada" else None,
           "prompt_len": args.prompt_len}

    _COMPILE_EVENTS.clear()
    t0 = time.perf_counter()
    out = generate(model, ids, sc, mask, key=key)
    first = time.perf_counter() - t0
    events = dict(_COMPILE_EVENTS)
    walls = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        out = generate(model, ids, sc, mask, key=key)  # numpy results: finished on device on return
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    if _HAVE_EVENTS and events:
        compile_s, compile_source = sum(events.values()), "jax.monitoring compile events"
    else:
        compile_s, compile_source = max(first - wall, 0.0), "first call - steady wall"
    steps = int(out.steps)
    nfe = np.asarray(out.nfe)
    flops, shapes = run_flops(c, sc, args.prompt_len, steps, batch)
    ms_step = wall / steps * 1e3
    row.update(
        first_call_s=first, compile_s=compile_s, compile_source=compile_source,
        compile_events_s={k.rsplit("/", 1)[-1]: v for k, v in events.items()},
        walls_s=walls, wall_s=wall, steps=steps, nfe_mean=float(nfe.mean()), nfe_min=int(nfe.min()),
        nfe_max=int(nfe.max()), tokens_per_forward=sc.gen_length / float(nfe.mean()),
        tokens_per_s=batch * sc.gen_length / wall, ms_per_step=ms_step,
        floor_ms_per_step=floor_s * 1e3, ms_per_step_over_floor=ms_step / (floor_s * 1e3),
        flops_total=flops, flops_per_step=flops / steps, forward_shapes=shapes,
        achieved_tflops=flops / wall / 1e12, fraction_of_matmul_peak=flops / wall / peak,
        masks_left=int((out.tokens[:, -sc.gen_length:] == c.mask_token_id).sum()))
    return row


def predict_row_s(name: str, done: list, reps: int) -> float:
    """A pessimistic guess of a row's seconds from the rows already measured: the slowest compile
    so far (60 s before any) plus (reps + 1) runs, a batch-B run taken as B times the batch-1
    run of the same preset (or of any preset, cache rows being cheaper than that)."""
    preset, batch = ROWS[name]
    ok = [r for r in done if "wall_s" in r]
    compile_s = max([r["compile_s"] for r in ok], default=60.0)
    same = [r["wall_s"] / r["batch"] for r in ok if r["preset"] == preset]
    wall = batch * max(same or [r["wall_s"] / r["batch"] for r in ok] or [0.0])
    return compile_s + (reps + 1) * wall


# -- output -------------------------------------------------------------------------------------
def write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    try:
        plot(result, out.with_suffix(".png"))
    except Exception as e:  # noqa: BLE001 - a plot problem must not lose the numbers
        print(f"plot failed: {e!r}", flush=True)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if "ms_per_step" in r]
    if not rows:
        return
    names = [r["row"] for r in rows]
    x = np.arange(len(rows))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(9, 1.6 * len(rows)), 4.2))
    a1.bar(x, [r["ms_per_step"] for r in rows], color="tab:blue", label="measured ms / step")
    a1.axhline(result["floor_ms_per_step"], color="tab:red", ls="--",
               label=f"bandwidth floor {result['floor_ms_per_step']:.2f} ms "
                     f"({result['bandwidth']['bytes_per_s'] / 1e12:.2f} TB/s measured)")
    a1.axhline(result["floor_ms_per_step_nominal"], color="tab:orange", ls=":",
               label=f"floor at nominal 3.35 TB/s ({result['floor_ms_per_step_nominal']:.2f} ms)")
    for i, r in enumerate(rows):
        a1.text(i, r["ms_per_step"], f"{r['ms_per_step_over_floor']:.1f}x", ha="center", va="bottom", fontsize=8)
    a1.set_yscale("log")
    a1.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    a1.set_ylabel("ms per loop step (one batched forward)")
    a1.legend(fontsize=7)
    a2.bar(x, [r["tokens_per_s"] for r in rows], color="tab:green")
    for i, r in enumerate(rows):
        a2.text(i, r["tokens_per_s"], f"{r['tokens_per_forward']:.2f} tok/fwd\n{r['achieved_tflops']:.0f} TF/s",
                ha="center", va="bottom", fontsize=7)
    a2.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    a2.set_ylabel("generated tokens / s")
    fig.suptitle(f"jaxdllm.generate, {result['model']['preset']} random weights "
                 f"({result['weights']['param_bytes'] / 1e9:.1f} GB bf16) on {result['device']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(result: dict) -> str:
    lines = ["| row | batch | compile s | steady s | steps | NFE/row | tok/fwd | tokens/s | ms/step "
             "| floor ms | x floor | TFLOP/s | % matmul peak |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "ms_per_step" not in r:
            lines.append(f"| {r['row']} | {r['batch']} | {r.get('error', r.get('skipped', '?'))[:90]} "
                         "|  |  |  |  |  |  |  |  |  |  |")
            continue
        lines.append(
            f"| {r['row']} | {r['batch']} | {r['compile_s']:.1f} | {r['wall_s']:.2f} | {r['steps']} "
            f"| {r['nfe_mean']:.1f} | {r['tokens_per_forward']:.2f} | {r['tokens_per_s']:.1f} "
            f"| {r['ms_per_step']:.2f} | {r['floor_ms_per_step']:.2f} | {r['ms_per_step_over_floor']:.2f} "
            f"| {r['achieved_tflops']:.1f} | {100 * r['fraction_of_matmul_peak']:.0f} |")
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="8b",
                   help="8b: llada-8b shapes (GPU); tiny: tiny-llada (CPU smoke test)")
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                   help=f"comma-separated rows, or 'all'; rows: {', '.join(ROWS)}")
    p.add_argument("--out", default="sampling/results/sampler_benchmark_gpu.json", help="JSON path; PNG next to it")
    p.add_argument("--prompt-len", type=int, default=64, help="random prompt tokens (a multiple of 32: no padding)")
    p.add_argument("--reps", type=int, default=3, help="timed calls per row after the first (warm-up) call")
    p.add_argument("--attention-impl", default=None, help="override ModelConfig.attention_impl (auto|xla|pallas|reference)")
    p.add_argument("--head-scale", type=float, default=1.0,
                   help="multiply the random LM head (sharper logits: the threshold policy commits more per step)")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="skip a row when the seconds since the start plus its predicted time (slowest compile "
                        "so far + (reps + 1) runs) exceed this; skipped rows are recorded as such")
    p.add_argument("--allow-cpu", action="store_true", help="run --size 8b even without a GPU")
    args = p.parse_args(argv)
    if args.reps < 3:
        p.error("--reps must be >= 3 (median of at least three timed runs)")
    names = list(ROWS) if args.rows == "all" else [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; choose from {list(ROWS)} or 'all'")

    start = time.perf_counter()
    backend = jax.default_backend()
    if args.size == "8b" and backend == "cpu" and not args.allow_cpu:
        print("no GPU found: the 8B run needs one (use --size tiny for a CPU smoke test, or --allow-cpu)",
              file=sys.stderr)
        return 2
    dev = jax.devices()[0]
    preset, bw_bytes, mm_n = SIZES[args.size]
    overrides = dict(param_dtype="bfloat16", dtype="bfloat16")
    if args.attention_impl:
        overrides["attention_impl"] = args.attention_impl
    config = ModelConfig.preset(preset, **overrides)
    print(f"device {dev.device_kind} ({backend}), jax {jax.version.__version__}; model {preset} bf16"
          + (f"; stand-ins for missing optional modules: {sorted(set(STUBBED))}" if STUBBED else ""), flush=True)

    # Probes first, while the device memory is free.
    bandwidth = measure_bandwidth(bw_bytes)
    print(f"bandwidth: {bandwidth['bytes_per_s'] / 1e12:.3f} TB/s measured "
          f"({bw_bytes / 2**30:.2f} GiB bf16, y = 2x, read + write), nominal {NOMINAL_BANDWIDTH / 1e12:.2f} TB/s",
          flush=True)
    peak = measure_matmul_peak(mm_n)
    print(f"bf16 matmul {mm_n}^3: {peak['flops_per_s'] / 1e12:.1f} TFLOP/s", flush=True)

    t0 = time.perf_counter()
    model = random_model(config, args.head_scale)
    jax.block_until_ready(nnx.state(model))
    init_s = time.perf_counter() - t0
    w = weight_bytes(model)
    floor_s = w["param_bytes"] / bandwidth["bytes_per_s"]
    print(f"model: {w['param_count'] / 1e9:.3f}B params, {w['param_bytes'] / 1e9:.2f} GB {w['param_dtypes']}, "
          f"initialised on device in {init_s:.1f} s; floor {floor_s * 1e3:.2f} ms/step "
          f"({w['param_bytes'] / NOMINAL_BANDWIDTH * 1e3:.2f} ms at nominal)", flush=True)

    import flax

    result = {
        "issue": "3: 8B-shaped random model in bf16 on a GPU; tokens/s and ms per step vs the bandwidth floor",
        "device": dev.device_kind, "backend": backend, "jax": jax.version.__version__, "flax": flax.__version__,
        "python": platform.python_version(), "stubbed_optional_modules": sorted(set(STUBBED)),
        "model": {"preset": preset, "param_dtype": config.param_dtype, "dtype": config.dtype,
                  "attention_impl": config.attention_impl, "head_scale": args.head_scale,
                  "num_layers": config.num_layers, "embed_dim": config.embed_dim, "mlp_dim": config.mlp_dim,
                  "vocab_size": config.vocab_size, "init_s": init_s},
        "weights": w,
        "bandwidth": bandwidth, "nominal_bandwidth_bytes_per_s": NOMINAL_BANDWIDTH,
        "floor_ms_per_step": floor_s * 1e3,
        "floor_ms_per_step_nominal": w["param_bytes"] / NOMINAL_BANDWIDTH * 1e3,
        "floor_ms_per_step_without_embedding": (w["param_bytes"] - w["embed_bytes"]) / bandwidth["bytes_per_s"] * 1e3,
        "matmul_peak": peak,
        "reps": args.reps,
        "notes": [
            "Random weights are not confident: the threshold policies commit ~1 token per step (top-1 only), "
            "so their NFE is ~gen_length and tokens_per_forward ~1; real checkpoints commit several per step.",
            "floor = all parameter bytes / measured bandwidth (one read of every weight per step); the embedding "
            "table is only gathered, so floor_ms_per_step_without_embedding is the tighter bound.",
            "compile_s = trace + lower + XLA compile of the first call (jax.monitoring events); the first call "
            "is the warm-up; wall_s = median of the timed calls.",
            "FLOPs: 2 * matmul params * tokens + attention (4 * layers * q * kv * heads * head_dim over every key "
            "a forward sees) + LM head on the block's positions; the cached steps of prefix/dual run fewer tokens.",
        ],
        "rows": [],
    }
    out = Path(args.out)
    if not out.is_absolute():
        out = Path.cwd() / out
    write(result, out)

    for name in names:
        elapsed = time.perf_counter() - start
        guess = predict_row_s(name, result["rows"], args.reps)
        if elapsed + guess > args.budget_s:
            row = {"row": name, "preset": ROWS[name][0], "batch": ROWS[name][1],
                   "skipped": f"time budget: {elapsed:.0f} s elapsed + ~{guess:.0f} s predicted "
                              f"> --budget-s {args.budget_s:.0f}"}
            print(f"[{elapsed:6.1f} s] {name}: skipped ({row['skipped']})", flush=True)
        else:
            print(f"[{elapsed:6.1f} s] {name} ...", flush=True)
            try:
                row = run_row(name, model, args, floor_s, peak["flops_per_s"])
            except Exception as e:  # noqa: BLE001 - record it and go on with the next row
                traceback.print_exc()
                row = {"row": name, "preset": ROWS[name][0], "batch": ROWS[name][1],
                       "error": f"{type(e).__name__}: {str(e)[:600]}"}
        result["rows"].append(row)
        result["elapsed_s"] = time.perf_counter() - start
        write(result, out)
        print(json.dumps({k: v for k, v in row.items() if k not in ("forward_shapes", "compile_events_s", "walls_s")}),
              flush=True)

    print(f"\nwrote {out} and {out.with_suffix('.png')} ({time.perf_counter() - start:.0f} s in all)\n")
    print(f"{result['device']}: {preset} bf16 random weights, {w['param_bytes'] / 1e9:.2f} GB; bandwidth "
          f"{bandwidth['bytes_per_s'] / 1e12:.2f} TB/s measured ({NOMINAL_BANDWIDTH / 1e12:.2f} nominal) -> floor "
          f"{floor_s * 1e3:.2f} ms/step; bf16 matmul {peak['flops_per_s'] / 1e12:.0f} TFLOP/s; prompt "
          f"{args.prompt_len}, gen 256, block 32\n")
    print(table(result))
    print("\nRandom weights: the threshold rows commit ~1 token per forward (see tok/fwd); "
          "real checkpoints commit several.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
