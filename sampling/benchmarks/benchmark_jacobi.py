"""Jacobi decoding of a causal checkpoint, side by side in one process (writes JSON + PNG):

  speed: answer tokens/s on the same prompts and weights of
    (a) `jaxdllm.generate`: the whole decoding in one jitted `while_loop`,
    (b) `jaxdllm.generate_stepwise`: a Python loop calling the jitted step (one dispatch and one
        host sync per forward),
    (c) transformers' greedy `generate(do_sample=False)` (PyTorch eager, KV cache), AR;
  and checks that (a) and (b) give transformers' tokens.

  by_n: answer tokens per forward against the Jacobi window n, for each model given (`--models`),
  plain and with multi-block decoding + rejection recycling (the `jacobi-forcing` preset), on the
  six card tasks (answers of 4-8 tokens) and on the long-answer tasks (11-17 tokens) apart.

    python -m sampling.benchmarks.benchmark_jacobi --out sampling/results/jacobi_cpu
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from jaxdllm.extras import exit_if_missing
import jaxdllm
from jaxdllm.data import make_mixture
from jaxdllm.decoding import SamplerConfig
from jaxdllm.eval.runner import left_pad
from jaxdllm.eval.tasks import LONG, SUITE
from jaxdllm.tokenizer import Tokenizer, answer_length
from sampling.benchmarks.report import write_report
from sampling.benchmarks.timing import timed

GROUPS = {"suite": SUITE, "long": LONG}
GEN_LENGTH = 32  # the longest answer (16 digits + EOS) fits


def prompts(tokenizer: Tokenizer, n: int, tasks=SUITE + LONG, seed: int = 1234) -> list[list[int]]:
    """`n` held-out prompts per task, tokenised."""
    return [tokenizer.encode(e.prompt) for e in make_mixture(tasks, n, seed, split="test")]


def speed(model_dir: Path, batch: int, repeats: int, n: int) -> list[dict]:
    import torch
    import transformers

    model = jaxdllm.from_pretrained(model_dir)
    tokenizer = Tokenizer.from_pretrained(model_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    eos, pad = model.config.eos_token_id, model.config.pad_token_id or 0
    rows = prompts(tokenizer, 1)[:batch]  # one prompt per task, short and long
    ids, mask = left_pad(rows, pad)
    g = GEN_LENGTH
    out = []
    for label, config in (("jacobi n=%d" % n, SamplerConfig.preset("jacobi", gen_length=g, window=n)),
                          ("jacobi-forcing n=%d" % n, SamplerConfig.preset("jacobi-forcing", gen_length=g,
                                                                            window=n))):
        # each: the best of `repeats` after a call that compiles and warms up
        loop = timed(lambda: jaxdllm.generate(model, ids, config, attention_mask=mask), repeats=repeats)
        stepwise = timed(lambda: jaxdllm.generate_stepwise(model, ids, config, attention_mask=mask), repeats=repeats)
        t_loop, res = loop.min_s, loop.out
        t_step, res_b = stepwise.min_s, stepwise.out

        def hf_generate():
            with torch.no_grad():
                return hf.generate(input_ids=torch.as_tensor(ids, dtype=torch.long),
                                   attention_mask=torch.as_tensor(mask), max_new_tokens=g, do_sample=False,
                                   eos_token_id=eos, pad_token_id=eos).numpy()[:, ids.shape[1]:]

        hf_timing = timed(hf_generate, repeats=repeats)
        t_hf, greedy = hf_timing.min_s, hf_timing.out
        tokens = sum(answer_length(r, eos) for r in res.tokens[:, ids.shape[1]:])
        same = all(np.array_equal(res.tokens[i, ids.shape[1]:ids.shape[1] + answer_length(greedy[i], eos)],
                                  greedy[i, :answer_length(greedy[i], eos)]) for i in range(len(rows)))
        out.append(dict(model=str(model_dir), sampler=label, batch=len(rows), answer_tokens=int(tokens),
                        mean_nfe=float(res.nfe.mean()), tokens_per_forward=tokens / float(res.nfe.sum()),
                        loop_tok_s=tokens / t_loop, stepwise_tok_s=tokens / t_step, transformers_ar_tok_s=tokens / t_hf,
                        loop_vs_stepwise=t_step / t_loop, loop_vs_transformers=t_hf / t_loop,
                        same_tokens_as_transformers=bool(same),
                        stepwise_same_as_loop=bool(np.array_equal(res.tokens, res_b.tokens))))
        print(json.dumps(out[-1]), flush=True)
    return out


def by_n(model_dirs: list[Path], ns: list[int], n_prompts: int) -> list[dict]:
    out = []
    for model_dir in model_dirs:
        model = jaxdllm.from_pretrained(model_dir)
        tokenizer = Tokenizer.from_pretrained(model_dir)
        eos, pad = model.config.eos_token_id, model.config.pad_token_id or 0
        for group, tasks in GROUPS.items():
            ids, mask = left_pad(prompts(tokenizer, n_prompts, tasks), pad)
            for preset in ("jacobi", "jacobi-forcing"):
                for n in ns:
                    config = SamplerConfig.preset(preset, gen_length=GEN_LENGTH, window=n)
                    res = jaxdllm.generate(model, ids, config, attention_mask=mask)
                    tokens = sum(answer_length(r, eos) for r in res.tokens[:, ids.shape[1]:])
                    out.append(dict(model=model_dir.name, tasks=group, sampler=preset, n=n,
                                    tokens_per_forward=tokens / float(res.nfe.sum())))
                    print(json.dumps(out[-1]), flush=True)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    titles = {"suite": "six card tasks (answers of 4-9 tokens with EOS)", "long": "long-answer tasks (11-17 tokens with EOS)"}
    fig, axes = plt.subplots(1, len(GROUPS), figsize=(11, 4.2), sharey=True)
    for ax, group in zip(axes, GROUPS):
        rows = [r for r in result["by_n"] if r["tasks"] == group]
        for (model, sampler) in sorted({(r["model"], r["sampler"]) for r in rows}):
            pts = [r for r in rows if r["model"] == model and r["sampler"] == sampler]
            ax.plot([r["n"] for r in pts], [r["tokens_per_forward"] for r in pts],
                    "o-" if sampler == "jacobi" else "s--",
                    label=f"{model} ({'multi-block + recycling' if sampler != 'jacobi' else 'plain Jacobi'})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("Jacobi window n (tokens)")
        ax.set_title(titles[group], fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("answer tokens per forward")
    axes[0].legend(fontsize=7)
    fig.suptitle("Jacobi decoding, greedy (same tokens as AR)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    exit_if_missing(("torch", "transformers", "matplotlib"), "bench", "python -m sampling.benchmarks.benchmark_jacobi")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="checkpoints/tasks-qwen2-small,checkpoints/tasks-qwen2-small-jf",
                   help="comma-separated causal checkpoints; the last is the one timed")
    p.add_argument("--ns", default="1,2,4,8,16,32")
    p.add_argument("--n-prompts", type=int, default=50, help="held-out prompts per task for by_n")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="sampling/results/jacobi_cpu")
    args = p.parse_args(argv)
    models = [Path(m) for m in args.models.split(",")]
    ns = [int(n) for n in args.ns.split(",")]
    result = {"speed": [], "by_n": by_n(models, ns, args.n_prompts)}
    for batch in (1, 8):
        result["speed"] += speed(models[-1], batch, args.repeats, 16)
    write_report(args.out, result, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
