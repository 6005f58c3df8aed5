"""The shipped DiffusionGemma-architecture model against its step budget, beside the masked-diffusion
model of the same depth, width and active MLP width trained on the same tasks (the LLaDA2-architecture
`tasks-llada2-tiny`): accuracy against mean NFE on the same held-out prompts (JSON + PNG).

    python -m sampling.benchmarks.diffusiongemma_tiny_eval --out sampling/results/diffusiongemma_tiny/eval

Each family is one `jaxdllm eval` run (its command is printed and stored in the JSON):

    jaxdllm eval --model tasks-diffusiongemma-tiny --tasks copy,reverse --n N --preset diffusiongemma \\
        --sweep max_denoising_steps=...                          # the published sampler (sampling)
    ... the same with --set sample=false                        # argmax in place of sampling
    jaxdllm eval --model tasks-llada2-tiny --tasks copy,reverse --n N --preset llada     # one token per step
    jaxdllm eval --model tasks-llada2-tiny ... --preset llada2                           # threshold 0.95
    jaxdllm eval --model tasks-llada2-tiny ... --preset eb --sweep entropy_bound=...     # the same EB rule, masked

The runs' folders go under `--runs` (default `runs/diffusiongemma_tiny`), so a rerun resumes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from jaxdllm.extras import exit_if_missing
from sampling.benchmarks.entropy_bound_sweep import add_run, save

DG, MASKED = "tasks-diffusiongemma-tiny", "tasks-llada2-tiny"


def families(args) -> dict[str, tuple[str, list[str]]]:
    """`{label: (model, jaxdllm eval argv without --model/--out)}`."""
    steps = f"max_denoising_steps={args.steps}"
    return {
        "DiffusionGemma, published sampler": (DG, ["--preset", "diffusiongemma", "--sweep", steps]),
        "DiffusionGemma, argmax": (DG, ["--preset", "diffusiongemma", "--set", "sample=false", "--sweep", steps]),
        "masked (LLaDA2), one token per step": (MASKED, ["--preset", "llada", "--gen-length", "16"]),
        "masked (LLaDA2), threshold 0.95": (MASKED, ["--preset", "llada2", "--gen-length", "16"]),
        "masked (LLaDA2), entropy bound": (MASKED, ["--preset", "eb", "--gen-length", "16", "--sweep",
                                                    f"entropy_bound={args.bounds}"]),
    }


def main(argv=None) -> None:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.diffusiongemma_tiny_eval")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="copy,reverse")
    parser.add_argument("--n", type=int, default=200, help="held-out prompts per task")
    parser.add_argument("--steps", default="1,2,4,8,16,48", help="DiffusionGemma step budgets")
    parser.add_argument("--bounds", default="0.01,0.1,1.0", help="EB bounds on the masked model")
    parser.add_argument("--runs", default="runs/diffusiongemma_tiny", help="folder of the eval runs")
    parser.add_argument("--out", required=True, help="output path without extension (.json, .png)")
    args = parser.parse_args(argv)

    data = {"model": f"{DG} beside {MASKED}", "n": args.n, "tasks": None, "commands": {}, "families": {},
            "settings": {}, "results": {}, "gen_length": 16, "block_length": 16}
    for i, (family, (model, flags)) in enumerate(families(args).items()):
        out = Path(args.runs) / f"{i}-{model}-{flags[1]}"
        add_run(data, family, ["eval", "--model", model, "--tasks", args.tasks, "--n", str(args.n), *flags,
                               "--out", str(out), "--no-progress"], prefix=f"{family}: ")
    save(data, args.out)


if __name__ == "__main__":
    main()
