"""The `jaxdllm` command line.

  jaxdllm inspect DIR                  config, parameter count and tensor check of a checkpoint
  jaxdllm convert SRC DST [--dtype D]  re-export a checkpoint (cast, re-shard, or to orbax)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxdllm.models.config import DTYPES


def _inspect(args) -> int:
    from jaxdllm.checkpoint.hf_config import config_from_hf, read_config_json

    directory = Path(args.path)
    config = config_from_hf(read_config_json(directory), where=str(directory / "config.json"))
    summary = {k: v for k, v in config.to_dict().items() if v is not None}
    summary["num_params"] = config.num_params
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
    from jaxdllm.checkpoint.hf_io import from_pretrained, save_pretrained
    from jaxdllm.checkpoint.orbax_io import save_state

    model = from_pretrained(args.src, dtype=args.dtype)
    if args.orbax:
        out = save_state(model, args.dst)
    else:
        out = save_pretrained(model, args.dst, max_shard_size=args.max_shard_size, copy_files_from=args.src)
    print(f"wrote {out} ({model.config.num_params:,} parameters, {model.config.param_dtype})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxdllm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
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
    return parser


def main(argv: list[str] | None = None) -> int:
    from jaxdllm.checkpoint.hf_config import CheckpointError
    from jaxdllm.models.config import ConfigError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CheckpointError, ConfigError) as e:
        print(f"jaxdllm {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
