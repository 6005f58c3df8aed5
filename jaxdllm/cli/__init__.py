"""The `jaxdllm` command line.

  jaxdllm generate [--model DIR] --prompt TEXT [--preset NAME] [overrides]
  jaxdllm eval [--model DIR] [--tasks suite,gsm8k] [--preset P --sweep k=v1,v2]   accuracy, NFE, tokens/s; JSON + PNG
  jaxdllm inspect DIR                  config, parameter count and tensor check of a checkpoint
  jaxdllm convert SRC DST [--dtype D]  re-export a checkpoint (cast, re-shard, or to orbax)
  jaxdllm train RECIPE.toml [--workdir DIR] [--export DIR]   train, resuming from DIR if it holds checkpoints
  jaxdllm distill generate RECIPE.toml   the teacher's checked answers for distillation ([distill] section)
  jaxdllm distill trajectories RECIPE.toml   ... with every decoding state (Jacobi Forcing, CLLM, Learn2PD)
  jaxdllm distill learn2pd RECIPE.toml       Learn2PD's filter from those states, saved beside the model
  jaxdllm launch -n N [--devices-per-process D] -- COMMAND   N local processes of one multi-process job
  jaxdllm serve MODEL [--preset P] [--replicas N] [--port 8000]   an OpenAI-compatible server (Ray Serve)
  jaxdllm molecules design|eval|optimize [--model M]   GenMol: molecules from a masked model over SAFE strings

The commands that compile (generate, eval, train, distill) use JAX's persistent compilation cache
in `~/.cache/jaxdllm/xla` (`$JAXDLLM_COMPILATION_CACHE` names another folder, `off` turns it off):
see `jaxdllm/compilation_cache.py`.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from jaxdllm.cli import (convert_command, distill_command, eval_command, generate_command, inspect_command,
                         launch_command, molecules_command, serve_command, train_command)
from jaxdllm.cli.common import DEFAULT_MODEL, DEFAULT_MODEL_NAME, interrupted, parse_sets
from jaxdllm.cli.eval_command import default_eval_dir

# One module per command, in the order `jaxdllm --help` lists them. Each has `NAME`, `add_parser(sub)`
# (its flags; `func` runs it), `COMPILES` (uses the compilation cache), optionally `JOINS` (joins a
# multi-process job first: its flags or `jaxdllm launch`'s environment), `RESUMES` (what an interrupted
# run tells the user, or None) and `MEMORY` (what to lower when the device runs out, or None). The
# docstring above is the `--help` text.
COMMANDS = {m.NAME: m for m in (generate_command, eval_command, inspect_command, convert_command, distill_command,
                                train_command, launch_command, serve_command, molecules_command)}


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (exit 2), like every other error of the command line."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The `jaxdllm` parser: each command module adds its subcommand, whose `func` runs it."""
    parser = _Parser(prog="jaxdllm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; exit codes: 0 done, 2 an error the user can fix (one line on stderr;
    `--debug` shows the traceback), 130 interrupted (Ctrl-C), 143 stopped by SIGTERM."""
    from jaxdllm.errors import DeviceMemoryError, JaxdllmError, out_of_memory_message
    from jaxdllm.interrupts import terminate_as_interrupt

    args = build_parser().parse_args(argv)
    command = COMMANDS[args.command]

    def one_line_warning(message, category, filename, lineno, file=None, line=None):
        print(f"jaxdllm {args.command}: warning: {message}", file=sys.stderr)

    warnings.showwarning = one_line_warning  # the library's warnings, without Python's source line
    if command.COMPILES:  # a second run of the same shapes loads its programs
        from jaxdllm.compilation_cache import enable_compilation_cache

        enable_compilation_cache()
    try:
        if getattr(command, "JOINS", False):  # a multi-process job: join it before any device is touched
            from jaxdllm.distributed import join_from_args

            join_from_args(args)
        with terminate_as_interrupt():  # `kill` stops a run as Ctrl-C does: finished work kept, one line
            return args.func(args)
    except KeyboardInterrupt as e:
        if args.debug:
            raise
        return interrupted(args.command, e, command.RESUMES)
    except Exception as e:  # the library's errors, and XLA's out of memory (it has no stable public type)
        memory = out_of_memory_message(e)
        if args.debug or not (isinstance(e, JaxdllmError) or memory):
            raise
        line = memory or str(e)
        if isinstance(e, DeviceMemoryError) or memory:
            line += f" (in this command: {command.MEMORY or 'the sizes'})"
        print(f"jaxdllm {args.command}: error: {line}", file=sys.stderr)
        return 2


__all__ = ["COMMANDS", "DEFAULT_MODEL", "DEFAULT_MODEL_NAME", "build_parser", "default_eval_dir", "main",
           "parse_sets"]
