"""Per-device memory of the published models on TPU runtimes, from `jaxdllm.memory_plan`
(shapes and sharding rules only: nothing is loaded or run). Writes
`sampling/results/memory_plan_tpu.json` and prints the Markdown tables that README.md and
training/README.md carry.

    python sampling/benchmarks/memory_plan_table.py
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxdllm import ModelConfig, SamplerConfig
from jaxdllm.memory_plan import GIB, RUNTIMES, runtime_mesh, sampling_plan, training_plan
from jaxdllm.shipped import recipe_path
from jaxdllm.train import TrainConfig

OUT = Path(__file__).resolve().parents[1] / "results" / "memory_plan_tpu.json"

SAMPLING = [  # (model preset, sampler preset, weights: a dtype or int8)
    ("llada-8b", "llada", "bfloat16"), ("llada-8b", "fast-dllm-dual", "bfloat16"),
    ("dream-7b", "dream", "bfloat16"), ("qwen2.5-7b", "jacobi-forcing", "bfloat16"),
    ("llada-8b", "llada", "int8"), ("llada-8b", "fast-dllm-dual", "int8"),
    ("dream-7b", "dream", "int8"), ("qwen2.5-7b", "jacobi-forcing", "int8"),
]
SAMPLING_RUNTIMES = ["v5e-1", "v6e-1", "v2-8", "v5e-8"]
TRAINING = [("llada8b_sft_gsm8k", "llada-8b"), ("llada8b_lora_gsm8k", "llada-8b"),
            ("dparallel_llada8b", "llada-8b"), ("dparallel_dream7b", "dream-7b"),
            ("jacobi_forcing_qwen2.5_7b", "qwen2.5-7b")]
TRAINING_RUNTIMES = ["v5e-8", "v4-32", "v5p-8"]


def cell(plan, runtime) -> str:
    return f"{plan.total / GIB:.1f} {'fits' if plan.fits(runtime) else '**no**'}"


def main():
    report = {"what": "per-device GiB from shapes and sharding rules (jaxdllm.memory_plan); fits = within 90 % "
                      "of one device's HBM", "sampling": [], "training": []}
    lines = ["| model, sampler, weights (prompt 256, batch 1 per device) | " + " | ".join(
        f"{r} ({RUNTIMES[r].hbm_gib:g} GiB)" for r in SAMPLING_RUNTIMES) + " |",
        "|---|" + "---|" * len(SAMPLING_RUNTIMES)]
    for model, preset, dtype in SAMPLING:
        config, sampler = ModelConfig.preset(model), SamplerConfig.preset(preset)
        cells = []
        for name in SAMPLING_RUNTIMES:
            runtime = RUNTIMES[name]
            plan = sampling_plan(config, sampler, batch=runtime.devices, prompt_len=256, mesh=runtime_mesh(runtime),
                                 dtype=dtype)
            report["sampling"].append({"model": model, "sampler": preset, "weights": dtype, "runtime": name,
                                       **plan.to_dict()})
            cells.append(cell(plan, runtime))
        lines.append(f"| {model}, `{preset}`, {'bf16' if dtype == 'bfloat16' else dtype} | " + " | ".join(cells) + " |")
    print("\n".join(lines) + "\n")
    lines = ["| recipe (global batch x tokens; fsdp over every device): GiB per device at the fewest micro-batches that fit | " + " | ".join(
        f"{r} ({RUNTIMES[r].devices} x {RUNTIMES[r].hbm_gib:g} GiB)" for r in TRAINING_RUNTIMES) + " |",
        "|---|" + "---|" * len(TRAINING_RUNTIMES)]
    for recipe_name, model in TRAINING:
        recipe = TrainConfig.from_toml(recipe_path(recipe_name))
        cells = []
        for name in TRAINING_RUNTIMES:
            runtime = RUNTIMES[name]
            plan = accumulation = None
            for tried in (1, 2, 4, 8, 16, 32, 64):  # the fewest micro-batches that fit (one row per device at most)
                if recipe.data.batch_size % (tried * runtime.devices):
                    break
                raw = recipe.to_dict()
                raw["optim"] = {**raw.get("optim", {}), "grad_accum": tried}
                plan = training_plan(ModelConfig.preset(model), TrainConfig.from_dict(raw), mesh=runtime_mesh(runtime))
                accumulation = tried
                if plan.fits(runtime):
                    break
            report["training"].append({"recipe": recipe_name, "runtime": name, "grad_accum": accumulation,
                                       **plan.to_dict()})
            cells.append(f"{plan.total / GIB:.1f}, accumulation {accumulation}" if plan.fits(runtime) else
                         f"**no** ({plan.total / GIB:.1f} at one row per device)")
        lines.append(f"| `{recipe_name}` ({recipe.data.batch_size} x {recipe.data.seq_len}"
                     f"{', LoRA r ' + str(recipe.lora.rank) if recipe.lora.enabled else ''}) | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {OUT}")


if __name__ == "__main__":
    main()
