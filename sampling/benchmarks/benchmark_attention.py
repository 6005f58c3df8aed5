"""Attention benchmark: the tile-skipping Pallas kernel against `jax.nn.dot_product_attention`.

    python -m sampling.benchmarks.benchmark_attention                     # GPU: 2k-8k, head_dim 128
    python -m sampling.benchmarks.benchmark_attention --size tiny         # CPU smoke run (interpret mode)
    python -m sampling.benchmarks.benchmark_attention --impls splash xla  # TPU: JAX's splash kernel against XLA

For each mask (dense, causal, block diffusion `[x_t; x_0]`, Jacobi-Forcing), length and pass
(forward, forward+backward) it times `pallas` (this package's GPU kernel), `splash` (JAX's TPU
kernel as this package wraps it), `xla` and `cudnn`
(`jax.nn.dot_product_attention(implementation=...)`; cuDNN gets `is_causal` for the causal
mask and a dense boolean mask otherwise, which it applies as a bias). It reports ms, TFLOP/s
of useful work (only visible query/key pairs count: 4*D FLOPs per pair forward, 3.5x that for
forward+backward, the FlashAttention-2 convention), speed-up over cuDNN and the fraction of
tiles the kernel skips. `--check` first compares outputs and gradients with the float32
reference on every mask kind. Results go to `<out>.json` after every row and `<out>.png`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxdllm.extras import exit_if_missing
from jaxdllm.attention import MaskSpec, tiles
from jaxdllm.attention.tpu_splash import splash_attention
from jaxdllm.attention.triton_flash import BlockSizes, flash_attention
from jaxdllm.attention.reference import reference_attention
from sampling.benchmarks.report import write_report
from sampling.benchmarks.timing import timed


def make_mask(name: str, length: int, block: int) -> MaskSpec:
    """The benchmark's masks at one length (queries and keys of the same length)."""
    if name == "dense":
        return MaskSpec()
    if name == "causal":
        return MaskSpec(kind="causal")
    if name == "block_diffusion":
        return MaskSpec(kind="block_diffusion", block_size=block)
    if name == "jacobi_forcing":
        return MaskSpec(kind="jacobi_forcing", block_size=block, prefix_len=length // 8)
    raise ValueError(f"unknown mask {name!r}")


def attention_fn(impl: str, mask_name: str, mask: MaskSpec, blocks: BlockSizes, interpret: bool):
    """`f(q, k, v) -> out` for one implementation."""
    if impl == "pallas":
        return lambda q, k, v: flash_attention(q, k, v, mask, block_sizes=blocks, interpret=interpret)
    if impl == "splash":
        return lambda q, k, v: splash_attention(q, k, v, mask, interpret=jax.default_backend() != "tpu")
    if impl == "reference":
        return lambda q, k, v: reference_attention(q, k, v, mask)
    if impl == "cudnn" and mask_name == "causal":
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    if mask_name == "dense":
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation=impl)

    def masked(q, k, v):
        dense = mask.dense(q.shape[1], k.shape[1])[:, None]
        return jax.nn.dot_product_attention(q, k, v, mask=dense, implementation=impl)
    return masked


def inputs(key, b, length, h, d, dtype):
    kq, kk, kv, ko = jax.random.split(key, 4)
    shape = (b, length, h, d)
    return [jax.random.normal(k_, shape, jnp.float32).astype(dtype) for k_ in (kq, kk, kv, ko)]


