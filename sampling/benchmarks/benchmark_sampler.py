"""Sampler speed, side by side in one process on the same random LLaDA-shaped weights:

  (a) `jaxdllm.generate`: the whole generation in one compiled while_loop;
  (b) `jaxdllm.generate_stepwise`: a Python loop calling a jitted step (one dispatch + host
      sync per step);
  (c) the PyTorch eager port of the published algorithm (`sampling/torch_reference/torch_port.py`) on a
      torch LLaDA loaded from the same checkpoint.

    python -m sampling.benchmarks.benchmark_sampler [--out results/sampler_benchmark] [--quick]
    python -m sampling.benchmarks.benchmark_sampler --batches 4 --gen-lengths 128 --out sampling/results/sampler_benchmark_cpu_b4

Writes `<out>.json` and `<out>.png`. Tokens/s counts generated tokens (batch x gen_length)
over the best of `--repeats` wall times after one warm-up call; `first_call_s` is that warm-up
call (compile plus one run). The FLOP rate of
(a) is compared with this machine's measured fp32 matmul peak.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdllm.extras import exit_if_missing
import jaxdllm
from jaxdllm import ModelConfig, SamplerConfig, Transformer
from jaxdllm.flops import forward_flops
from sampling.benchmarks.report import torch_facts, write_report
from sampling.benchmarks.timing import timed

_LLADA = dict(attention="bidirectional", checkpoint_format="llada", model_type="llada", max_position=1024,
              num_layers=4, bos_token_id=None, eot_token_id=None)
# Two tiny LLaDA-shaped sizes: "tiny" is the size class of the models we train and ship
# (per-step overhead matters), "small" is large enough that both frameworks are compute-bound.
SIZES = {
    "tiny": dict(_LLADA, vocab_size=512, embed_dim=128, num_heads=4, num_kv_heads=4, head_dim=32,
                 mlp_dim=384, mask_token_id=511, eos_token_id=510, pad_token_id=510),
    "small": dict(_LLADA, vocab_size=4096, embed_dim=256, num_heads=4, num_kv_heads=4, head_dim=64,
                  mlp_dim=768, mask_token_id=4095, eos_token_id=4094, pad_token_id=4094),
}
HEAD_SCALE = 40.0  # sharpen the random LM head so the threshold policy commits several tokens/step
PROMPT_LEN = 32


def build_checkpoint(path: Path, size: str) -> Path:
    model = Transformer(ModelConfig.preset("tiny-llada", **SIZES[size]), rngs=nnx.Rngs(0))
    model.lm_head.set_value(model.lm_head[...] * HEAD_SCALE)
    jaxdllm.save_pretrained(model, path)
    return path


def matmul_peak_flops(n: int = 1024, repeats: int = 20) -> float:
    """Measured fp32 matmul FLOP/s of this machine through XLA (`[n, n] @ [n, n]`, `repeats`
    calls dispatched back to back)."""
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    return 2 * n ** 3 / timed(lambda: f(a), repeats=1, iters=repeats).min_s


def torch_run(torch_model, prompts: np.ndarray, config: SamplerConfig, mask_id: int):
    """The eager port in its batched form (the published loops run a batch of equal-length prompts)."""
    import torch

    from sampling.torch_reference.torch_port import generate_batch

    policy = {"llada": "low_confidence"}.get(config.policy.name, config.policy.name)
    with torch.inference_mode():
        out = generate_batch(torch_model, torch.as_tensor(prompts, dtype=torch.long),
                             gen_length=config.gen_length, block_length=config.block_length,
                             steps=config.steps, mask_id=mask_id, policy=policy,
                             threshold=getattr(config.policy, "threshold", 0.9))
    return out["tokens"].numpy(), out["nfe"].numpy()


def run_size(size, model, torch_model, args, rows: list, on_row=lambda: None) -> None:
    """Append one row per (gen_length, policy, batch) to `rows`, calling `on_row` after each."""
    mc = model.config
    for gen in ([128] if args.quick else args.gen_lengths):
        for policy in ("llada", "threshold"):
            config = SamplerConfig(gen_length=gen, block_length=32, steps=gen, policy=policy,
                                   prompt_bucket=PROMPT_LEN)
            for batch in ([1] if args.quick else args.batches):
                prompts = np.random.RandomState(0).randint(0, mc.vocab_size - 2, (batch, PROMPT_LEN)).astype(np.int32)
                # (a) and (b): best of `repeats` after a warm-up call (a's warm-up compiles the loop)
                loop = timed(lambda: jaxdllm.generate(model, prompts, config), repeats=args.repeats)
                compile_a, t_a, out_a = loop.first_s, loop.min_s, loop.out
                stepwise = timed(lambda: jaxdllm.generate_stepwise(model, prompts, config), repeats=args.repeats)
                t_b, out_b = stepwise.min_s, stepwise.out
                assert np.array_equal(out_a.tokens, out_b.tokens)
                t_c, torch_out = float("nan"), None
                if not args.skip_torch:  # eager: nothing to compile, so no warm-up call
                    eager = timed(lambda: torch_run(torch_model, prompts, config, mc.mask_token_id),
                                  warmup=0, repeats=args.repeats)
                    t_c, torch_out = eager.min_s, eager.out
                tokens = batch * gen
                # every step feeds the whole canvas; logits of the current block (32) only
                flops = out_a.steps * forward_flops(mc, PROMPT_LEN + gen, batch=batch, logits_positions=32)
                row = dict(size=size, gen_length=gen, policy=policy, batch=batch,
                           nfe_mean=float(out_a.nfe.mean()), steps=out_a.steps, first_call_s=compile_a,
                           jax_loop_tok_s=tokens / t_a, jax_stepwise_tok_s=tokens / t_b,
                           torch_eager_tok_s=tokens / t_c, speedup_vs_torch=t_c / t_a,
                           speedup_vs_stepwise=t_b / t_a,
                           torch_nfe_mean=None if torch_out is None else float(torch_out[1].mean()),
                           tokens_equal_torch=None if torch_out is None else bool(np.array_equal(
                               torch_out[0], out_a.tokens)),
                           jax_loop_flops=flops / t_a, fraction_of_matmul_peak=flops / t_a / args.peak)
                rows.append(row)
                print(json.dumps(row), flush=True)
                on_row()


def main(argv=None) -> int:
    exit_if_missing(("torch", "matplotlib"), "bench", "python -m sampling.benchmarks.benchmark_sampler")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/sampler_benchmark")
    parser.add_argument("--quick", action="store_true", help="gen 128 and batch 1 only (overrides --batches, --gen-lengths)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--gen-lengths", type=int, nargs="*", default=[128, 256])
    parser.add_argument("--sizes", default="tiny,small", help="comma-separated model sizes: " + ",".join(SIZES))
    args = parser.parse_args(argv)

    import torch

    from sampling.torch_reference.torch_llada import TorchLLaDA

    torch.set_num_threads(max(1, torch.get_num_threads()))
    peak = args.peak = matmul_peak_flops()
    rows = []
    for size in args.sizes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            path = build_checkpoint(Path(tmp) / "llada", size)
            model = jaxdllm.from_pretrained(path)
            torch_model = TorchLLaDA.from_pretrained(path).eval()
            run_size(size, model, torch_model, args, rows, on_row=lambda: write(rows, args, peak))
    write(rows, args, peak)
    return 0


def write(rows, args, peak) -> None:
    """(Re)write `<out>.json` and `<out>.png`; called after every row so a cut-off run keeps its data."""
    result = {"matmul_peak_flops": peak, "sizes": SIZES, "head_scale": HEAD_SCALE, "prompt_len": PROMPT_LEN,
              "rows": rows, **torch_facts()}
    write_report(args.out, result, lambda r, path: plot(r["rows"], path))


def plot(rows, path: Path) -> None:
    import matplotlib.pyplot as plt

    labels = [f"{r['size']} {r['policy']}\nG{r['gen_length']} B{r['batch']}" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4))
    for i, (key, name) in enumerate([("jax_loop_tok_s", "jaxdllm.generate (one while_loop)"),
                                     ("jax_stepwise_tok_s", "Python loop + jitted step"),
                                     ("torch_eager_tok_s", "PyTorch eager port")]):
        ax.bar(x + (i - 1) * 0.27, [r[key] for r in rows], 0.27, label=name)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("generated tokens / s (CPU)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("Sampler throughput, tiny LLaDA-shaped model")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
