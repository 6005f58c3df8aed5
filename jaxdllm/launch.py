"""Start N local processes of one command as a multi-process JAX job (`jaxdllm launch`).

For trying a multi-host job on one machine, and for tests: each process gets the coordinator
address, the job size and its id in the environment (`jaxdllm.distributed` reads them; every
`jaxdllm` command then joins without flags) and, with `devices_per_process`, that many CPU devices.
Process 0's lines pass through as they are; the others' are prefixed with `[process I]`; lines
never mix.

A process that fails ends the job: the launcher names it on one line, stops the others (SIGTERM,
then SIGKILL after `grace_s`) and returns its exit code; nothing waits on a collective whose peer
is gone. SIGINT/SIGTERM sent to the launcher go to every process once (each runs in its own
session, so a terminal's Ctrl-C is not delivered twice).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Sequence

from jaxdllm.distributed import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID
from jaxdllm.errors import ConfigError

_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S+")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(base: dict, process_id: int, num_processes: int, port: int,
                devices_per_process: int | None = None) -> dict:
    """The environment of process `process_id` of a local job (a copy of `base`)."""
    env = dict(base)
    env[ENV_COORDINATOR] = f"127.0.0.1:{port}"
    env[ENV_NUM_PROCESSES] = str(num_processes)
    env[ENV_PROCESS_ID] = str(process_id)
    if devices_per_process is not None:
        flags = _DEVICE_COUNT_FLAG.sub("", env.get("XLA_FLAGS", "")).strip()
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices_per_process}".strip()
    return env


_WRITE = threading.Lock()  # whole lines: the processes' outputs interleave by line, never within one


def _prefix_lines(stream, out, prefix: str) -> None:
    for line in iter(stream.readline, ""):
        with _WRITE:
            out.write(prefix + line)
            out.flush()
    stream.close()


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def launch_local(command: Sequence[str], num_processes: int, *, devices_per_process: int | None = None,
                 port: int | None = None, grace_s: float = 10.0, env: dict | None = None,
                 log=lambda line: print(line, file=sys.stderr, flush=True)) -> int:
    """Run `command` as `num_processes` local processes of one JAX job; returns the job's exit
    code (0 when every process exits 0, else the first failure's code, 128+N for signal N).

    Args:
      command: the program and its arguments (e.g. `["jaxdllm", "train", "recipe.toml"]`).
      num_processes: how many processes (>= 1).
      devices_per_process: CPU devices each process sees (`--xla_force_host_platform_device_count`);
        None leaves XLA_FLAGS as they are.
      port: the coordinator's port on 127.0.0.1 (default: a free one).
      grace_s: how long the others get to stop after SIGTERM before SIGKILL.
      env: the base environment (default `os.environ`).
    """
    if not command:
        raise ConfigError("jaxdllm launch needs a command after --, e.g. jaxdllm launch -n 2 -- jaxdllm train ...")
    if num_processes < 1:
        raise ConfigError(f"--num-processes must be at least 1, got {num_processes}")
    if devices_per_process is not None and devices_per_process < 1:
        raise ConfigError(f"--devices-per-process must be at least 1, got {devices_per_process}")
    port = free_port() if port is None else port
    base = dict(os.environ if env is None else env)
    procs: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        for i in range(num_processes):
            p = subprocess.Popen(list(command), env=process_env(base, i, num_processes, port, devices_per_process),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
            procs.append(p)
            prefix = f"[process {i}] " if i else ""  # process 0 speaks for the job
            for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
                t = threading.Thread(target=_prefix_lines, args=(stream, out, prefix), daemon=True)
                t.start()
                readers.append(t)
        failed: tuple[int, int] | None = None
        while failed is None and any(p.poll() is None for p in procs):
            if not received:  # after a forwarded signal every process stops on its own: wait for all
                failed = next(((i, p.returncode) for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            time.sleep(0.05)
        if failed is None:
            failed = next(((i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0), None)
        if failed is not None and not received:
            i, code = failed
            others = sum(p.poll() is None for p in procs)
            log(f"jaxdllm launch: process {i} of {num_processes} {_describe(code)}"
                + (f"; stopping the other {others}" if others else ""))
        _stop(procs, grace_s)
        for t in readers:
            t.join(timeout=5)
        if failed is None:
            return 0
        code = failed[1]
        return 128 - code if code < 0 else code
    finally:
        _stop(procs, grace_s)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every running process, SIGKILL those still running after `grace_s`."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in running:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
