"""The `jaxdllm` command line.

  jaxdllm generate [--model DIR] --prompt TEXT [--preset NAME] [overrides]
  jaxdllm eval [--model DIR] [--tasks copy,add] [--preset NAME]   accuracy and NFE on held-out task prompts
  jaxdllm inspect DIR                  config, parameter count and tensor check of a checkpoint
  jaxdllm convert SRC DST [--dtype D]  re-export a checkpoint (cast, re-shard, or to orbax)
  jaxdllm train RECIPE.toml [--workdir DIR] [--export DIR]   train, resuming from DIR if it holds checkpoints
  jaxdllm distill generate RECIPE.toml   the teacher's checked answers for distillation ([distill] section)
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from jaxdllm.models.config import DTYPES


def _parse_value(text: str):
    if "," in text:  # a list: data.tasks=copy,reverse
        return [_parse_value(part.strip()) for part in text.split(",") if part.strip()]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_sets(items: list[str] | None, sections: bool = False) -> dict:
    """`--set` overrides: `KEY=VALUE` -> `{key: value}`, or with `sections` `SECTION.KEY=VALUE` ->
    `{section: {key: value}}`. Values are read as int, float, true/false, else text; a value
    with commas is a list of such values."""
    from jaxdllm.errors import ConfigError

    out: dict = {}
    form = "SECTION.KEY=VALUE" if sections else "KEY=VALUE"
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        section, dot, name = key.partition(".")
        if not sep or not key or (sections and not (dot and section and name)):
            raise ConfigError(f"--set expects {form}, got {item!r}")
        if sections:
            out.setdefault(section, {})[name] = _parse_value(value.strip())
        else:
            out[key] = _parse_value(value.strip())
    return out


DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "checkpoints" / "tasks-llada-small"


def _model_dir(args) -> Path:
    from jaxdllm.errors import CheckpointError

    if args.model is not None:
        return Path(args.model)
    if not (DEFAULT_MODEL / "config.json").is_file():
        raise CheckpointError(f"no --model given and the shipped default {DEFAULT_MODEL} is missing "
                              "(it comes with a source checkout: pip install -e .)")
    return DEFAULT_MODEL


def _model_sampler_defaults(model_dir: Path) -> dict:
    """The checkpoint's own sampler defaults (`jaxdllm_sampler.json`), or {}."""
    from jaxdllm.checkpoint.hf_io import read_sampler_defaults

    return read_sampler_defaults(model_dir)


