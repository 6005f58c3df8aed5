"""The memory plan (`jaxdllm.memory_plan`) against XLA's own count on this machine.

For small models (a few million parameters, compiled on CPU in seconds) it compiles the
decoding loop per preset and a training step per recipe shape, reads
`compiled.memory_analysis()` (arguments + temporaries + outputs - donated), and writes both
numbers and their ratio to `sampling/results/memory_plan_check.json`.

    python sampling/benchmarks/memory_plan_check.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax

from jaxdllm import ModelConfig, SamplerConfig, sharding
from jaxdllm.decoding import Sampler
from jaxdllm.lowering import abstract_model, lower_train_step
from jaxdllm.memory_plan import sampling_plan, training_plan
from jaxdllm.train import TrainConfig
from sampling.benchmarks.report import write_report

OUT = Path(__file__).resolve().parents[1] / "results" / "memory_plan_check.json"

# (label, model overrides): widths and depths that move the weight / activation balance.
MODELS = [
    ("e256-m1024-l4", dict(embed_dim=256, mlp_dim=1024, num_layers=4, num_heads=4, num_kv_heads=4, head_dim=64)),
    ("e512-m1408-l2-gqa", dict(embed_dim=512, mlp_dim=1408, num_layers=2, num_heads=8, num_kv_heads=2, head_dim=64)),
    ("e128-m512-l8", dict(embed_dim=128, mlp_dim=512, num_layers=8, num_heads=2, num_kv_heads=2, head_dim=64)),
]
# (preset, the model family's preset, {role: preset of the second model the loop runs}): every canvas,
# SpecDiff's drafter and APD's verifier included. DiffusionGemma's layers take their own sizes (DG_SIZES).
SAMPLERS = [("llada", "tiny-llada", {}), ("fast-dllm-dual", "tiny-llada", {}), ("dparallel", "tiny-llada", {}),
            ("freedave", "tiny-llada", {}), ("apd", "tiny-llada", {"verifier": "tiny-qwen2"}),
            ("jacobi", "tiny-qwen2", {}), ("specdiff", "tiny-qwen2", {"drafter": "tiny-llada"}),
            ("diffusiongemma", "tiny-diffusiongemma", {})]
DG_SIZES = dict(embed_dim=256, mlp_dim=1024, vocab_size=1024, block_size=256)  # the published 256-token canvas
TRAINING = [("mdm_sft", {}), ("certainty_forcing", {}), ("mdm_sft+lora16", {"lora": {"rank": 16}})]


def xla_bytes(compiled) -> dict:
    m = compiled.memory_analysis()
    total = m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
    return {"arguments": m.argument_size_in_bytes, "temporaries": m.temp_size_in_bytes,
            "outputs": m.output_size_in_bytes, "donated": m.alias_size_in_bytes, "total": total}


def model_config(overrides: dict, preset: str = "tiny-llada") -> ModelConfig:
    if preset == "tiny-diffusiongemma":
        return ModelConfig.preset(preset, max_position=1024, **DG_SIZES)
    return ModelConfig.preset(preset, max_position=1024, **overrides)


def run(quick: bool = False) -> dict:
    rows = []
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    for label, overrides in MODELS[:1] if quick else MODELS:
        config = model_config(overrides)  # float32 (the default run options)
        for preset, family, second in SAMPLERS[:2] if quick else SAMPLERS:
            if family == "tiny-diffusiongemma" and label != MODELS[0][0]:
                continue  # DiffusionGemma's own sizes: one row
            decoded = model_config(overrides, family)
            canvas_length = {"block_length": decoded.block_size} if family == "tiny-diffusiongemma" else {}
            sampler = SamplerConfig.preset(preset, gen_length=256, **canvas_length)
            companions = {role: model_config(overrides, name) for role, name in second.items()}
            params = abstract_model(next(iter(companions.values()))) if companions else None
            xla = xla_bytes(Sampler(abstract_model(decoded)).lower((4, 128), sampler, policy_params=params).compile())
            plan = sampling_plan(decoded, sampler, batch=4, prompt_len=128, platform="cpu", companions=companions)
            rows.append({"model": label if family != "tiny-diffusiongemma" else "diffusiongemma e256-m1024-v1024-c256",
                         "program": f"sampling {preset} ({sampler.canvas.name})", "xla": xla, "plan": plan.to_dict(),
                         "ratio": plan.total / xla["total"]})
        for name, section in TRAINING[:1] if quick else TRAINING:
            recipe = TrainConfig.from_dict({"model": {"preset": "tiny-llada"}, "objective": {"kind": name.split("+")[0]},
                                            "data": {"batch_size": 8, "seq_len": 128}, **section})
            xla = xla_bytes(lower_train_step(recipe, config, mesh, rows=8, seq_len=128).compile())
            plan = training_plan(config, recipe, platform="cpu")
            rows.append({"model": label, "program": f"training {name}", "xla": xla, "plan": plan.to_dict(),
                         "ratio": plan.total / xla["total"]})
    return {"what": "memory plan total / XLA memory_analysis total (arguments + temporaries + outputs - donated), "
                    "CPU, float32, batch 4 x (128 + 256) for sampling (the presets' block lengths rescaled to 256 "
                    "tokens; second models counted), 8 x 128 for training",
            "rows": rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    report = write_report(args.out, run())  # JSON only: one ratio per row
    for r in report["rows"]:
        print(f"{r['model']:20s} {r['program']:30s} plan {r['plan']['total_bytes'] / 2**20:8.1f} MiB  "
              f"XLA {r['xla']['total'] / 2**20:8.1f} MiB  ratio {r['ratio']:.3f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
