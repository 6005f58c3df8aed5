"""`jaxdllm launch`: run a command as N local processes of one multi-process JAX job."""

from __future__ import annotations

import argparse

NAME = "launch"
COMPILES = False
RESUMES = None
MEMORY = None


def add_parser(sub) -> None:
    """The `launch` subcommand and its flags."""
    p = sub.add_parser(NAME, help="run a command as N local processes of one multi-process JAX job (try "
                                  "multi-host on one machine)",
                       description="Start N processes of COMMAND on this machine as one JAX job: each joins "
                                   "through 127.0.0.1 (jaxdllm commands join without flags; a Python script "
                                   "calls jaxdllm.distributed.initialize()). One failing process stops the "
                                   "others; Ctrl-C and SIGTERM reach every process.",
                       epilog="example: jaxdllm launch -n 2 --devices-per-process 2 -- "
                              "jaxdllm train tasks_tiny_cpu --workdir runs/two-hosts")
    p.add_argument("-n", "--num-processes", dest="num_processes", type=int, required=True, metavar="N")
    p.add_argument("--devices-per-process", dest="devices_per_process", type=int, metavar="D",
                   help="CPU devices each process sees (XLA's host device count; for trying meshes on CPU)")
    p.add_argument("--port", type=int, help="the coordinator's port on 127.0.0.1 (default: a free one)")
    p.add_argument("--grace", type=float, default=10.0, metavar="S",
                   help="seconds the other processes get to stop after one fails (then SIGKILL)")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND", help="-- then the command, e.g. -- jaxdllm train RECIPE")
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the job; its exit code is the first failing process's (0 when all succeed)."""
    from jaxdllm.launch import launch_local

    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return launch_local(command, args.num_processes, devices_per_process=args.devices_per_process,
                        port=args.port, grace_s=args.grace)
