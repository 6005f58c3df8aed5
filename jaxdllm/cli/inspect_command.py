"""`jaxdllm inspect`: a checkpoint's config, parameter count and tensor check (and memory plans) as JSON."""

from __future__ import annotations

import json

from jaxdllm.models.run_options import WEIGHT_FORMATS

NAME = "inspect"
COMPILES = False
RESUMES = None
MEMORY = None


def add_parser(sub) -> None:
    """The `inspect` subcommand and its flags."""
    p = sub.add_parser(NAME, help="show a checkpoint's config and parameter count")
    p.add_argument("path", help="Hugging Face checkpoint directory or shipped name")
    p.add_argument("--load", action="store_true", help="also load every tensor and run one forward")
    p.add_argument("--plan", metavar="RUNTIMES", help="per-device memory of sampling on TPU runtimes: names "
                                                      "(v5e-1,v6e-1,v2-8,v5e-8,v4-32,v5p-8) or all")
    p.add_argument("--plan-preset", dest="plan_preset", default="fast-dllm-dual", help="sampler preset of --plan")
    p.add_argument("--plan-batch", dest="plan_batch", type=int, default=1,
                   help="rows of --plan (at least one per device)")
    p.add_argument("--plan-prompt", dest="plan_prompt", type=int, default=256, help="prompt length of --plan")
    p.add_argument("--plan-dtype", dest="plan_dtype", choices=WEIGHT_FORMATS, default=None,
                   help="weights of --plan: a float dtype or int8 (default: the checkpoint's)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Print the checkpoint's summary as JSON."""
    from jaxdllm.checkpoint.folder import Checkpoint
    from jaxdllm.checkpoint.hf_io import verify_checkpoint

    from jaxdllm.models.families.config_json import checkpoint_dtype
    from jaxdllm.models.run_options import RunOptions

    checkpoint = Checkpoint.open(args.path)  # the folder found and config.json parsed once
    directory, config = checkpoint.folder, checkpoint.config
    stored = checkpoint_dtype(checkpoint.raw_config)
    # What the model is, then how `from_pretrained` runs it by default (the weights' stored dtype).
    summary = {k: v for k, v in config.to_dict().items() if v is not None}
    summary["run_options"] = RunOptions(param_dtype=stored, dtype=stored).to_dict()
    summary["num_params"] = config.num_params
    if config.experts is not None:
        summary["active_params"] = config.active_params
    weights_present = any(directory.glob("*.safetensors")) or (directory / "model.safetensors.index.json").exists()
    if args.plan and not weights_present and not args.load:  # planning before a download: config.json is enough
        summary["checked"] = "config.json only: no weight files to check"
    else:
        summary["checked"] = verify_checkpoint(checkpoint)  # headers, names and shapes; a truncated file fails
    if args.load:
        import jax.numpy as jnp

        from jaxdllm.checkpoint.hf_io import from_pretrained

        model = from_pretrained(checkpoint)
        logits = model(jnp.zeros((1, 4), jnp.int32)).logits
        summary["run_options"] = model.options.to_dict()
        summary["loaded"] = True
        summary["logits_finite"] = bool(jnp.isfinite(logits).all())
    if args.plan:
        summary["memory_plan"] = memory_plans(config, args, default_dtype=stored)
    print(json.dumps(summary, indent=2))
    return 0


def memory_plans(config, args, default_dtype: str) -> dict:
    """`inspect --plan`: per-device bytes of sampling on each named runtime
    (`jaxdllm.memory_plan.runtime_plans`), with the weights in `--plan-dtype` or `default_dtype`."""
    from jaxdllm.decoding import SamplerConfig
    from jaxdllm.errors import ConfigError
    from jaxdllm.memory_plan import RUNTIMES, runtime_plans

    names = list(RUNTIMES) if args.plan == "all" else args.plan.split(",")
    unknown = [n for n in names if n not in RUNTIMES]
    if unknown:
        raise ConfigError(f"--plan: unknown runtime(s) {unknown}; known: {list(RUNTIMES)} or all")
    return runtime_plans(config, SamplerConfig.preset(args.plan_preset), names, batch=args.plan_batch,
                         prompt_len=args.plan_prompt, dtype=args.plan_dtype or default_dtype)
