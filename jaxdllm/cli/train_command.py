"""`jaxdllm train`: train or fine-tune from a recipe, resuming from the work folder's checkpoints."""

from __future__ import annotations

from jaxdllm.cli.common import recipe
from jaxdllm.distributed import add_arguments
from jaxdllm.models.run_options import DTYPES
from jaxdllm.output_paths import check_output_dir

NAME = "train"
COMPILES = True
JOINS = True  # joins a multi-process job (`jaxdllm.distributed`) before it runs
RESUMES = "the same command resumes from the last checkpoint"
# what to lower when the device runs out of memory
MEMORY = "[data] batch_size or seq_len (--set data.batch_size=...), or use a larger [mesh]"


def add_parser(sub) -> None:
    """The `train` subcommand and its flags."""
    p = sub.add_parser(NAME, help="train or fine-tune from a recipe (training/*.toml)")
    p.add_argument("recipe", help="TOML recipe: a file, or a shipped recipe's name (tasks_tiny_cpu)")
    p.add_argument("--workdir", help="checkpoints + metrics.jsonl (default: the recipe's [checkpoint] dir)")
    p.add_argument("--steps", type=int, help="train to this many steps instead of [train] steps")
    p.add_argument("--export", help="write the final model as a Hugging Face checkpoint here")
    p.add_argument("--export-dtype", choices=DTYPES, default=None)
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a recipe value")
    add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Train to `--steps` (or the recipe's), then export when asked."""
    from jaxdllm.train import Trainer
    from jaxdllm.validation import require_positive_int

    if args.steps is not None:
        require_positive_int(args.steps, "--steps")
    raw_config = recipe(args)
    workdir = args.workdir or raw_config.checkpoint.dir
    if workdir:  # where checkpoints and the export go is checked before anything is built
        check_output_dir(workdir, "--workdir" if args.workdir else "[checkpoint] dir")
    if args.export:
        check_output_dir(args.export, "--export")
    trainer = Trainer(raw_config, workdir=args.workdir)
    try:
        total = args.steps or raw_config.train.steps
        if trainer.restore():
            if trainer.step == total:
                print(f"the run in {trainer.workdir} is already complete (step {total}); nothing to train", flush=True)
            else:
                print(f"resumed from step {trainer.step} in {trainer.workdir}", flush=True)
        history = trainer.train(steps=total)
        if history:
            last = history[-1]
            print(f"step {last['step']}: loss {last['loss']:.4f}, {last['tokens_per_s']:.0f} tokens/s", flush=True)
        if args.export:
            out = trainer.export(args.export, dtype=args.export_dtype)
            print(f"exported {out} (step {trainer.step})")
    finally:  # also on an interrupt: pending checkpoint writes finish and the folder lock is released
        trainer.close()
    return 0
