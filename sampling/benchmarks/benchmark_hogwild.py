"""Hogwild! Inference's cost per step against a plain batch of N independent rows, and its mechanics on the
shipped causal model, in one process (JSON + PNG).

* **Cost of a step.** A random Qwen2-shaped model (`--width`, `--layers`; the weights do not change the
  cost). Hogwild!: N workers on one problem, every worker's view the common history + the other workers'
  steps + its own (`policy="hogwild"`, shared K/V pages). Plain: N independent rows of the same prompt,
  next-token decoding with a KV cache (`jacobi`, window 1), each writing `gen_length / N` tokens, so both
  write the same tokens. Per prompt length: ms per loop step (the whole compiled loop timed, divided by its
  steps; compiled beforehand, best of `--repeats`), keys each row attends per step, and the ratio.
* **Mechanics.** `checkpoints/tasks-qwen2-small` (a character-level model of the task suite, 96 positions)
  with a compact format (the prompt alone as the template, one-character headers): the steps that ended,
  the forwards, the text. The model was never trained to collaborate; this shows the loop runs on a
  shipped checkpoint, not a reasoning gain.

    python -m sampling.benchmarks.benchmark_hogwild --out sampling/results/hogwild_cpu
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

import jaxdllm
from jaxdllm import ModelConfig, Transformer
from jaxdllm.data.char_tokenizer import build_char_tokenizer
from jaxdllm.decoding import SamplerConfig
from jaxdllm.decoding.hogwild_run import hogwild_generate
from jaxdllm.decoding.hogwild_text import HogwildFormat, settings_for
from jaxdllm.extras import exit_if_missing
from jaxdllm.tokenizer import Tokenizer
from sampling.benchmarks.report import write_report
from sampling.benchmarks.timing import timed

COMPACT = dict(template="{problem}", past_steps="", others_header="|", own_header="|", step_header="{name}{k}:",
               names=("A", "B", "C", "D"), greetings=("", "", "", ""), check_text="?", finisher_text="=",
               finisher_tokens=8, check_every=32)


def step_cost(model, prompt_len: int, workers: int, gen_length: int, repeats: int) -> dict:
    tok = build_char_tokenizer()
    rng = np.random.default_rng(prompt_len)
    prompt = rng.integers(6, 100, (1, prompt_len)).astype(np.int32)
    hog = SamplerConfig(gen_length=gen_length, policy="hogwild", prompt_bucket=8,
                        **settings_for(tok, HogwildFormat(workers=workers, **COMPACT)))
    plain = SamplerConfig(gen_length=gen_length // workers, policy="jacobi", window=1, prompt_bucket=8)
    rows = np.repeat(prompt, workers, 0)
    out = {"prompt_len": prompt_len, "workers": workers, "gen_length": gen_length}
    for name, config, ids in (("hogwild", hog, prompt), ("plain", plain, rows)):
        result = jaxdllm.generate(model, ids, config)
        seconds = timed(lambda: jaxdllm.generate(model, ids, config), repeats=repeats).min_s
        out[name] = dict(steps=int(result.steps), ms_per_step=1e3 * seconds / int(result.steps), s_per_call=seconds)
    out["hogwild"]["keys_per_row"] = prompt_len + gen_length   # every worker reads all text written
    out["plain"]["keys_per_row"] = prompt_len + gen_length // workers
    out["step_cost_ratio"] = out["hogwild"]["ms_per_step"] / out["plain"]["ms_per_step"]
    print(out, flush=True)
    return out


def mechanics(path: str, problems: list[str]) -> list[dict]:
    model = jaxdllm.from_pretrained(path)
    tok = Tokenizer.from_pretrained(path)
    rows = []
    for workers in (2, 3):
        fmt = HogwildFormat(workers=workers, **COMPACT)
        config = SamplerConfig(gen_length=64, policy="hogwild", prompt_bucket=8, **settings_for(tok, fmt))
        texts = hogwild_generate(model, tok, problems, config, fmt)
        batch = tok([fmt.prompt(p) for p in problems])
        result = jaxdllm.generate(model, batch.ids, config, attention_mask=batch.mask)
        rows.append(dict(workers=workers, forwards=np.asarray(result.nfe).tolist(), loop_steps=int(result.steps),
                         texts=dict(zip(problems, texts))))
        print(rows[-1], flush=True)
    return rows


def plot(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for workers in sorted({r["workers"] for r in result["step_cost"]}):
        rows = [r for r in result["step_cost"] if r["workers"] == workers]
        x = [r["prompt_len"] for r in rows]
        ax.plot(x, [r["hogwild"]["ms_per_step"] for r in rows], "o-", label=f"Hogwild! {workers} workers")
        ax.plot(x, [r["plain"]["ms_per_step"] for r in rows], "s--", label=f"plain batch of {workers} rows")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("ms per step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Hogwild! step against N independent rows ({result['model']}), {result['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.benchmark_hogwild")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--prompt-lens", type=int, nargs="+", default=[128, 512, 1024])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default="sampling/results/hogwild_cpu")
    args = p.parse_args(argv)
    t0, load_before = time.perf_counter(), os.getloadavg()
    config = ModelConfig.preset("tiny-qwen2", embed_dim=args.width, num_layers=args.layers, num_heads=args.width // 64,
                                num_kv_heads=2, head_dim=64, mlp_dim=3 * args.width, vocab_size=4096, max_position=4096)
    model = Transformer(config, rngs=nnx.Rngs(0))
    cost = [step_cost(model, n, w, args.gen_length, args.repeats) for w in args.workers for n in args.prompt_lens]
    shapes = dict(width=args.width, layers=args.layers, heads=args.width // 64, kv_heads=2, vocab=4096)
    result = {"model": f"random Qwen2 {args.width}x{args.layers}", "model_shape": shapes, "step_cost": cost,
              "mechanics": mechanics("checkpoints/tasks-qwen2-small", ["copy 2718=", "reverse 4821=", "sort 93715="]),
              "jax": jax.__version__, "wall_s": time.perf_counter() - t0, "load_average_before": load_before,
              "load_average_after": os.getloadavg()}
    write_report(args.out, result, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
