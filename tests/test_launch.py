"""`jaxdllm launch` (`jaxdllm.launch.launch_local`) with plain Python commands: each process gets
its place in the job, one failure stops the others with one line naming it, and a signal reaches
every process once. No JAX here; tests/train/test_multihost_checkpoints.py launches real jobs."""

import os
import signal
import sys
import threading
import time

import pytest

from jaxdllm.errors import ConfigError
from jaxdllm.launch import launch_local, process_env

PY = sys.executable


def test_each_process_gets_its_place_in_the_job(tmp_path, capfd):
    script = ("import os; print(os.environ['JAXDLLM_PROCESS_ID'], os.environ['JAXDLLM_NUM_PROCESSES'], "
              "os.environ['JAXDLLM_COORDINATOR'], os.environ['XLA_FLAGS'])")
    code = launch_local([PY, "-c", script], 3, devices_per_process=2, port=4321,
                        env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_other=1"})
    out = capfd.readouterr().out.splitlines()
    assert code == 0
    flags = "--xla_other=1 --xla_force_host_platform_device_count=2"
    assert f"0 3 127.0.0.1:4321 {flags}" in out  # process 0 unprefixed
    assert f"[process 1] 1 3 127.0.0.1:4321 {flags}" in out
    assert f"[process 2] 2 3 127.0.0.1:4321 {flags}" in out


def test_process_env_leaves_xla_flags_alone_without_a_device_count():
    env = process_env({"XLA_FLAGS": "--a=1"}, 0, 2, 99)
    assert env["XLA_FLAGS"] == "--a=1" and env["JAXDLLM_COORDINATOR"] == "127.0.0.1:99"


def test_a_failing_process_stops_the_others_and_is_named():
    lines = []
    script = "import os, sys, time; i = int(os.environ['JAXDLLM_PROCESS_ID']); time.sleep(60) if i == 0 else sys.exit(3)"
    start = time.monotonic()
    code = launch_local([PY, "-c", script], 2, grace_s=5, log=lines.append)
    assert code == 3
    assert time.monotonic() - start < 20  # not the 60 s process 0 would have slept
    assert lines == ["jaxdllm launch: process 1 of 2 exited with code 3; stopping the other 1"]


def test_a_killed_process_is_named_by_its_signal():
    lines = []
    script = ("import os, signal, time; i = int(os.environ['JAXDLLM_PROCESS_ID'])\n"
              "if i == 2: os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(60)")
    code = launch_local([PY, "-c", script], 3, grace_s=5, log=lines.append)
    assert code == 128 + signal.SIGKILL
    assert lines == ["jaxdllm launch: process 2 of 3 was killed by SIGKILL; stopping the other 2"]


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    script = ("import os, signal, sys, time; i = int(os.environ['JAXDLLM_PROCESS_ID'])\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "sys.exit(1) if i == 1 else time.sleep(60)")
    start = time.monotonic()
    assert launch_local([PY, "-c", script], 2, grace_s=1, log=lambda line: None) == 1
    assert time.monotonic() - start < 20


def test_a_signal_to_the_launcher_reaches_every_process_once(tmp_path):
    # Each process counts the SIGTERMs it gets for 1 s after the first, then exits 143 like a jaxdllm command.
    child = ("import os, signal, sys, time\n"
             f"out = {str(tmp_path)!r} + '/p' + os.environ['JAXDLLM_PROCESS_ID']\n"
             "got = []\n"
             "signal.signal(signal.SIGTERM, lambda s, f: got.append(s))\n"
             "open(out + '.ready', 'w').close()\n"
             "while not got: time.sleep(0.02)\n"
             "time.sleep(1)\n"
             "open(out, 'w').write(str(len(got)))\n"
             "sys.exit(143)\n")

    def signal_when_ready():  # SIGTERM to this process, where launch_local forwards it from the main thread
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"p{i}.ready").exists() for i in range(2)) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    lines = []
    sender = threading.Thread(target=signal_when_ready)
    sender.start()
    code = launch_local([PY, "-c", child], 2, log=lines.append)
    sender.join()
    assert code == 143
    assert [(tmp_path / f"p{i}").read_text() for i in range(2)] == ["1", "1"]
    assert lines == []  # a requested stop is not reported as a failure


def test_launch_needs_a_command():
    with pytest.raises(ConfigError, match="needs a command"):
        launch_local([], 2)
    with pytest.raises(ConfigError, match="at least 1"):
        launch_local([PY, "-c", "pass"], 0)
