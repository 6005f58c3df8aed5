"""The `jaxdllm` command line.

  jaxdllm generate [--model DIR] --prompt TEXT [--preset NAME] [overrides]
  jaxdllm eval [--model DIR] [--tasks suite,gsm8k] [--preset P --sweep k=v1,v2]   accuracy, NFE, tokens/s; JSON + PNG
  jaxdllm inspect DIR                  config, parameter count and tensor check of a checkpoint
  jaxdllm convert SRC DST [--dtype D]  re-export a checkpoint (cast, re-shard, or to orbax)
  jaxdllm train RECIPE.toml [--workdir DIR] [--export DIR]   train, resuming from DIR if it holds checkpoints
  jaxdllm distill generate RECIPE.toml   the teacher's checked answers for distillation ([distill] section)
  jaxdllm distill trajectories RECIPE.toml   ... with every decoding state (Jacobi Forcing, CLLM, Learn2PD)
  jaxdllm distill learn2pd RECIPE.toml       Learn2PD's filter from those states, saved beside the model

The commands that compile (generate, eval, train, distill) use JAX's persistent compilation cache
in `~/.cache/jaxdllm/xla` (`$JAXDLLM_COMPILATION_CACHE` names another folder, `off` turns it off):
see `jaxdllm/compilation_cache.py`.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from jaxdllm.models.config import DTYPES, QUANTIZATIONS, WEIGHT_FORMATS
from jaxdllm.output_paths import check_output_dir, check_output_file
from jaxdllm.shipped import checkpoint_dir, shipped_checkpoint


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


DEFAULT_MODEL_NAME = "tasks-llada-small"
# The shipped folder, whatever the working folder holds (see jaxdllm.shipped).
DEFAULT_MODEL = shipped_checkpoint(DEFAULT_MODEL_NAME) or Path("checkpoints") / DEFAULT_MODEL_NAME


def _model_dir(args) -> Path:
    """`--model` (a folder or a shipped name), else the shipped default."""
    from jaxdllm.errors import CheckpointError
    from jaxdllm.shipped import shipped_hint

    if args.model is not None:
        return checkpoint_dir(args.model)
    if not (DEFAULT_MODEL / "config.json").is_file():
        raise CheckpointError(f"no --model given and the shipped default {DEFAULT_MODEL_NAME} is missing "
                              f"({shipped_hint()})")
    return DEFAULT_MODEL


def _sampler_config(args, model_dir: Path):
    """The checkpoint's sampler defaults (`jaxdllm.sampler_defaults`) with `--preset`, `--set` and the flags."""
    from jaxdllm.decoding import SamplerConfig
    from jaxdllm.errors import ConfigError
    from jaxdllm.pretrained import sampler_defaults

    overrides = parse_sets(args.set)
    for name in ("gen_length", "block_length", "steps", "policy", "cache", "threshold", "temperature"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    unknown = sorted(set(overrides) - set(SamplerConfig.option_names()))
    if unknown:
        raise ConfigError(f"unknown sampler option(s) {unknown}; options: {list(SamplerConfig.option_names())}")
    return sampler_defaults(model_dir, args.preset, **overrides)


def _warn_cache_notes(model_dir: Path, configs) -> None:
    """One warning per flagged cache: what the checkpoint's card measured with it."""
    from jaxdllm.pretrained import cache_note

    for name in sorted({c.cache.name for c in configs}):
        note = cache_note(model_dir, next(c for c in configs if c.cache.name == name))
        if note:
            warnings.warn(f"cache {name!r} on {model_dir.name}: {note}")


def _generate(args) -> int:
    import time

    import jax
    import numpy as np

    from jaxdllm.checkpoint.hf_io import from_pretrained
    from jaxdllm.decoding import generate
    from jaxdllm.pretrained import policy_params
    from jaxdllm.tokenizer import Tokenizer, answer_length

    from jaxdllm.errors import ConfigError

    if not args.prompt.strip():
        raise ConfigError("--prompt is empty: give the text to continue")
    model_dir = _model_dir(args)
    config = _sampler_config(args, model_dir)  # bad options fail before any loading
    _warn_cache_notes(model_dir, [config])
    params = policy_params(model_dir, config)  # e.g. Learn2PD's filter beside the model
    model = from_pretrained(model_dir, quantization=args.quantize)
    tok = Tokenizer.from_pretrained(model_dir)
    if not args.allow_unk:
        tok.check_known(args.prompt)
    if tok.chat_template and not args.no_chat:
        ids = tok.apply_chat_template([{"role": "user", "content": args.prompt}], tokenize=True)
    else:
        ids = tok.encode(args.prompt)
    t0 = time.perf_counter()
    out = generate(model, np.asarray([ids], np.int32), config, key=jax.random.PRNGKey(args.seed),
                   policy_params=params)
    tokens = np.asarray(out.tokens[0, len(ids):])
    seconds = time.perf_counter() - t0
    print(tok.decode(tokens.tolist(), skip_special_tokens=True))
    nfe = int(out.nfe[0])
    answer = answer_length(tokens, model.config.eos_token_id)
    print(f"[nfe {nfe} | {answer} answer tokens of {len(tokens)} | {answer / nfe:.2f} answer tokens/forward "
          f"| {seconds:.2f}s incl. compile]", file=sys.stderr)
    return 0


def _eval_samplers(args, model_dir: Path) -> dict:
    """The labelled sampler settings of `jaxdllm eval` (validated before the model is loaded)."""
    from jaxdllm.decoding import SamplerConfig
    from jaxdllm.errors import ConfigError
    from jaxdllm.eval import sampler_settings

    from jaxdllm.pretrained import checkpoint_settings

    sweep = parse_sets(args.sweep)
    sweep = {k: v if isinstance(v, list) else [v] for k, v in sweep.items()}
    preset, defaults = checkpoint_settings(model_dir, args.preset)
    if args.preset is None:  # the model card's table: one token per step, and Fast-dLLM's threshold rule
        if args.set or sweep:
            raise ConfigError("--set and --sweep need --preset (the sampler they change)")
        g = args.gen_length or defaults.get("gen_length", 16)
        if preset == "jacobi":  # a causal model: AR, then Jacobi Forcing's decoding
            n = min(defaults.get("block_length", 16), g)
            return {"ar": SamplerConfig.preset("jacobi", gen_length=g, block_length=1),
                    "jacobi": SamplerConfig.preset("jacobi", gen_length=g, block_length=n),
                    "jacobi-mr": SamplerConfig.preset("jacobi-forcing", gen_length=g, block_length=n)}
        return {"llada": SamplerConfig.preset("llada", gen_length=g, block_length=g, steps=g),
                "threshold": SamplerConfig.preset("fast-dllm-parallel", gen_length=g, block_length=g)}
    sets = parse_sets(args.set)
    if args.gen_length is not None:
        if "gen_length" in sets and sets["gen_length"] != args.gen_length:
            raise ConfigError("--gen-length and --set gen_length disagree: keep one")
        sets["gen_length"] = args.gen_length
    clash = sorted(set(sets) & set(sweep))
    if clash:
        flag = "--gen-length" if clash[0] == "gen_length" and args.gen_length is not None else "--set"
        raise ConfigError(f"{clash[0]} is both set ({flag}) and swept (--sweep): keep one")
    # the checkpoint's settings come first; a new gen_length rescales its block length and steps
    return sampler_settings(args.preset, sets, sweep, base=defaults)


def default_eval_dir(model_dir: Path, quantization: str | None = None) -> Path:
    """`runs/eval/<model folder name>-<8 hex of its full path>[-int8]`: two models both called
    `model` (in different folders), or one model in float and int8, do not share a results folder."""
    import hashlib

    where = str(model_dir.resolve())
    name = f"{model_dir.resolve().name}-{hashlib.sha1(where.encode()).hexdigest()[:8]}"
    return Path("runs") / "eval" / (name + (f"-{quantization}" if quantization else ""))


def _eval(args) -> int:
    from jaxdllm.checkpoint import from_pretrained
    from jaxdllm.errors import ConfigError
    from jaxdllm.eval import evaluate, resolve_tasks
    from jaxdllm.eval.evaluate import weights_version
    from jaxdllm.pretrained import policy_params
    from jaxdllm.tokenizer import Tokenizer
    from jaxdllm.validation import require_positive_int

    n = None if args.n == "all" else _parse_value(args.n)
    if n is not None:
        require_positive_int(n, "--n")
    require_positive_int(args.batch_size, "--batch-size")
    tasks = resolve_tasks(args.tasks, gsm8k_shots=args.shots, gsm8k_chat=not args.no_chat,
                          gsm8k_path=args.gsm8k_dir)
    if n is None and any(t.name != "gsm8k" for t in tasks):
        raise ConfigError("--n all only applies to GSM8K; the suite tasks need a number of prompts")
    model_dir = _model_dir(args)
    samplers = _eval_samplers(args, model_dir)
    _warn_cache_notes(model_dir, list(samplers.values()))
    params = {label: policy_params(model_dir, config) for label, config in samplers.items()}
    out = Path(args.out) if args.out else default_eval_dir(model_dir, args.quantize)
    if out.suffix == ".json":
        raise ConfigError(f"--out is a directory (eval.json, pareto.png and items.jsonl go inside), got {out}")
    check_output_dir(out, "--out" if args.out else "the default results folder")
    model = from_pretrained(model_dir, dtype="float32", quantization=args.quantize)
    tokenizer = Tokenizer.from_pretrained(model_dir)
    version = weights_version(model_dir) + (f"-{args.quantize}" if args.quantize else "")
    evaluate(model, tokenizer, tasks, samplers, n=n, seed=args.seed, batch_size=args.batch_size, out=out,
             model_id=str(model_dir.resolve()), model_version=version, policy_params=params,
             progress=not args.no_progress,
             log=lambda line: print(line, flush=True))
    written = [out / name for name in ("eval.json", "pareto.png") if (out / name).is_file()]
    print(f"wrote {' and '.join(map(str, written))}", flush=True)
    return 0


def _inspect(args) -> int:
    from jaxdllm.checkpoint.hf_config import config_from_hf, read_config_json
    from jaxdllm.checkpoint.hf_io import verify_checkpoint

    directory = Path(args.path)
    config = config_from_hf(read_config_json(directory), where=str(directory / "config.json"))
    summary = {k: v for k, v in config.to_dict().items() if v is not None}
    summary["num_params"] = config.num_params
    if config.num_experts:
        summary["active_params"] = config.active_params
    weights_present = any(directory.glob("*.safetensors")) or (directory / "model.safetensors.index.json").exists()
    if args.plan and not weights_present and not args.load:  # planning before a download: config.json is enough
        summary["checked"] = "config.json only: no weight files to check"
    else:
        summary["checked"] = verify_checkpoint(directory)  # headers, names and shapes; a truncated file fails
    if args.load:
        import jax.numpy as jnp

        from jaxdllm.checkpoint.hf_io import from_pretrained

        model = from_pretrained(directory)
        logits = model(jnp.zeros((1, 4), jnp.int32)).logits
        summary["loaded"] = True
        summary["logits_finite"] = bool(jnp.isfinite(logits).all())
    if args.plan:
        summary["memory_plan"] = _memory_plans(config, args)
    print(json.dumps(summary, indent=2))
    return 0


def _memory_plans(config, args) -> dict:
    """`inspect --plan`: per-device bytes of sampling on each named runtime (`jaxdllm.memory_plan`)."""
    from jaxdllm.decoding import SamplerConfig
    from jaxdllm.errors import ConfigError
    from jaxdllm.memory_plan import GIB, RUNTIMES, runtime_mesh, sampling_plan

    names = list(RUNTIMES) if args.plan == "all" else args.plan.split(",")
    unknown = [n for n in names if n not in RUNTIMES]
    if unknown:
        raise ConfigError(f"--plan: unknown runtime(s) {unknown}; known: {list(RUNTIMES)} or all")
    sampler = SamplerConfig.preset(args.plan_preset)
    out = {}
    for name in names:
        runtime = RUNTIMES[name]
        batch = max(args.plan_batch, runtime.devices)
        plan = sampling_plan(config, sampler, batch=batch, prompt_len=args.plan_prompt,
                             mesh=runtime_mesh(runtime), dtype=args.plan_dtype)
        out[name] = {"hbm_gib_per_device": runtime.hbm_gib, "fits": plan.fits(runtime),
                     **{f"{k}_gib": round(v / GIB, 2) for k, v in plan.terms.items()},
                     "total_gib": round(plan.total / GIB, 2), "batch": batch, "mesh": plan.mesh}
    return out


def _convert(args) -> int:
    from jaxdllm.checkpoint.hf_io import from_pretrained, parse_size, save_pretrained
    from jaxdllm.checkpoint.orbax_io import save_state

    parse_size(args.max_shard_size)  # a bad size and an unwritable DST fail before the model is read
    check_output_dir(args.dst, "DST")

    model = from_pretrained(args.src, dtype=args.dtype)
    if args.orbax:
        out = save_state(model, args.dst)
    else:
        out = save_pretrained(model, args.dst, max_shard_size=args.max_shard_size, copy_files_from=args.src)
    print(f"wrote {out} ({model.config.num_params:,} parameters, {model.config.param_dtype})")
    return 0


def _recipe(args):
    """The recipe `args.recipe` with the `--set SECTION.KEY=VALUE` overrides applied."""
    from jaxdllm.shipped import recipe_path
    from jaxdllm.train import TrainConfig

    config = TrainConfig.from_toml(recipe_path(args.recipe))
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


def _distill_generate(args) -> int:
    import jax

    from jaxdllm.checkpoint.hf_config import read_config_json
    from jaxdllm.checkpoint.hf_io import from_pretrained
    from jaxdllm.errors import ConfigError
    from jaxdllm.pretrained import sampler_defaults
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


def _distill_learn2pd(args) -> int:
    from jaxdllm.checkpoint.hf_io import from_pretrained
    from jaxdllm.decoding.policies.learn2pd import FILTER_FILE, save_filter
    from jaxdllm.errors import ConfigError, DataError
    from jaxdllm.eval.evaluate import weights_version
    from jaxdllm.train.config import Learn2PDSection
    from jaxdllm.train.distill.learn2pd import fit_filter, read_trajectories, trajectory_settings

    config = _recipe(args)
    if config.distill is None:
        raise ConfigError(f"recipe {args.recipe} has no [distill] section: it names the model (teacher) and the "
                          "prompts whose trajectories train the filter")
    section = config.learn2pd or Learn2PDSection()
    teacher = checkpoint_dir(config.distill.teacher or config.model.init_from)
    path = Path(section.trajectories or config.distill.out)
    if not path.is_file():
        raise DataError(f"no trajectories at {path}: record them first with `jaxdllm distill trajectories "
                        f"{args.recipe}`")
    settings = trajectory_settings(path)
    if settings["policy"]["name"] in ("jacobi", "lookahead"):
        raise ConfigError(f"{path} holds draft-and-verify trajectories; Learn2PD's oracle traces are a diffusion "
                          "model's decoding ([distill] preset = \"llada\")")
    target = Path(args.out or section.out or teacher)
    target = target if target.suffix == ".safetensors" else target / FILTER_FILE  # a folder: the file inside
    check_output_file(target, "--out" if args.out else "[learn2pd] out")
    model = from_pretrained(teacher, dtype=config.distill.dtype)
    records = read_trajectories(path)
    # the replayed features, kept beside the trajectories per model weights and dtype: another
    # filter setting (hidden, steps, lr) on the same traces skips the replay
    cache = path.with_name(f"{path.stem}.oracle-{weights_version(teacher)}-{config.distill.dtype or 'stored'}.npz")
    module, report = fit_filter(model, records, settings["block_length"], hidden=section.hidden, steps=section.steps,
                                batch_size=section.batch_size, lr=section.lr, held_out=section.held_out,
                                seed=section.seed, thresholds=section.thresholds, cache=cache,
                                log=lambda line: print(line, flush=True))
    report.update(model=teacher.name, weights=weights_version(teacher), trajectories=str(path),
                  trajectory_sampler=settings)
    saved = save_filter(module, target, model=teacher.name, weights=weights_version(teacher),
                        trained_on=f"{len(records)} prompts of {path.name} ({settings['policy']['name']}, "
                                   f"gen_length {settings['gen_length']})")
    saved.with_suffix(".json").write_text(json.dumps(report, indent=1))
    print(f"wrote {saved} and {saved.with_suffix('.json')}", flush=True)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (exit 2), like every other error of the command line."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jaxdllm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("generate", help="decode a prompt with a diffusion LLM")
    p.add_argument("--model", default=None,
                   help="checkpoint folder or shipped name (default: the shipped tasks-llada-small)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--quantize", choices=QUANTIZATIONS, default=None,
                   help="weight-only int8 for the linear layers and LM head, quantized as the weights load")
    p.add_argument("--preset", default=None,
                   help="sampler preset (see SamplerConfig.preset; default: the checkpoint's own settings, "
                        "llada for a diffusion model, jacobi for a causal one)")
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
    p.add_argument("--allow-unk", dest="allow_unk", action="store_true",
                   help="decode characters the tokenizer does not know as its unk token instead of stopping")
    p.set_defaults(func=_generate)
    p = sub.add_parser("eval", help="accuracy, NFE, tokens per forward, tokens/s and latency per task; "
                                    "sweeps; JSON + Pareto PNG; resumable")
    p.add_argument("--model", default=None,
                   help="checkpoint folder or shipped name (default: the shipped tasks-llada-small)")
    p.add_argument("--tasks", default="suite",
                   help="comma-separated: suite task names, the groups 'suite', 'long' and 'parallelbench', 'gsm8k'")
    p.add_argument("--n", default="200", help="prompts per task (GSM8K: the first n of the test split, or 'all')")
    p.add_argument("--seed", type=int, default=1234, help="draw of the held-out suite prompts")
    p.add_argument("--preset", default=None,
                   help="evaluate this sampler preset (default: the llada and threshold samplers of the card)")
    p.add_argument("--gen-length", dest="gen_length", type=int)
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a SamplerConfig field (with --preset)")
    p.add_argument("--sweep", action="append", metavar="KEY=V1,V2,...",
                   help="evaluate every value (several --sweep: every combination)")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=100, help="prompts per generate call")
    p.add_argument("--quantize", choices=QUANTIZATIONS, default=None,
                   help="weight-only int8 for the linear layers and LM head, quantized as the weights load")
    p.add_argument("--shots", type=int, default=0, help="GSM8K: few-shot exemplars from the train split")
    p.add_argument("--no-chat", action="store_true", help="GSM8K: plain 'Question: ... Answer:' prompts "
                                                          "even when the tokenizer has a chat template")
    p.add_argument("--gsm8k-dir", dest="gsm8k_dir", default=None,
                   help="directory with GSM8K's test.jsonl (default: $JAXDLLM_GSM8K_DIR, else the shipped copy)")
    p.add_argument("--out", help="results directory: eval.json, pareto.png, items.jsonl (a rerun resumes); "
                                 "default runs/eval/<model name>-<hash of its path>")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_eval)
    p = sub.add_parser("inspect", help="show a checkpoint's config and parameter count")
    p.add_argument("path", help="Hugging Face checkpoint directory")
    p.add_argument("--load", action="store_true", help="also load every tensor and run one forward")
    p.add_argument("--plan", metavar="RUNTIMES", help="per-device memory of sampling on TPU runtimes: names "
                                                      "(v5e-1,v6e-1,v2-8,v5e-8,v4-32,v5p-8) or all")
    p.add_argument("--plan-preset", dest="plan_preset", default="fast-dllm-dual", help="sampler preset of --plan")
    p.add_argument("--plan-batch", dest="plan_batch", type=int, default=1,
                   help="rows of --plan (at least one per device)")
    p.add_argument("--plan-prompt", dest="plan_prompt", type=int, default=256, help="prompt length of --plan")
    p.add_argument("--plan-dtype", dest="plan_dtype", choices=WEIGHT_FORMATS, default=None,
                   help="weights of --plan: a float dtype or int8 (default: the checkpoint's)")
    p.set_defaults(func=_inspect)
    p = sub.add_parser("convert", help="load a checkpoint and write it back (cast / re-shard / orbax)")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="parameter dtype (default: as stored)")
    p.add_argument("--max-shard-size", default="5GB", help="bytes per safetensors file, e.g. 2GB")
    p.add_argument("--orbax", action="store_true", help="write jaxdllm orbax state instead of safetensors")
    p.set_defaults(func=_convert)
    p = sub.add_parser("distill", help="distillation data: the teacher's checked answers (dParallel) or its "
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
        p.add_argument("--distributed", action="store_true", help="call jax.distributed.initialize() first")
        p.set_defaults(func=_distill_generate)
    p = distill.add_parser("learn2pd", help="Learn2PD's filter from the recorded trajectories of a diffusion model "
                                           "([learn2pd] section); saved beside the model, where --preset learn2pd "
                                           "finds it")
    p.add_argument("recipe", help="TOML recipe with [distill] (the model, its trajectories) and [learn2pd]")
    p.add_argument("--out", help="filter file or folder (default: [learn2pd] out, else the model's folder)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a recipe value")
    p.set_defaults(func=_distill_learn2pd)
    p = sub.add_parser("train", help="train or fine-tune from a recipe (training/*.toml)")
    p.add_argument("recipe", help="TOML recipe: a file, or a shipped recipe's name (tasks_tiny_cpu)")
    p.add_argument("--workdir", help="checkpoints + metrics.jsonl (default: the recipe's [checkpoint] dir)")
    p.add_argument("--steps", type=int, help="train to this many steps instead of [train] steps")
    p.add_argument("--export", help="write the final model as a Hugging Face checkpoint here")
    p.add_argument("--export-dtype", choices=DTYPES, default=None)
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a recipe value")
    p.add_argument("--distributed", action="store_true", help="call jax.distributed.initialize() first")
    p.set_defaults(func=_train)
    return parser


COMPILING_COMMANDS = ("generate", "eval", "train", "distill")


RESUMES = {"train": "the same command resumes from the last checkpoint",
           "eval": "the same command resumes after the last finished batch",
           "distill": "the same command resumes after the last finished batch"}
# What to lower when a command runs the device out of memory.
MEMORY_SETTINGS = {"generate": "--gen-length or the prompt",
                   "eval": "--batch-size or --gen-length",
                   "train": "[data] batch_size or seq_len (--set data.batch_size=...), or use a larger [mesh]",
                   "distill": "[distill] batch_size or the sampler's gen_length"}


def _interrupted(command: str, e: KeyboardInterrupt) -> int:
    """One line for Ctrl-C or SIGTERM: what was kept and how to go on; exit 130 or 143."""
    import signal

    from jaxdllm.interrupts import signal_number

    kept = getattr(e, "kept", "")
    line = "interrupted" + ("" if not kept else f" {kept}" if kept.startswith("at ") else f"; {kept}")
    if command in RESUMES:
        line += f"; {RESUMES[command]}"
    print(f"jaxdllm {command}: {line}", file=sys.stderr)
    return 143 if signal_number(e) == signal.SIGTERM else 130


def main(argv: list[str] | None = None) -> int:
    """Run the command line; exit codes: 0 done, 2 an error the user can fix (one line on stderr;
    `--debug` shows the traceback), 130 interrupted (Ctrl-C), 143 stopped by SIGTERM."""
    from jaxdllm.errors import DeviceMemoryError, JaxdllmError, out_of_memory_message
    from jaxdllm.interrupts import terminate_as_interrupt

    args = build_parser().parse_args(argv)

    def one_line_warning(message, category, filename, lineno, file=None, line=None):
        print(f"jaxdllm {args.command}: warning: {message}", file=sys.stderr)

    warnings.showwarning = one_line_warning  # the library's warnings, without Python's source line
    if args.command in COMPILING_COMMANDS:  # a second run of the same shapes loads its programs
        from jaxdllm.compilation_cache import enable_compilation_cache

        enable_compilation_cache()
    try:
        with terminate_as_interrupt():  # `kill` stops a run as Ctrl-C does: finished work kept, one line
            return args.func(args)
    except KeyboardInterrupt as e:
        if args.debug:
            raise
        return _interrupted(args.command, e)
    except Exception as e:  # the library's errors, and XLA's out of memory (it has no stable public type)
        memory = out_of_memory_message(e)
        if args.debug or not (isinstance(e, JaxdllmError) or memory):
            raise
        line = memory or str(e)
        if isinstance(e, DeviceMemoryError) or memory:
            line += f" (in this command: {MEMORY_SETTINGS.get(args.command, 'the sizes')})"
        print(f"jaxdllm {args.command}: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
