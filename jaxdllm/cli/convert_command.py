"""`jaxdllm convert`: load a checkpoint and write it back (cast, re-shard, or as orbax state)."""

from __future__ import annotations

from jaxdllm.models.run_options import DTYPES
from jaxdllm.output_paths import check_output_dir

NAME = "convert"
COMPILES = False
RESUMES = None
MEMORY = None


def add_parser(sub) -> None:
    """The `convert` subcommand and its flags."""
    p = sub.add_parser(NAME, help="load a checkpoint and write it back (cast / re-shard / orbax)")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="parameter dtype (default: as stored)")
    p.add_argument("--max-shard-size", default="5GB", help="bytes per safetensors file, e.g. 2GB")
    p.add_argument("--orbax", action="store_true", help="write jaxdllm orbax state instead of safetensors")
    p.set_defaults(func=run)


def run(args) -> int:
    """Re-export SRC to DST."""
    from jaxdllm.checkpoint.hf_io import from_pretrained, parse_size, save_pretrained
    from jaxdllm.checkpoint.orbax_io import save_state

    parse_size(args.max_shard_size)  # a bad size and an unwritable DST fail before the model is read
    check_output_dir(args.dst, "DST")

    model = from_pretrained(args.src, dtype=args.dtype)
    if args.orbax:
        out = save_state(model, args.dst)
    else:
        out = save_pretrained(model, args.dst, max_shard_size=args.max_shard_size, copy_files_from=args.src)
    print(f"wrote {out} ({model.config.num_params:,} parameters, {model.options.param_dtype})")
    return 0
