"""How a process joins a multi-process job (`jaxdllm.distributed`): the flags, `jaxdllm launch`'s
environment and JAX's own detection, checked before anything joins. (Real multi-process runs:
tests/train/test_train_multihost.py, tests/train/test_multihost_checkpoints.py,
tests/test_multihost_inference.py.)"""

import argparse

import pytest

from jaxdllm.distributed import (DEFAULT_HEARTBEAT_S, ENV_COORDINATOR, ENV_HEARTBEAT, ENV_NUM_PROCESSES,
                                 ENV_PROCESS_ID, JoinSpec, add_arguments, agree_any, spec_from)
from jaxdllm.errors import ConfigError


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_no_flags_and_no_environment_is_a_single_process_run():
    assert spec_from(_args(), environ={}) is None


def test_distributed_alone_leaves_the_cluster_to_jax():
    assert spec_from(_args("--distributed"), environ={}) == "detect"


def test_explicit_flags_name_the_job():
    spec = spec_from(_args("--coordinator", "10.0.0.2:1234", "--num-processes", "4", "--process-id", "3"), environ={})
    assert spec == JoinSpec("10.0.0.2:1234", 4, 3, DEFAULT_HEARTBEAT_S)


def test_the_launchers_environment_joins_without_flags():
    env = {ENV_COORDINATOR: "127.0.0.1:5000", ENV_NUM_PROCESSES: "2", ENV_PROCESS_ID: "1", ENV_HEARTBEAT: "7"}
    assert spec_from(_args(), environ=env) == JoinSpec("127.0.0.1:5000", 2, 1, 7)
    # explicit flags win over the environment
    spec = spec_from(_args("--coordinator", "h:1", "--num-processes", "3", "--process-id", "0"), environ=env)
    assert (spec.coordinator, spec.num_processes, spec.process_id) == ("h:1", 3, 0)


@pytest.mark.parametrize("argv, needle", [
    (("--coordinator", "h:1"), "go together"),
    (("--num-processes", "2", "--process-id", "0"), "go together"),
    (("--coordinator", "nohost", "--num-processes", "2", "--process-id", "0"), "HOST:PORT"),
    (("--coordinator", "h:1", "--num-processes", "0", "--process-id", "0"), "at least 1"),
    (("--coordinator", "h:1", "--num-processes", "2", "--process-id", "2"), "[0, 2)"),
])
def test_bad_flags_are_one_line_errors(argv, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace(")", r"\)")):
        spec_from(_args(*argv), environ={})


def test_a_broken_launcher_environment_is_named():
    with pytest.raises(ConfigError, match=ENV_NUM_PROCESSES):
        spec_from(_args(), environ={ENV_COORDINATOR: "127.0.0.1:5000", ENV_NUM_PROCESSES: "two"})


def test_agree_any_in_a_single_process_is_the_flag():
    assert agree_any(True) is True and agree_any(False) is False
