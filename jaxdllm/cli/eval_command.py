"""`jaxdllm eval`: accuracy, NFE and speed of sampler settings on tasks, to a resumable results folder."""

from __future__ import annotations

from pathlib import Path

from jaxdllm.cli.common import _parse_value, add_mesh_argument, inference_mesh, open_model, parse_sets, warn_cache_notes
from jaxdllm.distributed import add_arguments
from jaxdllm.models.run_options import QUANTIZATIONS
from jaxdllm.output_paths import check_output_dir

NAME = "eval"
COMPILES = True
JOINS = True  # joins a multi-process job (`jaxdllm.distributed`) before it runs
RESUMES = "the same command resumes after the last finished batch"
MEMORY = "--batch-size or --gen-length"  # what to lower when the device runs out of memory


def add_parser(sub) -> None:
    """The `eval` subcommand and its flags."""
    p = sub.add_parser(NAME, help="accuracy, NFE, tokens per forward, tokens/s and latency per task; "
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
    add_mesh_argument(p)
    add_arguments(p)
    p.set_defaults(func=run)


def default_eval_dir(model_dir: Path, quantization: str | None = None) -> Path:
    """`runs/eval/<model folder name>-<8 hex of its full path>[-int8]`: two models both called
    `model` (in different folders), or one model in float and int8, do not share a results folder."""
    import hashlib

    where = str(model_dir.resolve())
    name = f"{model_dir.resolve().name}-{hashlib.sha1(where.encode()).hexdigest()[:8]}"
    return Path("runs") / "eval" / (name + (f"-{quantization}" if quantization else ""))


def samplers(args, model_dir) -> dict:
    """The labelled sampler settings of the flags (`jaxdllm.eval.checkpoint_samplers`), checked
    before the model is loaded; `model_dir`: the checkpoint's folder or `Checkpoint`."""
    from jaxdllm.eval import checkpoint_samplers

    sweep = parse_sets(args.sweep)
    # without --preset a --set is refused as such (needs --preset), before its values are read
    sets = parse_sets(args.set) if args.preset is not None else dict.fromkeys(args.set or [])
    return checkpoint_samplers(model_dir, args.preset, gen_length=args.gen_length, overrides=sets, sweep=sweep)


def run(args) -> int:
    """Evaluate, print progress lines and the files written."""
    import jax

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
    checkpoint = open_model(args)  # the folder found and config.json parsed once, for every loader below
    directory = checkpoint.folder
    configs = samplers(args, checkpoint)
    warn_cache_notes(checkpoint, list(configs.values()))
    params = {label: policy_params(checkpoint, config) for label, config in configs.items()}
    out = Path(args.out) if args.out else default_eval_dir(directory, args.quantize)
    if out.suffix == ".json":
        raise ConfigError(f"--out is a directory (eval.json, pareto.png and items.jsonl go inside), got {out}")
    check_output_dir(out, "--out" if args.out else "the default results folder")
    model = from_pretrained(checkpoint, dtype="float32", quantization=args.quantize, mesh=inference_mesh(args))
    tokenizer = Tokenizer.from_pretrained(checkpoint)
    version = weights_version(directory) + (f"-{args.quantize}" if args.quantize else "")
    evaluate(model, tokenizer, tasks, configs, n=n, seed=args.seed, batch_size=args.batch_size, out=out,
             model_id=str(directory.resolve()), model_version=version, policy_params=params,
             progress=not args.no_progress,
             log=lambda line: print(line, flush=True))
    if jax.process_index() == 0:  # a multi-process job writes (and says so) once
        written = [out / name for name in ("eval.json", "pareto.png") if (out / name).is_file()]
        print(f"wrote {' and '.join(map(str, written))}", flush=True)
    return 0
