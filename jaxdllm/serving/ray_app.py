"""The OpenAI-compatible server as a Ray Serve application: each replica loads the checkpoint, starts an
`Engine` (`jaxdllm/serving/engine.py`) and serves `jaxdllm/serving/openai_api.py`'s routes.

    jaxdllm serve tasks-llada-small --replicas 2                         # the command line (cli/serve_command.py)
    serve run jaxdllm.serving.ray_app:build_app model=tasks-llada-small  # Ray's own command line
    serve deploy sampling/serve/serve_config.yaml                        # a running cluster (KubeRay too)

A replica loads the model (`jaxdllm.load`), the policy's parameters or second model where its preset
needs them (`jaxdllm.policy_params`), with `warmup` compiles the engine's programs for the default settings
and short prompts (`Engine.warm_up`), so that no client waits for a compile, and starts the engine; only
then does Ray route requests to it. `scheduler="static"` serves the same routes from a batch formed once
(`jaxdllm/serving/static_batch.py`; with `slots=1`, one request at a time): the load test's baselines. When Ray
stops a replica (scale down, `serve.delete`, `serve.shutdown`, a redeploy) it first waits up to
`graceful_shutdown_timeout_s` for the replica's requests in flight, then the replica drains its engine
(`Engine.shutdown(drain=True)`) and exits. A replica whose process dies is restarted by Ray; the
requests it held end with an error at their clients.

Needs the serve extra: pip install 'jaxdllm[serve]'.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

from ray import serve

log = logging.getLogger(__name__)

# build_app's arguments (`serve run ... key=value`, a Serve config's `args`), with their defaults.
DEFAULTS = {
    "model": None,               # checkpoint folder or shipped name (required)
    "preset": None,              # sampler preset of requests that name none (default: the checkpoint's)
    "model_name": None,          # the id clients send as `model` (default: the checkpoint folder's name)
    "replicas": 1,               # replicas of the deployment (on TPU: one per host)
    "slots": 8,                  # rows of each compiled decoding program, per replica
    "max_queue": 64,             # requests waiting for a row, per replica (beyond: 503 + Retry-After)
    "steps_per_dispatch": 4,     # decoding steps per engine dispatch
    "warmup": True,              # compile the default settings' programs before taking requests
    "scheduler": "continuous",   # continuous (the engine), or static: batches formed once (slots=1: one at a time)
    "mesh": None,                # e.g. "tensor=4": the weights over the replica's devices (default: one device)
    "dtype": None,               # e.g. "bfloat16": the weights' dtype (default: the checkpoint's)
    "num_cpus": 1,               # Ray resources of one replica
    "num_gpus": 0,
    "resources": None,           # e.g. {"TPU": 4}: a TPU host's chips (JSON text on the command line)
    "max_replicas_per_node": None,  # 1 on TPU: one replica per host
    "graceful_shutdown_timeout_s": 120.0,  # how long a stopping replica's requests may take
}
_INTS = ("replicas", "slots", "max_queue", "steps_per_dispatch", "num_cpus", "max_replicas_per_node")
_FLOATS = ("num_gpus", "graceful_shutdown_timeout_s")

# The app this replica's constructor built. A replica is one Ray actor, its own process: `_replica_app`
# (Serve calls it right after the constructor) hands the app to `serve.ingress`. The constructor reaches
# this dict through `_keep_replica_app`: Ray ships the class by value, with copies of the globals its
# methods read, while module-level functions travel by reference (this module, imported in the replica).
_REPLICA: dict = {}


def _keep_replica_app(app) -> None:
    _REPLICA["app"] = app


def _replica_app():
    return _REPLICA["app"]


@serve.deployment(name="jaxdllm", graceful_shutdown_timeout_s=DEFAULTS["graceful_shutdown_timeout_s"],
                  graceful_shutdown_wait_loop_s=0.5, health_check_period_s=10.0)
@serve.ingress(_replica_app)
class JaxdllmServer:
    """One replica: the checkpoint's model in an `Engine`, behind the OpenAI-compatible routes.

    Args:
      model: checkpoint folder or shipped name (as `jaxdllm.load` takes it).
      preset: the preset of requests that name none (default: the checkpoint's own settings).
      model_name: the model id clients send (default: the checkpoint folder's name).
      slots, max_queue, steps_per_dispatch: the engine's (`jaxdllm.serving.engine.Engine`).
      warmup: compile the default settings' programs before Ray routes requests here.
      scheduler: "continuous" (the engine) or "static" (a batch formed once; the load test's baseline).
      mesh: `"data=D,fsdp=F,tensor=T"` (any of the three; their product = the devices this replica sees,
        e.g. "tensor=4" on a TPU host of 4 chips): the weights sharded over them, the requests' rows
        replicated. None: one device.
      dtype: the weights' dtype (`jaxdllm.load`'s), e.g. "bfloat16"; None: the checkpoint's.
      drain_timeout_s: at shutdown, how long the engine may finish what it still holds.
    """

    def __init__(self, model: str, preset: str | None = None, model_name: str | None = None, slots: int = 8,
                 max_queue: int = 64, steps_per_dispatch: int = 4, warmup: bool = True,
                 drain_timeout_s: float = 60.0, scheduler: str = "continuous", mesh: str | None = None,
                 dtype: str | None = None):
        import jaxdllm
        from jaxdllm.checkpoint.folder import Checkpoint
        from jaxdllm.compilation_cache import enable_compilation_cache
        from jaxdllm.serving.engine import Engine
        from jaxdllm.serving.openai_api import create_app

        started = time.perf_counter()
        enable_compilation_cache()  # a restarted replica loads its programs ($JAXDLLM_COMPILATION_CACHE)
        checkpoint = Checkpoint.open(model)
        config = jaxdllm.sampler_defaults(checkpoint, preset)  # a bad preset fails before the weights load
        placement = {"mesh": replica_mesh(mesh)} if mesh else {}
        pretrained = jaxdllm.load(checkpoint, dtype=dtype, **placement)
        # Learn2PD's filter, Medusa's heads, a second model (a second model placed as the model is)
        params = jaxdllm.policy_params(checkpoint, config, **(placement if config.policy.companion else {}))
        role = config.policy.companion
        if scheduler == "static":  # the baseline the load test compares with (jaxdllm/serving/static_batch.py)
            from jaxdllm.serving.static_batch import StaticBatchEngine
            self.engine = StaticBatchEngine(pretrained.model, pretrained.tokenizer, slots=slots, max_queue=max_queue,
                                            policy_params=params, companions={role: params} if role else None)
        else:
            self.engine = Engine(pretrained.model, pretrained.tokenizer, slots=slots, max_queue=max_queue,
                                 steps_per_dispatch=steps_per_dispatch, policy_params=params,
                                 companions={role: params} if role else None)
        loaded = time.perf_counter() - started
        if warmup:  # every program of the default settings for short prompts, before the first request
            self.engine.warm_up(_warm_up_prompt(self.engine, config), config)
        self.engine.start()
        self.drain_timeout_s = drain_timeout_s
        self.ready_s = time.perf_counter() - started
        info = {"pid": os.getpid(), "load_s": round(loaded, 3), "ready_s": round(self.ready_s, 3)}
        _keep_replica_app(create_app(self.engine, checkpoint, model_name=model_name, preset=preset,
                                     server_info=info))
        log.info("jaxdllm replica ready: %s loaded in %.1f s, ready in %.1f s", checkpoint.folder.name, loaded,
                 self.ready_s)

    def check_health(self) -> None:
        """Serve's health check: the engine's scheduling thread must be alive (else Ray restarts us)."""
        if not self.engine.alive:
            from jaxdllm.serving.requests import EngineStopped
            raise EngineStopped("the engine's scheduling thread has stopped")

    async def __del__(self):
        """Serve stops the replica: its requests in flight have had `graceful_shutdown_timeout_s`; the
        engine finishes what it still holds (up to `drain_timeout_s`), then stops."""
        engine = getattr(self, "engine", None)
        if engine is not None:
            await asyncio.get_running_loop().run_in_executor(None, engine.shutdown, True,
                                                             getattr(self, "drain_timeout_s", 60.0))


def replica_mesh(text: str):
    """The mesh `"data=D,fsdp=F,tensor=T"` names (missing sizes are 1) over this process's devices."""
    from jaxdllm.sharding import make_mesh

    return make_mesh(**replica_mesh_sizes(text))


def replica_mesh_sizes(text: str) -> dict:
    """`"data=D,fsdp=F,tensor=T"` (any of the three) -> `{"data": D, ...}`."""
    from jaxdllm.errors import ConfigError

    sizes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name.strip() not in ("data", "fsdp", "tensor") or not value.strip().isdigit():
            raise ConfigError(f"mesh expects data=D,fsdp=F,tensor=T (any of the three), got {text!r}")
        sizes[name.strip()] = int(value)
    if not sizes or any(v < 1 for v in sizes.values()):
        raise ConfigError(f"mesh expects positive sizes, e.g. tensor=4, got {text!r}")
    return sizes


def _warm_up_prompt(engine, config) -> tuple[int, ...]:
    """A short prompt that fits beside `config.gen_length`."""
    room = max(1, engine.model_config.max_position - config.gen_length - 1)
    return tuple(engine.tokenizer.encode("1+1="))[:room]


def app_args(args: dict | None) -> dict:
    """`args` (strings from `serve run key=value`, or typed values) over `DEFAULTS`, checked."""
    from jaxdllm.decoding.config import SAMPLER_PRESETS
    from jaxdllm.errors import ConfigError

    args = dict(args or {})
    unknown = sorted(set(args) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown argument(s) {unknown} of jaxdllm.serving.ray_app:build_app; "
                          f"arguments: {', '.join(DEFAULTS)}")
    out = {**DEFAULTS, **{k: v for k, v in args.items() if v is not None}}
    if not out["model"]:
        raise ConfigError("build_app needs model=CHECKPOINT (a checkpoint folder or a shipped name)")
    for name in _INTS + _FLOATS:
        value = out[name]
        if value is None:
            continue
        try:
            out[name] = int(value) if name in _INTS else float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be a number, got {value!r}") from None
    for name in ("replicas", "slots", "steps_per_dispatch"):
        if out[name] < 1:
            raise ConfigError(f"{name} must be at least 1, got {out[name]}")
    if out["max_queue"] < 0:
        raise ConfigError(f"max_queue must be at least 0, got {out['max_queue']}")
    if isinstance(out["warmup"], str):
        out["warmup"] = out["warmup"].strip().lower() not in ("0", "false", "no", "off")
    if isinstance(out["resources"], str):
        try:
            out["resources"] = json.loads(out["resources"])
        except ValueError:
            raise ConfigError(f"resources must be a JSON object such as {{\"TPU\": 4}}, got {out['resources']!r}") \
                from None
    if out["mesh"] is not None:
        replica_mesh_sizes(out["mesh"])  # checked here, built in the replica (its devices)
    if out["scheduler"] not in ("continuous", "static"):
        raise ConfigError(f"scheduler must be 'continuous' or 'static', got {out['scheduler']!r}")
    if out["preset"] is not None and out["preset"] not in SAMPLER_PRESETS:
        raise ConfigError(f"unknown preset {out['preset']!r}; presets: {', '.join(SAMPLER_PRESETS)}")
    return out


def build_app(args: dict | None = None):
    """The Serve application (`serve run jaxdllm.serving.ray_app:build_app model=...`, a config's
    `import_path`); `args`: see `DEFAULTS`.

    Ray admits at most `slots + max_queue + slots` requests to a replica at once, so that the engine's
    own bound answers the excess (503 with Retry-After) rather than a queue in front of it.
    """
    a = app_args(args)
    actor = {"num_cpus": a["num_cpus"]}
    if a["num_gpus"]:
        actor["num_gpus"] = a["num_gpus"]
    if a["resources"]:
        actor["resources"] = dict(a["resources"])
    options = {"num_replicas": a["replicas"], "ray_actor_options": actor,
               "max_ongoing_requests": 2 * a["slots"] + a["max_queue"],
               "graceful_shutdown_timeout_s": a["graceful_shutdown_timeout_s"]}
    if a["max_replicas_per_node"]:
        options["max_replicas_per_node"] = a["max_replicas_per_node"]
    return JaxdllmServer.options(**options).bind(
        a["model"], preset=a["preset"], model_name=a["model_name"], slots=a["slots"], max_queue=a["max_queue"],
        steps_per_dispatch=a["steps_per_dispatch"], warmup=a["warmup"], scheduler=a["scheduler"], mesh=a["mesh"],
        dtype=a["dtype"], drain_timeout_s=a["graceful_shutdown_timeout_s"] / 2)


__all__ = ["DEFAULTS", "JaxdllmServer", "app_args", "build_app", "replica_mesh", "replica_mesh_sizes"]
