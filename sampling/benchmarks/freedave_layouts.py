"""FreeDave's two layouts of the K drafts in one forward over the exact block cache of a block-causal
model, timed side by side (JSON):

* `batch`: B*K rows, each draft's window over its own copy of the cache (the copy is made every step);
* `tree`: B rows, the K draft windows as nodes of a tree mask after the shared cached prefix
  (`MaskSpec(kind="tree")`), written into K windows of spare cache slots.

    python -m sampling.benchmarks.freedave_layouts --out sampling/results/freedave/layouts_cpu

Random weights of a small block-causal, token-shifted model (the Fast-dLLM v2 layout), LM head scaled
so the drafts are often accepted; both layouts decode the same tokens (checked) in the same NFE, so
the wall time per generation compares the forwards alone. One token per step with the block cache
(`llada`, its reference) is timed beside them. Timings: `sampling.benchmarks.timing.timed`, one
warm-up (the compile), then `--repeats` samples; the median is reported.
"""

from __future__ import annotations

import argparse

import numpy as np

from sampling.benchmarks.report import write_report
from sampling.benchmarks.timing import timed


def build_model(args):
    """A random block-causal, token-shifted `Transformer` of the flags' size, LM head scaled by
    `--head-scale` (peaked predictions)."""
    from flax import nnx

    from jaxdllm import ModelConfig, Transformer

    config = ModelConfig.preset("tiny-block-diffusion", vocab_size=args.vocab, embed_dim=args.width,
                                num_layers=args.layers, num_heads=args.width // 32, num_kv_heads=args.width // 64,
                                head_dim=32, mlp_dim=3 * args.width, block_size=args.block_size,
                                mask_token_id=args.vocab - 1, eos_token_id=args.vocab - 2,
                                pad_token_id=args.vocab - 2, bos_token_id=args.vocab - 2)
    model = Transformer(config, rngs=nnx.Rngs(0))
    model.lm_head[...] = model.lm_head[...] * args.head_scale
    return model


def main(argv=None) -> None:
    """Time one token per step and FreeDave's two layouts per K; check they agree; write `<out>.json`."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafts", default="2,4,8")
    parser.add_argument("--batch", type=int, default=4, help="prompts per generation")
    parser.add_argument("--prompt-len", type=int, default=96)
    parser.add_argument("--gen-length", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=32, help="the model's block (and the decoding block)")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--head-scale", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True, help="output path without extension (.json)")
    args = parser.parse_args(argv)

    import jaxdllm

    model = build_model(args)
    rng = np.random.RandomState(0)
    ids = rng.randint(0, args.vocab - 3, (args.batch, args.prompt_len)).astype(np.int32)
    base = jaxdllm.SamplerConfig(gen_length=args.gen_length, block_length=args.block_size, cache="block",
                                 prompt_bucket=args.block_size)
    sampler = jaxdllm.Sampler(model)
    rows = []

    def run(label, config, k=None):
        t = timed(lambda: sampler(ids, config), repeats=args.repeats)
        out = t.out
        row = dict(setting=label, drafts=k, layout=getattr(config.policy, "draft_layout", None),
                   median_s=t.median_s, min_s=t.min_s, first_s=t.first_s, mean_nfe=float(np.mean(out.nfe)),
                   loop_steps=int(out.steps), ms_per_step=1e3 * t.median_s / out.steps)
        rows.append(row)
        print(f"{label:26s} median {t.median_s:.3f}s  NFE {row['mean_nfe']:.2f}  steps {row['loop_steps']}  "
              f"{row['ms_per_step']:.1f} ms/step  (first call {t.first_s:.1f}s)", flush=True)
        return out

    reference = run("llada (1 token/step)", base.replace(steps=args.gen_length))
    for k in (int(x) for x in args.drafts.split(",")):
        outs = [run(f"freedave K={k} {layout}", base.replace(policy="freedave", drafts=k, draft_layout=layout), k)
                for layout in ("batch", "tree")]
        for out in outs:
            assert np.array_equal(out.tokens, reference.tokens), "FreeDave's tokens differ from one token per step"
            assert np.array_equal(out.nfe, outs[0].nfe)
    for k in {r["drafts"] for r in rows if r["drafts"]}:
        batch, tree = (next(r for r in rows if r["drafts"] == k and r["layout"] == lay) for lay in ("batch", "tree"))
        print(f"K={k}: tree / batch wall time = {tree['median_s'] / batch['median_s']:.2f}")
    write_report(args.out, {"command": "python -m sampling.benchmarks.freedave_layouts " + " ".join(argv or []),
                            "model": {k: getattr(args, k) for k in ("width", "layers", "vocab", "block_size",
                                                                    "head_scale")},
                            "batch": args.batch, "prompt_len": args.prompt_len, "gen_length": args.gen_length,
                            "rows": rows})


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
