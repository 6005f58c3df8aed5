"""`jaxdllm serve`: an OpenAI-compatible HTTP server on Ray Serve (`jaxdllm/serving/ray_app.py`)."""

from __future__ import annotations

import argparse
import textwrap

NAME = "serve"
COMPILES = False  # the replicas compile, in their own processes
RESUMES = None
MEMORY = "--slots or the requests' gen_length"

INSTALL = "pip install 'jaxdllm[serve]'"


def add_parser(sub) -> None:
    """The `serve` subcommand and its flags."""
    p = sub.add_parser(NAME, help="serve a checkpoint over an OpenAI-compatible HTTP API (Ray Serve)",
                       description=textwrap.fill(
                           "Serve MODEL at http://HOST:PORT/v1 (/v1/completions, /v1/chat/completions, "
                           "/v1/models) on Ray Serve: each replica loads the model and keeps the rows of its "
                           "compiled decoding loop full. jaxdllm's sampler settings ride in the request body "
                           "(the OpenAI client's extra_body), e.g. {\"preset\": \"fast-dllm-parallel\", "
                           "\"threshold\": 0.9}. Ctrl-C or SIGTERM lets the requests in flight finish, then stops. "
                           f"Needs the serve extra: {INSTALL}.", 88),
                       epilog="example: jaxdllm serve tasks-llada-small --preset fast-dllm-parallel --port 8000\n"
                              "then:    curl http://127.0.0.1:8000/v1/completions -H 'content-type: application/json' "
                              "-d '{\"model\": \"tasks-llada-small\", \"prompt\": \"reverse 4821=\"}'",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="checkpoint folder or shipped name (e.g. tasks-llada-small)")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="sampler preset of requests that name none (default: the checkpoint's own settings)")
    p.add_argument("--model-name", dest="model_name", default=None, metavar="ID",
                   help="the model id clients send (default: the checkpoint folder's name)")
    p.add_argument("--replicas", type=int, default=1, metavar="N", help="replicas of the model (default 1)")
    p.add_argument("--slots", type=int, default=8, metavar="N",
                   help="rows of each compiled decoding program, per replica (default 8)")
    p.add_argument("--max-queue", dest="max_queue", type=int, default=64, metavar="N",
                   help="requests waiting for a row, per replica; beyond it clients get 503 + Retry-After "
                        "(default 64)")
    p.add_argument("--address", default=None, metavar="RAY",
                   help="the Ray cluster to join (default: $RAY_ADDRESS, else a new local instance)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP host (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--num-cpus", dest="num_cpus", type=int, default=1, metavar="N", help="CPUs per replica")
    p.add_argument("--num-gpus", dest="num_gpus", type=float, default=0, metavar="N", help="GPUs per replica")
    p.add_argument("--mesh", default=None, metavar="data=D,fsdp=F,tensor=T",
                   help="shard each replica's weights over its devices (their product = its devices, e.g. "
                        "tensor=4 for 4 chips; default: one device)")
    p.add_argument("--dtype", default=None, metavar="D", help="the weights' dtype, e.g. bfloat16 (default: the "
                                                               "checkpoint's)")
    p.add_argument("--drain-timeout", dest="drain_timeout", type=float, default=120.0, metavar="S",
                   help="at Ctrl-C/SIGTERM, how long requests in flight may take to finish (default 120)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="take requests before the default settings' program is compiled")
    p.add_argument("--name", default="jaxdllm", help="the Serve application's name (default jaxdllm)")
    p.set_defaults(func=run)


def _import_ray():
    """`(ray, ray.serve)`, or one line naming the extra."""
    from jaxdllm.extras import MissingExtraError

    try:
        import fastapi  # noqa: F401  (the replicas' HTTP app)
        import ray
        from ray import serve
    except ImportError as e:
        raise MissingExtraError(f"jaxdllm serve needs Ray Serve and FastAPI ({e.name or e} is missing): "
                                f"{INSTALL}") from None
    return ray, serve


class _Signals:
    """SIGINT/SIGTERM for the server's phases: while "serving" the first one only sets `event` (the main
    thread then drains); while "starting" or "draining" one raises `Interrupted` (stop at once)."""

    def __init__(self):
        import threading

        self.event = threading.Event()
        self.signum: int | None = None
        self.phase = "starting"

    def install(self) -> None:
        import signal

        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, self._handle)

    def _handle(self, signum, frame):
        from jaxdllm.errors import Interrupted

        if self.phase != "serving":
            raise Interrupted(signum)
        self.signum = signum
        self.event.set()


def run(args) -> int:
    """Start Ray (or join `--address`), deploy the app, print its URL, serve until SIGINT/SIGTERM, then
    drain the requests in flight and shut Serve down."""
    import os
    import sys
    import time

    from jaxdllm.checkpoint.folder import Checkpoint
    from jaxdllm.errors import ConfigError, Interrupted

    ray, serve = _import_ray()
    from jaxdllm.serving.ray_app import app_args, build_app

    address = args.address or os.environ.get("RAY_ADDRESS") or None
    config = app_args({"model": args.model, "preset": args.preset, "model_name": args.model_name,
                       "replicas": args.replicas, "slots": args.slots, "max_queue": args.max_queue,
                       "num_cpus": args.num_cpus, "num_gpus": args.num_gpus, "warmup": args.warmup,
                       "mesh": args.mesh, "dtype": args.dtype,
                       "graceful_shutdown_timeout_s": args.drain_timeout})
    name = config["model_name"]
    if address is None:  # a local instance: the checkpoint is on this machine, so a wrong path is one line now
        model = Checkpoint.open(args.model)
        config["model"] = str(model.folder.resolve())
        name = name or model.folder.name
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be in 1..65535, got {args.port}")

    signals = _Signals()
    signals.install()
    started = time.perf_counter()
    local = address is None
    deployed = False
    try:
        if local:
            ray.init(include_dashboard=False, logging_level="WARNING")
        else:
            ray.init(address=address, logging_level="WARNING")
        signals.install()  # ray.init sets its own SIGTERM handler
        ray_s = time.perf_counter() - started
        serve.start(http_options={"host": args.host, "port": args.port})
        deployed = True
        serve.run(build_app(config), name=args.name, route_prefix="/", blocking=False)
        signals.phase = "serving"
        print(f"jaxdllm serve: {name or args.model} at http://{args.host}:{args.port}/v1 ({args.replicas} "
              f"replica{'s' if args.replicas != 1 else ''} of {args.slots} slots; Ray {'started' if local else 'joined'} "
              f"in {ray_s:.1f} s, ready in {time.perf_counter() - started:.1f} s; Ctrl-C or SIGTERM drains and stops)",
              flush=True)
        while not signals.event.wait(0.5):
            pass
        signals.phase = "draining"
        print("jaxdllm serve: stopping: the requests in flight finish first", file=sys.stderr, flush=True)
        serve.delete(args.name)  # Serve waits for each replica's requests (graceful_shutdown_timeout_s)
        if not serve.status().applications:  # on a shared cluster other applications keep Serve up
            serve.shutdown()
        deployed = False
        raise Interrupted(signals.signum, "the requests in flight were answered; the server stopped")
    finally:
        if deployed and not local:  # interrupted while starting or draining a shared cluster's app
            try:
                serve.delete(args.name, _blocking=False)
            except Exception:
                pass
        if local:
            ray.shutdown()  # a local instance goes with its replicas
