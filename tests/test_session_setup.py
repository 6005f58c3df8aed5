"""What tests/conftest.py promises a run: the mesh tests' 8 CPU devices, or a failure that says why."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_session_has_the_mesh_devices():
    assert jax.device_count() == 8


def _run_one_mesh_test(xla_flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XLA_FLAGS": xla_flags, "JAXDLLM_TEST_COMPILATION_CACHE": "off"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "tests/test_sharding.py::test_mesh_size_must_match_devices"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_flags_set_before_the_run_keep_the_mesh_devices():
    run = _run_one_mesh_test("--xla_cpu_enable_fast_math=false")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_a_mesh_test_without_its_devices_fails_and_says_why():
    run = _run_one_mesh_test("--xla_force_host_platform_device_count=2")
    assert run.returncode == 1, run.stdout[-2000:]
    assert "needs 8 CPU devices but JAX has 2" in run.stdout, run.stdout[-2000:]
    assert "unset XLA_FLAGS or give --xla_force_host_platform_device_count=8" in run.stdout


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_without_torch_only_the_modules_that_import_it_skip():
    """Collection with torch blocked (as if the test extra were not installed): no collection error,
    and every test still collects, the torch references' included (each skips when it runs:
    `tests/support/optional.py`, `tests/test_torch_optional.py`)."""
    code = ("import sys; sys.modules['torch'] = None; import pytest; sys.exit(pytest.main(['--collect-only', '-q', "
            "'-rs', '-p', 'no:cacheprovider', '-p', 'no:xdist', 'tests/models/test_llada.py', 'tests/data/test_data.py']))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JAXDLLM_TEST_COMPILATION_CACHE": "off"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]  # a collection error exits 2
    assert "tests/models/test_llada.py::test_llada_logits_match_torch_reference" in run.stdout
    assert "tests/data/test_data.py::" in run.stdout and "needs torch" not in run.stdout
