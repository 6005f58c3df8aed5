"""`jaxdllm distill`: distillation data from a teacher (checked answers, or every decoding state)
and Learn2PD's filter fitted to those states."""

from __future__ import annotations

from pathlib import Path

from jaxdllm.cli.common import recipe
from jaxdllm.distributed import add_arguments
from jaxdllm.output_paths import check_output_file
from jaxdllm.shipped import checkpoint_dir

NAME = "distill"
COMPILES = True
JOINS = True  # joins a multi-process job (`jaxdllm.distributed`) before it runs
RESUMES = "the same command resumes after the last finished batch"
MEMORY = "[distill] batch_size or the sampler's gen_length"  # what to lower when the device runs out of memory


def add_parser(sub) -> None:
    """The `distill` subcommand with its own subcommands (generate, trajectories, learn2pd)."""
    p = sub.add_parser(NAME, help="distillation data: the teacher's checked answers (dParallel) or its "
                                  "Jacobi trajectories (Jacobi Forcing, CLLM)")
    distill = p.add_subparsers(dest="distill_command", required=True)
    for name, about in (("generate", "the teacher answers the recipe's [distill] prompts; checked answers to JSONL "
                                     "(resumes an interrupted run)"),
                        ("trajectories", "the same with every decoding state recorded (Jacobi Forcing, CLLM: "
                                         "[distill] preset = \"jacobi\")")):
        p = distill.add_parser(name, help=about)
        p.add_argument("recipe", help="TOML recipe with a [distill] section (a file or a shipped recipe's name)")
        p.add_argument("--out", help="JSONL file to write (default: [distill] out)")
        p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a recipe value")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        add_arguments(p)
        p.set_defaults(func=run_generate)
    p = distill.add_parser("learn2pd", help="Learn2PD's filter from the recorded trajectories of a diffusion model "
                                           "([learn2pd] section); saved beside the model, where --preset learn2pd "
                                           "finds it")
    p.add_argument("recipe", help="TOML recipe with [distill] (the model, its trajectories) and [learn2pd]")
    p.add_argument("--out", help="filter file or folder (default: [learn2pd] out, else the model's folder)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a recipe value")
    p.set_defaults(func=run_learn2pd)


def run_generate(args) -> int:
    """`distill generate` and `distill trajectories`: the teacher's answers (and states) to JSONL."""
    from jaxdllm.checkpoint.hf_config import read_config_json
    from jaxdllm.checkpoint.hf_io import from_pretrained
    from jaxdllm.errors import ConfigError
    from jaxdllm.pretrained import sampler_defaults
    from jaxdllm.tokenizer import Tokenizer
    from jaxdllm.train.distill import generate_answers, load_prompts
    from jaxdllm.train.setup import make_training_mesh

    config = recipe(args)
    section = config.distill
    if section is None:
        raise ConfigError(f"recipe {args.recipe} has no [distill] section (teacher, prompts, sampler, out)")
    teacher = section.teacher or config.model.init_from
    if teacher is None:
        raise ConfigError("[distill] teacher is not set and [model] has no init_from: name the teacher checkpoint")
    out = args.out or section.out
    check_output_file(out, "--out" if args.out else "[distill] out")
    teacher = checkpoint_dir(teacher)  # a folder, or a shipped checkpoint's name
    read_config_json(teacher)  # a missing teacher fails first
    section.sampler_config()  # names an unknown [distill] sampler key
    sampler = sampler_defaults(teacher, section.preset, **section.sampler)  # bad settings fail before loading
    examples = load_prompts(section)
    mesh = make_training_mesh(config.mesh)
    model = from_pretrained(teacher, dtype=section.dtype, mesh=mesh)
    tokenizer = Tokenizer.from_pretrained(teacher)
    stats = generate_answers(model, tokenizer, examples, sampler, out, batch_size=section.batch_size,
                             seed=section.seed, chat_template=section.chat_template,
                             progress=config.log.progress and not args.no_progress,
                             meta={"teacher": str(Path(teacher).resolve()), "source": section.source,
                                   "tasks": list(section.tasks) if section.source == "tasks" else None,
                                   "split": section.split},
                             trajectories=args.distill_command == "trajectories")
    for task, s in stats["tasks"].items():
        print(f"{task:10s} answers {s['n']:6d}  kept {s['kept_rate']:.1%}  NFE {s['mean_nfe']:.2f}  "
              f"answer tokens/forward {s['answer_tokens_per_forward']:.2f}", flush=True)
    rate = stats["answers_per_s"]
    print(f"wrote {out}" + (f" ({rate:.1f} answers/s)" if rate else " (already complete)"), flush=True)
    return 0


def run_learn2pd(args) -> int:
    """`distill learn2pd`: fit and save the filter (`jaxdllm.train.distill.learn2pd.distill_learn2pd`)."""
    from jaxdllm.train.distill.learn2pd import distill_learn2pd

    saved = distill_learn2pd(recipe(args), args.recipe, args.out, log=lambda line: print(line, flush=True))
    print(f"wrote {saved} and {saved.with_suffix('.json')}", flush=True)
    return 0
