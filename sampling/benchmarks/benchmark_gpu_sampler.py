"""The compiled sampler on an 8B-shaped random LLaDA in bf16 on one GPU, against the
memory-bandwidth floor of a forward (all weight bytes read once per step).

    python -m sampling.benchmarks.benchmark_gpu_sampler                 # GPU: llada-8b shapes
    python -m sampling.benchmarks.benchmark_gpu_sampler --size tiny     # CPU smoke run

Per row: compile seconds (first call), then the median of `--reps` timed generations:
tokens/s, ms per loop step (one batched forward each), NFE, and ms per step over the floor
`weight bytes / measured bandwidth`. Random weights are not confident, so the threshold policy
commits about one token per step here; NFE is reported so tokens per forward stay honest.
Writes JSON after every row and a PNG at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdllm.extras import exit_if_missing
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.run_options import RunOptions
from jaxdllm.models.transformer import Transformer
from jaxdllm.decoding import SamplerConfig, generate
from sampling.benchmarks.report import write_report
from sampling.benchmarks.timing import timed

ROWS = {  # name -> (sampler preset, overrides, batch)
    "llada-b1": ("llada", {}, 1),
    "llada-b8": ("llada", {}, 8),
    "threshold-dual-b8": ("fast-dllm-dual", {}, 8),
    "threshold-b8": ("fast-dllm-parallel", {}, 8),
}


def random_model(config: ModelConfig, options: RunOptions) -> Transformer:
    """Random weights created on the device (no host copy of the 16 GB)."""
    abstract = nnx.eval_shape(lambda: Transformer(config, options, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    leaves, treedef = jax.tree.flatten(state)

    @jax.jit
    def init(key):
        keys = jax.random.split(key, len(leaves))
        return [jnp.ones(x.shape, x.dtype) if x.ndim == 1 else
                (0.02 * jax.random.normal(k, x.shape, jnp.float32)).astype(x.dtype)
                for k, x in zip(keys, leaves)]

    return nnx.merge(graphdef, jax.tree.unflatten(treedef, init(jax.random.key(0))))


def measured_bandwidth(gib: float) -> float:
    """Bytes/s of a device copy `y = x + 1` of `gib` GiB of bf16 (bytes read + written), the
    median of 10 calls."""
    x = jnp.ones((int(gib * 2**30) // 2,), jnp.bfloat16)
    f = jax.jit(lambda x: x + 1)
    return 2 * x.nbytes / timed(lambda: f(x), repeats=10).median_s


def main(argv=None) -> int:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.benchmark_gpu_sampler")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["8b", "tiny"], default="8b")
    p.add_argument("--rows", nargs="*", default=list(ROWS))
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--attention-impl", default=None, help="override the config's attention_impl")
    p.add_argument("--out", default="sampling/results/sampler_benchmark_gpu")
    args = p.parse_args(argv)

    tiny = args.size == "tiny"
    config = ModelConfig.preset("tiny-llada" if tiny else "llada-8b")
    options = RunOptions("bfloat16", "bfloat16", **({"attention_impl": args.attention_impl} if args.attention_impl else {}))
    if tiny:
        args.gen_length, args.prompt_len = min(args.gen_length, 64), min(args.prompt_len, 16)
    model = random_model(config, options)
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
    bandwidth = measured_bandwidth(0.25 if tiny else 4.0)
    floor_ms = weight_bytes / bandwidth * 1e3
    out = Path(args.out)
    result = {"model": "tiny-llada" if tiny else "llada-8b",
              "params": config.num_params, "weight_bytes": weight_bytes, "bandwidth_GBps": bandwidth / 1e9,
              "floor_ms_per_step": floor_ms, "prompt_len": args.prompt_len, "gen_length": args.gen_length,
              "attention_impl": options.attention_impl, "rows": []}
    print(f"{jax.devices()[0].device_kind}: {config.num_params / 1e9:.2f}B params, {weight_bytes / 1e9:.1f} GB, "
          f"bandwidth {bandwidth / 1e9:.0f} GB/s, floor {floor_ms:.2f} ms/step", flush=True)
    rng = np.random.default_rng(0)
    for name in args.rows:
        preset, overrides, batch = ROWS[name]
        one_per_step = {"steps": args.gen_length} if SamplerConfig.preset(preset).steps else {}
        cfg = SamplerConfig.preset(preset, gen_length=args.gen_length, **one_per_step, **overrides)
        ids = rng.integers(0, min(config.mask_token_id, config.vocab_size) - 4, (batch, args.prompt_len)).astype(np.int32)
        row = {"row": name, "preset": preset, "batch": batch, "attention_impl": options.attention_impl}
        try:
            # the warm-up call compiles (no key: the default); the timed ones use keys 0, 1, ...
            keys = itertools.chain([None], map(jax.random.key, itertools.count()))

            def run():
                return generate(model, ids, cfg, key=next(keys))

            try:
                t = timed(run, repeats=args.reps)
            except Exception as e:  # keep measuring the sampler if the attention kernel fails here
                row["attention_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                row["attention_impl"] = "xla"
                model = model.with_options(attention_impl="xla")
                keys = itertools.chain([None], map(jax.random.key, itertools.count()))
                t = timed(run, repeats=args.reps)
            row["compile_s"], wall, res = t.first_s, t.median_s, t.out
            row.update(wall_s=wall, steps=int(res.steps), nfe=float(np.mean(res.nfe)),
                       tokens_per_s=batch * args.gen_length / wall, ms_per_step=wall / res.steps * 1e3)
            row["ms_per_step_over_floor"] = row["ms_per_step"] / floor_ms
        except Exception as e:  # record and go on
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
        result = write_report(out, result)
    result = write_report(out, result, _plot)
    print("\n| row | batch | compile s | tokens/s | ms/step | floor ms | x floor | NFE |\n|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        if "error" in r:
            print(f"| {r['row']} | {r['batch']} | error: {r['error'][:80]} |")
            continue
        print(f"| {r['row']} | {r['batch']} | {r['compile_s']:.1f} | {r['tokens_per_s']:.1f} | {r['ms_per_step']:.2f} | "
              f"{floor_ms:.2f} | {r['ms_per_step_over_floor']:.2f} | {r['nfe']:.0f} |")
    return 0


def _plot(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt
    rows = [r for r in result["rows"] if "ms_per_step" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([r["row"] for r in rows], [r["ms_per_step"] for r in rows], label="ms per step")
    ax.axhline(result["floor_ms_per_step"], color="red", ls="--", label="bandwidth floor")
    ax.set_ylabel("ms per loop step")
    ax.set_title(f"{result['model']} bf16 on {result['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
