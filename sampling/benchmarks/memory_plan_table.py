"""Per-device memory of the published models on TPU runtimes, from `jaxdllm.memory_plan`
(shapes and sharding rules only: nothing is loaded or run). Writes
`sampling/results/memory_plan_tpu.json` and prints the Markdown tables that README.md and
training/README.md carry.

    python sampling/benchmarks/memory_plan_table.py
"""

from __future__ import annotations

from pathlib import Path

from jaxdllm import ModelConfig, SamplerConfig
from jaxdllm.memory_plan import (GIB, RUNTIMES, expected_experts_touched, runtime_mesh, sampling_plan,
                                 step_weight_bytes, training_plan)
from jaxdllm.shipped import recipe_path
from jaxdllm.train import TrainConfig
from sampling.benchmarks.report import write_report

OUT = Path(__file__).resolve().parents[1] / "results" / "memory_plan_tpu.json"

SAMPLING = [  # (model preset, sampler preset, weights: a dtype or int8)
    ("llada-8b", "llada", "bfloat16"), ("llada-8b", "fast-dllm-dual", "bfloat16"),
    ("dream-7b", "dream", "bfloat16"), ("qwen2.5-7b", "jacobi-forcing", "bfloat16"),
    ("llada-8b", "llada", "int8"), ("llada-8b", "fast-dllm-dual", "int8"),
    ("dream-7b", "dream", "int8"), ("qwen2.5-7b", "jacobi-forcing", "int8"),
    ("sdar-8b", "sdar", "bfloat16"), ("qwen3-8b", "sbd", "bfloat16"),
    ("sdar-8b", "sdar", "int8"), ("qwen3-8b", "sbd", "int8"),
    ("wedlm-7b", "wedlm", "bfloat16"), ("wedlm-7b", "wedlm", "int8"),
]
SAMPLING_RUNTIMES = ["v5e-1", "v6e-1", "v2-8", "v5e-8"]
# LLaDA2 (MoE): the published sampler, with and without the exact block cache (K/V of finished blocks).
MOE = [("llada2-mini", ["v5e-1", "v6e-1", "v5e-8"]), ("llada2-flash", ["v5p-8", "v5p-16", "v5e-16", "v5e-32"])]
MOE_PROMPT = 512
# DiffusionGemma-26B-A4B: the published sampler (one 256-token canvas after a 512-token prompt).
DIFFUSIONGEMMA = ("diffusiongemma-26b-a4b", ["v5e-1", "v6e-1", "v5e-8", "v5p-8", "v5e-16"])
TRAINING = [("llada8b_sft_gsm8k", "llada-8b"), ("llada8b_lora_gsm8k", "llada-8b"),
            ("dparallel_llada8b", "llada-8b"), ("dparallel_dream7b", "dream-7b"),
            ("jacobi_forcing_qwen2.5_7b", "qwen2.5-7b"), ("diffusiongemma_26b_lora_sft", "diffusiongemma-26b-a4b"),
            ("sdar_qwen3_8b", "qwen3-8b"), ("set_block_qwen3_8b", "qwen3-8b"), ("wedlm_qwen3_8b", "qwen3-8b")]
TRAINING_RUNTIMES = ["v5e-8", "v4-32", "v5p-8"]


def cell(plan, runtime) -> str:
    return f"{plan.total / GIB:.1f} {'fits' if plan.fits(runtime) else '**no**'}"