def rel_err(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


def check_row(args, blocks, interpret, mask_name, dtype, seed) -> dict:
    """Output and dq/dk/dv of the kernel vs the float32 reference on upcast inputs."""
    length = args.check_length
    mask = make_mask(mask_name, length, args.block)
    mask_blocks = blocks or BlockSizes.for_mask(mask, dtype)
    q, k, v, do = inputs(jax.random.key(seed), 2, length, 4, args.head_dim, dtype)
    k, v = k[:, :, :2], v[:, :, :2]  # GQA: 4 query heads over 2 kv heads
    fn = attention_fn("pallas", mask_name, mask, mask_blocks, interpret)
    o, grads = jax.jit(lambda q, k, v, do: (fn(q, k, v), jax.vjp(fn, q, k, v)[1](do)))(q, k, v, do)
    up = [x.astype(jnp.float32) for x in (q, k, v, do)]
    with jax.default_matmul_precision("highest"):
        o_ref, vjp_ref = jax.vjp(lambda q, k, v: reference_attention(q, k, v, mask), *up[:3])
        grads_ref = vjp_ref(up[3])
    errs = [rel_err(o, o_ref)] + [rel_err(g, r) for g, r in zip(grads, grads_ref)]
    finite = bool(all(np.isfinite(np.asarray(x, np.float32)).all() for x in [o, *grads]))
    return {"mask": mask_name, "dtype": jnp.dtype(dtype).name, "length": length,
            "fwd_tiles": [mask_blocks.block_q, mask_blocks.block_k],
            "rel_err_out": errs[0], "rel_err_dq": errs[1], "rel_err_dk": errs[2],
            "rel_err_dv": errs[3], "finite": finite}


def check(args, blocks: BlockSizes | None, interpret: bool) -> list[dict]:
    """`check_row` for every mask kind in float32 and bf16, fresh inputs each."""
    rows = []
    for seed, (mask_name, dtype) in enumerate(
            (m, d) for m in ("dense", "causal", "block_diffusion", "jacobi_forcing")
            for d in (jnp.float32, jnp.bfloat16)):
        try:
            row = check_row(args, blocks, interpret, mask_name, dtype, seed)
        except Exception as e:  # one failing case must not hide the others
            row = {"mask": mask_name, "dtype": jnp.dtype(dtype).name,
                   "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print("check", json.dumps(row), flush=True)
        rows.append(row)
    return rows


def useful_flops(mask: MaskSpec, length: int, b: int, h: int, d: int) -> tuple[float, int]:
    visible = int(jnp.sum(mask.dense(length, length), dtype=jnp.int64 if jax.config.jax_enable_x64 else jnp.int32))
    return 4.0 * d * visible * b * h, visible


def run_row(args, impl, mask_name, length, mode, blocks, interpret, dtype):
    mask = make_mask(mask_name, length, args.block)
    blocks = blocks or BlockSizes.for_mask(mask, dtype)
    b, h, d = args.batch, args.heads, args.head_dim
    q, k, v, do = inputs(jax.random.key(length), b, length, h, d, dtype)
    fn = attention_fn(impl, mask_name, mask, blocks, interpret)
    if mode == "fwd":
        call = jax.jit(fn)
        call_args = (q, k, v)
    else:
        call = jax.jit(lambda q, k, v, do: jax.vjp(fn, q, k, v)[1](do))
        call_args = (q, k, v, do)
    iters = max(2, args.iters * 2048 // length)
    t = timed(lambda: call(*call_args), repeats=args.reps, iters=iters)  # dispatch pipelined over iters
    first, sec = t.first_s, t.median_s
    flops, visible = useful_flops(mask, length, b, h, d)
    if mode == "fwd+bwd":
        flops *= 3.5
    classes = tiles.tile_classes(mask, length, length, blocks.block_q, blocks.block_k)
    return {"impl": impl, "mask": mask_name, "length": length, "mode": mode,
            "ms": sec * 1e3, "compile_s": first, "tflops": flops / sec / 1e12,
            "visible_fraction": visible / length ** 2,
            "tiles_skipped": float(tiles.skipped_fraction(classes)),
            "tiles_partial": float((classes == tiles.PARTIAL).mean()),
            "fwd_tiles": [blocks.block_q, blocks.block_k]}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt
    masks = sorted({r["mask"] for r in rows if "ms" in r})
    modes = ["fwd", "fwd+bwd"]
    fig, axes = plt.subplots(len(modes), max(len(masks), 1), figsize=(4 * max(len(masks), 1), 7), squeeze=False)
    for i, mode in enumerate(modes):
        for j, mask in enumerate(masks):
            ax = axes[i][j]
            for impl in ("pallas", "splash", "cudnn", "xla"):
                pts = sorted((r["length"], r["tflops"]) for r in rows
                             if r.get("impl") == impl and r["mask"] == mask and r["mode"] == mode and "ms" in r)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=impl)
            ax.set_title(f"{mask} {mode}")
            ax.set_xlabel("sequence length")
            ax.set_ylabel("useful TFLOP/s")
            ax.set_xscale("log", base=2)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.benchmark_attention")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["full", "tiny"], default="full")
    p.add_argument("--out", default="sampling/results/attention_benchmark")
    p.add_argument("--lengths", type=int, nargs="*")
    p.add_argument("--masks", nargs="*", default=["dense", "causal", "block_diffusion", "jacobi_forcing"])
    p.add_argument("--impls", nargs="*")
    p.add_argument("--modes", nargs="*", default=["fwd", "fwd+bwd"])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block", type=int, default=64, help="block size of the block-diffusion / Jacobi masks")
    p.add_argument("--blocks", type=int, nargs=4, metavar=("BQ", "BK", "BQ_BWD", "BK_BWD"))
    p.add_argument("--num-warps", type=int)
    p.add_argument("--num-stages", type=int, default=2)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--check", action="store_true", help="compare with the reference first")
    p.add_argument("--check-length", type=int, default=1000)
    args = p.parse_args(argv)

    tiny = args.size == "tiny"
    interpret = jax.default_backend() == "cpu"
    if tiny:
        args.batch, args.heads, args.head_dim, args.block = 1, 2, 32, 16
        args.iters, args.reps, args.check_length = 1, 1, 100
    lengths = args.lengths or ([128, 256] if tiny else [2048, 4096, 8192])
    default = {"tpu": ["splash", "xla"], "cpu": ["pallas", "xla"]}.get(jax.default_backend(), ["pallas", "cudnn", "xla"])
    impls = args.impls or default
    blocks = None  # per mask: BlockSizes.for_mask, the library default
    if args.blocks or tiny:
        blocks = BlockSizes(*(args.blocks or [32, 32, 32, 32]), num_warps=args.num_warps,
                            num_stages=args.num_stages)
    dtype = jnp.float32 if interpret else jnp.bfloat16
    out = Path(args.out)
    result = {"backend": jax.default_backend(), "dtype": jnp.dtype(dtype).name, "batch": args.batch,
              "heads": args.heads, "head_dim": args.head_dim, "mask_block": args.block,
              "tiles": "BlockSizes.for_mask" if blocks is None else dataclasses.asdict(blocks),
              "num_warps": args.num_warps, "num_stages": args.num_stages,
              "checks": [], "rows": []}

    def save(with_plot: bool = False):  # after every row; the PNG at the end
        write_report(out, result, (lambda r, path: plot(r["rows"], path)) if with_plot else None, quiet=True)

    print(f"device {jax.devices()[0].device_kind} ({result['backend']}), jax {jax.__version__}", flush=True)
    if args.check:
        result["checks"] = check(args, blocks, interpret)
        save()
    for mode in args.modes:
        for mask_name in args.masks:
            for length in lengths:
                for impl in impls:
                    try:
                        row = run_row(args, impl, mask_name, length, mode, blocks, interpret, dtype)
                    except Exception as e:  # record and go on: one failing backend must not hide the rest
                        traceback.print_exc(limit=2)
                        row = {"impl": impl, "mask": mask_name, "length": length, "mode": mode,
                               "error": f"{type(e).__name__}: {str(e)[:300]}"}
                    result["rows"].append(row)
                    print("row", json.dumps(row), flush=True)
                    save()
    save(with_plot=True)
    print_table(result["rows"])
    return 0


def print_table(rows: list[dict]) -> None:
    by_key = {(r["mask"], r["length"], r["mode"], r["impl"]): r for r in rows}
    print("\n| mask | L | pass | pallas ms | cudnn ms | xla ms | pallas TFLOP/s | vs cudnn | tiles skipped |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (mask, length, mode, impl), r in by_key.items():
        if impl != "pallas":
            continue
        ms = {i: by_key.get((mask, length, mode, i), {}).get("ms") for i in ("pallas", "cudnn", "xla")}
        fmt = lambda x: "err" if x is None else f"{x:.3f}"
        speed = (f"{ms['cudnn'] / ms['pallas']:.2f}x" if ms["cudnn"] and ms["pallas"] else "-")
        tf = r.get("tflops")
        print(f"| {mask} | {length} | {mode} | {fmt(ms['pallas'])} | {fmt(ms['cudnn'])} | {fmt(ms['xla'])} | "
              f"{'err' if tf is None else f'{tf:.0f}'} | {speed} | {r.get('tiles_skipped', float('nan')):.2f} |")


if __name__ == "__main__":
    sys.exit(main())