def _sampler_config(args, model_dir: Path | None = None):
    from jaxdllm.decoding import SamplerConfig
    from jaxdllm.errors import ConfigError

    overrides = _model_sampler_defaults(model_dir) if model_dir is not None else {}
    overrides.update(parse_sets(args.set))
    for name in ("gen_length", "block_length", "steps", "policy", "cache", "threshold", "temperature"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    unknown = sorted(set(overrides) - set(SamplerConfig.option_names()))
    if unknown:
        raise ConfigError(f"unknown sampler option(s) {unknown}; options: {list(SamplerConfig.option_names())}")
    return SamplerConfig.preset(args.preset, **overrides)


def _generate(args) -> int:
    import time

    import jax
    import numpy as np

    from jaxdllm.checkpoint.hf_io import from_pretrained
    from jaxdllm.decoding import generate
    from jaxdllm.tokenizer import Tokenizer, answer_length

    from jaxdllm.errors import ConfigError

    if not args.prompt.strip():
        raise ConfigError("--prompt is empty: give the text to continue")
    model_dir = _model_dir(args)
    config = _sampler_config(args, model_dir)  # bad options fail before any loading
    model = from_pretrained(model_dir)
    tok = Tokenizer.from_pretrained(model_dir)
    if tok.chat_template and not args.no_chat:
        ids = tok.apply_chat_template([{"role": "user", "content": args.prompt}], tokenize=True)
    else:
        ids = tok.encode(args.prompt)
    t0 = time.perf_counter()
    out = generate(model, np.asarray([ids], np.int32), config, key=jax.random.PRNGKey(args.seed))
    tokens = np.asarray(out.tokens[0, len(ids):])
    seconds = time.perf_counter() - t0
    print(tok.decode(tokens.tolist(), skip_special_tokens=True))
    nfe = int(out.nfe[0])
    answer = answer_length(tokens, model.config.eos_token_id)
    print(f"[nfe {nfe} | {answer} answer tokens of {len(tokens)} | {answer / nfe:.2f} answer tokens/forward "
          f"| {seconds:.2f}s incl. compile]", file=sys.stderr)
    return 0


def _eval(args) -> int:
    from jaxdllm.checkpoint import from_pretrained
    from jaxdllm.data import get_task
    from jaxdllm.decoding import SamplerConfig
    from jaxdllm.errors import ConfigError
    from jaxdllm.tokenizer import Tokenizer
    from jaxdllm.train.evaluate import evaluate_tasks
    from jaxdllm.validation import require_positive_int

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ConfigError("--tasks is empty: name one or more tasks, e.g. --tasks copy,add")
    for task in tasks:
        get_task(task)  # an unknown name lists the registered ones
    require_positive_int(args.n, "--n")
    model_dir = _model_dir(args)
    if args.preset is not None:
        samplers = {args.preset: _sampler_config(args, model_dir)}
    else:  # the model card's table: one token per step, and Fast-dLLM's threshold rule
        if args.set:
            raise ConfigError("--set needs --preset (the sampler it changes)")
        g = args.gen_length or _model_sampler_defaults(model_dir).get("gen_length", 16)
        samplers = {"llada": SamplerConfig.preset("llada", gen_length=g, block_length=g, steps=g),
                    "threshold": SamplerConfig.preset("fast-dllm-parallel", gen_length=g, block_length=g)}
    model, tokenizer = from_pretrained(model_dir, dtype="float32"), Tokenizer.from_pretrained(model_dir)
    results = {}
    for name, config in samplers.items():
        results[name] = evaluate_tasks(model, tokenizer, tasks, config, n=args.n)
        for r in results[name]:
            print(f"{name:10s} {r['task']:8s} accuracy {r['accuracy']:.3f}  NFE {r['mean_nfe']:.2f}  "
                  f"answer tokens/forward {r['answer_tokens_per_forward']:.2f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


def _inspect(args) -> int:
    from jaxdllm.checkpoint.hf_config import config_from_hf, read_config_json
    from jaxdllm.checkpoint.hf_io import verify_checkpoint

    directory = Path(args.path)
    config = config_from_hf(read_config_json(directory), where=str(directory / "config.json"))
    summary = {k: v for k, v in config.to_dict().items() if v is not None}
    summary["num_params"] = config.num_params
    summary["checked"] = verify_checkpoint(directory)  # headers, names and shapes; a truncated file fails
    if args.load:
        import jax.numpy as jnp

        from jaxdllm.checkpoint.hf_io import from_pretrained

        model = from_pretrained(directory)
        logits = model(jnp.zeros((1, 4), jnp.int32))
        summary["loaded"] = True
        summary["logits_finite"] = bool(jnp.isfinite(logits).all())
    print(json.dumps(summary, indent=2))
    return 0


def _convert(args) -> int:
    from jaxdllm.checkpoint.hf_io import from_pretrained, parse_size, save_pretrained
    from jaxdllm.checkpoint.orbax_io import save_state

    parse_size(args.max_shard_size)  # a bad size fails before the model is read

    model = from_pretrained(args.src, dtype=args.dtype)
    if args.orbax:
        out = save_state(model, args.dst)
    else:
        out = save_pretrained(model, args.dst, max_shard_size=args.max_shard_size, copy_files_from=args.src)
    print(f"wrote {out} ({model.config.num_params:,} parameters, {model.config.param_dtype})")
    return 0


def _recipe(args):
    """The recipe `args.recipe` with the `--set SECTION.KEY=VALUE` overrides applied."""
    from jaxdllm.train import TrainConfig

    config = TrainConfig.from_toml(args.recipe)
    if args.set:
        raw = config.to_dict()
        for section, values in parse_sets(args.set, sections=True).items():
            raw.setdefault(section, {}).update(values)
        config = TrainConfig.from_dict(raw)
    return config


def _train(args) -> int:
    import jax

    from jaxdllm.train import Trainer
    from jaxdllm.validation import require_positive_int

    if args.steps is not None:
        require_positive_int(args.steps, "--steps")
    if args.distributed:  # multi-host: coordinator address etc. from the environment (JAX's own rules)
        jax.distributed.initialize()
    raw_config = _recipe(args)
    trainer = Trainer(raw_config, workdir=args.workdir)
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
    trainer.close()
    return 0


def _distill_generate(args) -> int:
    import jax

    from jaxdllm.checkpoint.hf_config import read_config_json
    from jaxdllm.checkpoint.hf_io import from_pretrained, read_sampler_defaults
    from jaxdllm.errors import ConfigError
    from jaxdllm.tokenizer import Tokenizer
    from jaxdllm.train.distill import generate_answers, load_prompts
    from jaxdllm.train.setup import make_training_mesh

    if args.distributed:
        jax.distributed.initialize()
    config = _recipe(args)
    section = config.distill
    if section is None:
        raise ConfigError(f"recipe {args.recipe} has no [distill] section (teacher, prompts, sampler, out)")
    teacher = section.teacher or config.model.init_from
    if teacher is None:
        raise ConfigError("[distill] teacher is not set and [model] has no init_from: name the teacher checkpoint")
    out = args.out or section.out
    read_config_json(Path(teacher))  # a missing teacher fails first
    sampler = section.sampler_config(read_sampler_defaults(teacher))  # bad settings fail before loading
    examples = load_prompts(section)
    mesh = make_training_mesh(config.mesh)
    model = from_pretrained(teacher, dtype=section.dtype, mesh=mesh)
    tokenizer = Tokenizer.from_pretrained(teacher)
    stats = generate_answers(model, tokenizer, examples, sampler, out, batch_size=section.batch_size,
                             seed=section.seed, chat_template=section.chat_template,
                             progress=config.log.progress and not args.no_progress,
                             meta={"teacher": str(Path(teacher).resolve()), "source": section.source,
                                   "tasks": list(section.tasks) if section.source == "tasks" else None,
                                   "split": section.split})
    for task, s in stats["tasks"].items():
        print(f"{task:10s} answers {s['n']:6d}  kept {s['kept_rate']:.1%}  NFE {s['mean_nfe']:.2f}  "
              f"answer tokens/forward {s['answer_tokens_per_forward']:.2f}", flush=True)
    rate = stats["answers_per_s"]
    print(f"wrote {out}" + (f" ({rate:.1f} answers/s)" if rate else " (already complete)"), flush=True)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (exit 2), like every other error of the command line."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jaxdllm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("generate", help="decode a prompt with a diffusion LLM")
    p.add_argument("--model", default=None,
                   help="checkpoint directory (default: the shipped checkpoints/tasks-llada-small)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--preset", default="llada", help="sampler preset (see SamplerConfig.preset)")
    p.add_argument("--gen-length", dest="gen_length", type=int)
    p.add_argument("--block-length", dest="block_length", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--policy")
    p.add_argument("--cache")
    p.add_argument("--threshold", type=float)
    p.add_argument("--temperature", type=float)
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="any other SamplerConfig field")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    p.set_defaults(func=_generate)
    p = sub.add_parser("eval", help="accuracy, NFE and answer tokens per forward on held-out task-suite prompts")
    p.add_argument("--model", default=None,
                   help="checkpoint directory (default: the shipped checkpoints/tasks-llada-small)")
    p.add_argument("--tasks", default="copy,reverse,sort,add,perm,pick3", help="comma-separated task names")
    p.add_argument("--n", type=int, default=200, help="held-out prompts per task")
    p.add_argument("--preset", default=None,
                   help="evaluate this sampler preset only (default: the llada and threshold samplers of the card)")
    p.add_argument("--gen-length", dest="gen_length", type=int)
    for name in ("block_length", "steps", "policy", "cache", "threshold", "temperature"):
        p.set_defaults(**{name: None})
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a SamplerConfig field (with --preset)")
    p.add_argument("--out", help="write the results here as JSON")
    p.set_defaults(func=_eval)
    p = sub.add_parser("inspect", help="show a checkpoint's config and parameter count")
    p.add_argument("path", help="Hugging Face checkpoint directory")
    p.add_argument("--load", action="store_true", help="also load every tensor and run one forward")
    p.set_defaults(func=_inspect)
    p = sub.add_parser("convert", help="load a checkpoint and write it back (cast / re-shard / orbax)")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="parameter dtype (default: as stored)")
    p.add_argument("--max-shard-size", default="5GB", help="bytes per safetensors file, e.g. 2GB")
    p.add_argument("--orbax", action="store_true", help="write jaxdllm orbax state instead of safetensors")
    p.set_defaults(func=_convert)
    p = sub.add_parser("distill", help="distillation data: the teacher's checked answers (dParallel)")
    distill = p.add_subparsers(dest="distill_command", required=True)
    p = distill.add_parser("generate", help="the teacher answers the recipe's [distill] prompts; checked "
                                            "answers to JSONL (resumes an interrupted run)")
    p.add_argument("recipe", help="TOML recipe with a [distill] section")
    p.add_argument("--out", help="JSONL file to write (default: [distill] out)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a recipe value")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--distributed", action="store_true", help="call jax.distributed.initialize() first")
    p.set_defaults(func=_distill_generate)
    p = sub.add_parser("train", help="train or fine-tune from a recipe (training/*.toml)")
    p.add_argument("recipe", help="TOML recipe")
    p.add_argument("--workdir", help="checkpoints + metrics.jsonl (default: the recipe's [checkpoint] dir)")
    p.add_argument("--steps", type=int, help="train to this many steps instead of [train] steps")
    p.add_argument("--export", help="write the final model as a Hugging Face checkpoint here")
    p.add_argument("--export-dtype", choices=DTYPES, default=None)
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a recipe value")
    p.add_argument("--distributed", action="store_true", help="call jax.distributed.initialize() first")
    p.set_defaults(func=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    from jaxdllm.errors import CheckpointError, ConfigError, DataError, TrainingError

    args = build_parser().parse_args(argv)

    def one_line_warning(message, category, filename, lineno, file=None, line=None):
        print(f"jaxdllm {args.command}: warning: {message}", file=sys.stderr)

    warnings.showwarning = one_line_warning  # the library's warnings, without Python's source line
    try:
        return args.func(args)
    except (CheckpointError, ConfigError, DataError, TrainingError) as e:
        print(f"jaxdllm {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