def moe_rows(report: dict) -> list[str]:
    """The LLaDA2 table: GiB per device, and the weight bytes one decoding step reads (batch 1 per device)."""
    lines = [f"| model, cache, weights (prompt {MOE_PROMPT} + 256, batch 1 per device) | runtime | weights / device "
             "| KV / device | total / device | fits | weights read per step (all devices) | HBM floor per step |",
             "|---|---|---|---|---|---|---|---|"]
    for model, runtimes in MOE:
        config = ModelConfig.preset(model)
        for cache in ("none", "block"):
            sampler = SamplerConfig.preset("llada2", cache=cache)
            for dtype in ("bfloat16", "int8"):
                for name in runtimes:
                    runtime = RUNTIMES[name]
                    mesh = runtime_mesh(runtime)
                    plan = sampling_plan(config, sampler, batch=runtime.devices, prompt_len=MOE_PROMPT, mesh=mesh,
                                         dtype=dtype)
                    # a step forwards the current block (block cache) or the whole canvas (no cache) of every row
                    tokens = runtime.devices * (sampler.block_length if cache == "block" else MOE_PROMPT + 256)
                    read = step_weight_bytes(config, tokens, dtype)
                    floor_ms = read / runtime.devices / (runtime.hbm_gbps * 1e9) * 1e3
                    report["moe"].append({"model": model, "cache": cache, "weights": dtype, "runtime": name,
                                          "tokens_per_step": tokens,
                                          "experts_touched_per_layer": expected_experts_touched(config, tokens),
                                          "weight_bytes_read_per_step": read, "hbm_floor_ms": floor_ms,
                                          **plan.to_dict()})
                    lines.append(f"| {model}, `{cache}`, {'bf16' if dtype == 'bfloat16' else dtype} | {name} | "
                                 f"{plan.terms['weights'] / GIB:.1f} | {plan.terms['kv_cache'] / GIB:.2f} | "
                                 f"{plan.total / GIB:.1f} | {'yes' if plan.fits(runtime) else '**no**'} | "
                                 f"{read / GIB:.1f} GiB ({expected_experts_touched(config, tokens):.0f} of "
                                 f"{config.experts.num_experts} experts per layer) | {floor_ms:.1f} ms |")
    return lines


def diffusiongemma_rows(report: dict) -> list[str]:
    """DiffusionGemma-26B-A4B: GiB per device with the `diffusiongemma` preset, bf16 and int8 (batch 1 per device)."""
    model, runtimes = DIFFUSIONGEMMA
    config, sampler = ModelConfig.preset(model), SamplerConfig.preset("diffusiongemma")
    lines = [f"| weights (prompt {MOE_PROMPT} + one 256-token canvas, batch 1 per device) | runtime | weights / device "
             "| KV / device | logits / device | total / device | fits | weights read per denoising step | HBM floor per step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for dtype in ("bfloat16", "int8"):
        for name in runtimes:
            runtime = RUNTIMES[name]
            plan = sampling_plan(config, sampler, batch=runtime.devices, prompt_len=MOE_PROMPT,
                                 mesh=runtime_mesh(runtime), dtype=dtype)
            tokens = runtime.devices * sampler.block_length  # a denoising step reads one canvas per row
            read = step_weight_bytes(config, tokens, dtype)
            floor_ms = read / runtime.devices / (runtime.hbm_gbps * 1e9) * 1e3
            report["diffusiongemma"].append({"model": model, "weights": dtype, "runtime": name,
                                             "tokens_per_step": tokens, "weight_bytes_read_per_step": read,
                                             "hbm_floor_ms": floor_ms, **plan.to_dict()})
            lines.append(f"| {'bf16' if dtype == 'bfloat16' else dtype} | {name} | {plan.terms['weights'] / GIB:.1f} | "
                         f"{plan.terms['kv_cache'] / GIB:.2f} | {plan.terms['logits'] / GIB:.2f} | "
                         f"{plan.total / GIB:.1f} | {'yes' if plan.fits(runtime) else '**no**'} | "
                         f"{read / GIB:.1f} GiB ({expected_experts_touched(config, tokens):.0f} of "
                         f"{config.experts.num_experts} experts per layer) | "
                         f"{f'{floor_ms:.1f} ms' if plan.fits(runtime) else '—'} |")
    return lines


def main():
    report = {"what": "per-device GiB from shapes and sharding rules (jaxdllm.memory_plan); fits = within 90 % "
                      "of one device's HBM", "sampling": [], "training": [], "moe": [], "diffusiongemma": []}
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
    print("\n".join(lines) + "\n")
    print("\n".join(moe_rows(report)) + "\n")
    print("\n".join(diffusiongemma_rows(report)))
    # the tables are on paper (shapes and sharding rules): the facts say which machine and jax computed them
    write_report(OUT, report)
    print(f"\nwrote {OUT}")


if __name__ == "__main__":
    main()
