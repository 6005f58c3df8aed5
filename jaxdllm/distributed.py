"""Joining a multi-process (multi-host) JAX job: one call before anything touches a device.

JAX's multi-controller runtime is the engine: every process runs the same program over the
devices of all of them (`jax.distributed.initialize`). This module only decides *how* to join:

- explicitly: a coordinator `HOST:PORT`, the number of processes and this one's id (plain
  clusters, `jaxdllm launch` on one machine, tests);
- from the environment `jaxdllm launch` sets (`JAXDLLM_COORDINATOR`, `JAXDLLM_NUM_PROCESSES`,
  `JAXDLLM_PROCESS_ID`): a launched command joins without flags;
- by JAX's own detection (`--distributed`): TPU pod slices, SLURM, Open MPI, Kubernetes, and
  `JAX_COORDINATOR_ADDRESS`.

On CPU the processes exchange data with gloo collectives (set here before the backend starts;
it changes nothing on TPU or GPU). A lost process is noticed by JAX's heartbeat: the others stop
after `heartbeat_timeout_s` instead of waiting on a collective forever.
"""

from __future__ import annotations

import dataclasses
import os

from jaxdllm.errors import ConfigError

ENV_COORDINATOR = "JAXDLLM_COORDINATOR"
ENV_NUM_PROCESSES = "JAXDLLM_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXDLLM_PROCESS_ID"
ENV_HEARTBEAT = "JAXDLLM_HEARTBEAT_TIMEOUT_S"
DEFAULT_HEARTBEAT_S = 60  # JAX's default is 100 s; a lost host should not hold the others longer than a minute


@dataclasses.dataclass(frozen=True)
class JoinSpec:
    """How this process joins a job.

    coordinator: `HOST:PORT` of process 0's coordination service (None: JAX detects the cluster).
    num_processes, process_id: the job's size and this process's rank (with `coordinator`).
    heartbeat_timeout_s: seconds without a heartbeat before a process counts as lost.
    """

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    heartbeat_timeout_s: int = DEFAULT_HEARTBEAT_S

    def __post_init__(self):
        given = [self.coordinator is not None, self.num_processes is not None, self.process_id is not None]
        if any(given) and not all(given):
            raise ConfigError("--coordinator, --num-processes and --process-id go together (or use --distributed "
                              "and let JAX read the cluster)")
        if self.coordinator is not None:
            host, sep, port = self.coordinator.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(f"--coordinator is HOST:PORT, got {self.coordinator!r}")
            if self.num_processes < 1:
                raise ConfigError(f"--num-processes must be at least 1, got {self.num_processes}")
            if not 0 <= self.process_id < self.num_processes:
                raise ConfigError(f"--process-id must be in [0, {self.num_processes}), got {self.process_id}")
        if self.heartbeat_timeout_s < 1:
            raise ConfigError(f"the heartbeat timeout must be at least 1 s, got {self.heartbeat_timeout_s}")


def add_arguments(parser) -> None:
    """`--distributed`, `--coordinator`, `--num-processes`, `--process-id` on a command's parser."""
    group = parser.add_argument_group("multi-process (multi-host) jobs")
    group.add_argument("--distributed", action="store_true",
                       help="join a multi-process job as JAX detects it (TPU pod slices, SLURM, Open MPI, "
                            "Kubernetes, JAX_COORDINATOR_ADDRESS)")
    group.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address (with --num-processes and "
                                                                   "--process-id, on clusters JAX does not detect)")
    group.add_argument("--num-processes", dest="num_processes", type=int, metavar="N",
                       help="how many processes the job has (with --coordinator)")
    group.add_argument("--process-id", dest="process_id", type=int, metavar="I",
                       help="this process's rank in [0, N); process 0 runs the coordinator")


def spec_from(args=None, environ=None) -> JoinSpec | None | str:
    """The `JoinSpec` the flags (or `jaxdllm launch`'s environment) ask for; `"detect"` for
    `--distributed` alone; None for a single-process run."""
    environ = os.environ if environ is None else environ
    heartbeat = int(environ.get(ENV_HEARTBEAT, DEFAULT_HEARTBEAT_S))
    coordinator = getattr(args, "coordinator", None)
    if coordinator is not None or getattr(args, "num_processes", None) is not None \
            or getattr(args, "process_id", None) is not None:
        return JoinSpec(coordinator, args.num_processes, args.process_id, heartbeat)
    if environ.get(ENV_COORDINATOR):
        try:
            return JoinSpec(environ[ENV_COORDINATOR], int(environ[ENV_NUM_PROCESSES]),
                            int(environ[ENV_PROCESS_ID]), heartbeat)
        except (KeyError, ValueError) as e:
            raise ConfigError(f"{ENV_COORDINATOR} is set but {ENV_NUM_PROCESSES}/{ENV_PROCESS_ID} are not "
                              f"integers: {e}") from None
    if getattr(args, "distributed", False):
        return "detect"
    return None


def initialize(spec: JoinSpec | str | None = None, *, initialization_timeout_s: int = 300) -> bool:
    """Join the job `spec` describes (see `spec_from`; default: from the environment); False when
    there is nothing to join. Call before any other JAX call that touches a device."""
    import jax

    if spec is None:
        spec = spec_from(None)
    if spec is None:
        return False
    if jax.distributed.is_initialized():
        return True
    # gloo: CPU processes need a cross-process collectives implementation (TPU/GPU bring their own)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if spec == "detect":
        jax.distributed.initialize(initialization_timeout=initialization_timeout_s,
                                   heartbeat_timeout_seconds=int(os.environ.get(ENV_HEARTBEAT, DEFAULT_HEARTBEAT_S)))
    else:
        jax.distributed.initialize(spec.coordinator, num_processes=spec.num_processes, process_id=spec.process_id,
                                   initialization_timeout=initialization_timeout_s,
                                   heartbeat_timeout_seconds=spec.heartbeat_timeout_s)
    return True


def join_from_args(args) -> bool:
    """`initialize(spec_from(args))`: what each command calls first."""
    return initialize(spec_from(args))


def is_primary() -> bool:
    """True in process 0, the one that writes files a job writes once (metrics, results, side files)."""
    import jax

    return jax.process_index() == 0


def agree_any(flag: bool) -> bool:
    """True in every process when `flag` is True in any (a collective: every process must call it
    at the same point). Used to stop all processes at the same step when one was signalled."""
    import jax

    if jax.process_count() == 1:
        return bool(flag)
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.int32(bool(flag)))).any())
