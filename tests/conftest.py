"""Test session setup: 8 fake CPU devices for mesh tests, exact fp32 matmuls, quick CPU compiles, and
a persistent compilation cache that test processes (pytest-xdist workers, the default and the slow
run) share."""

import os
import re
from pathlib import Path

MESH_DEVICES = 8
_DEVICE_FLAG = "--xla_force_host_platform_device_count"

# Must happen before jax is imported anywhere. Flags set before the run are kept; the device
# count is added to them unless they name one themselves.
_flags = os.environ.get("XLA_FLAGS", "")
if _DEVICE_FLAG not in _flags:
    _flags = f"{_flags} {_DEVICE_FLAG}={MESH_DEVICES}".strip()
# The tests' programs are tiny and most run once: compiling them is most of their time. The CPU
# backend's LLVM optimisations are turned down (a third less time on a fresh clone; the programs and
# their floating-point semantics are the same), unless the flags name a level themselves.
_QUICK = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")
if "--xla_backend_optimization_level" not in _flags:
    _flags = " ".join((_flags, *_QUICK))


# XLA's CPU fusion emitters (MLIR pipelines per fusion) take most of a tiny program's backend compile;
# its elemental emitters compile the same HLO fusions in under half the time, and the programs hold
# fewer memory mappings (below). Measured serially, back to back: tests/test_contracts.py with
# tests/train/test_train.py 83 s -> 44 s; seven parity files 123 -> 79 CPU seconds. Tests keep the
# HLO and its semantics; the emitted loops differ. Only where this jaxlib accepts the flag (an unknown
# XLA flag aborts the process, and jaxlib 0.12 still holds the name but refuses it: a child process
# tries it), and unless the flags name it themselves (xdist workers inherit the result in XLA_FLAGS).
def _jaxlib_accepts(flag: str) -> bool:
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    probe = "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"
    try:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


_FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters"
if _FUSION_EMITTERS not in _flags and _jaxlib_accepts(f"{_FUSION_EMITTERS}=false"):
    _flags = f"{_flags} {_FUSION_EMITTERS}=false"
os.environ["XLA_FLAGS"] = _flags
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The command line turns on JAX's persistent compilation cache; tests that call it in this process
# keep it off unless they name a folder themselves (tests/cli/test_compilation_cache.py). Children
# started through tests/support/cli.py get a folder of their own in the test processes' cache.
os.environ.setdefault("JAXDLLM_COMPILATION_CACHE", "off")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# Many tests compile the same programs (one tiny model, one sampler config) from separate jit
# objects; JAX's persistent cache keys them by the program itself, so each compiles once per
# machine instead of once per test. In this process only: children keep the setting above.
# JAXDLLM_TEST_COMPILATION_CACHE=off compiles everything afresh.
_TEST_CACHE = os.environ.get("JAXDLLM_TEST_COMPILATION_CACHE",
                             str(Path(__file__).resolve().parent.parent / ".cache" / "xla-tests"))
if _TEST_CACHE.strip().lower() not in ("", "0", "off", "false", "none", "no"):
    jax.config.update("jax_compilation_cache_dir", _TEST_CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)


def pytest_configure(config):
    config.addinivalue_line("markers", f"mesh: needs {MESH_DEVICES} (fake) CPU devices; fails with the reason "
                                       "when the process has fewer")


def pytest_runtest_setup(item):
    # before the test and its fixtures: half of the mapping limit free where JAX's caches can give
    # it back (below: a process that arrives near the limit, e.g. after a long test of one module)
    _drop_compiled_programs(_MAP_LIMIT // 2 if _MAP_LIMIT is not None else 0)
    if item.get_closest_marker("mesh") and jax.device_count() < MESH_DEVICES:
        count = re.search(rf"{_DEVICE_FLAG}=(\d+)", os.environ.get("XLA_FLAGS", ""))
        pytest.fail(f"this mesh test needs {MESH_DEVICES} CPU devices but JAX has {jax.device_count()}: "
                    f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} was set before the run"
                    + (f" with {_DEVICE_FLAG}={count.group(1)}" if count else "")
                    + f"; unset XLA_FLAGS or give {_DEVICE_FLAG}={MESH_DEVICES}", pytrace=False)


# XLA's CPU backend maps each compiled program's code into the process: 15-35 memory mappings for
# a tiny program (the same with or without the quick-compile flags and the persistent cache), held
# while the program lives, and JAX keeps compiled programs in in-memory caches (thousands of
# entries: jitted functions, eager ops). A test process grows by about 100 mappings a test
# (tests/train), so a process that runs many hundreds of tests (a serial default run; an xdist
# worker) nears the kernel's limit (vm.max_map_count, 65530 by default). At that limit LLVM's JIT
# cannot allocate ("LLVM compilation error: Cannot allocate memory") and the process dies with a
# segfault or an abort inside XLA's compile (`backend_compile_and_load`) or the persistent cache's
# serialisation (`put_executable_and_time`), where the CI crashes were. So a process past a third of its
# limit drops JAX's in-memory caches between test modules (past half of it, before any test): that
# frees those mappings; a program needed again is compiled or read from the persistent cache.
def _map_limit() -> int | None:
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):  # not Linux: no such limit to watch
        return None


_MAP_LIMIT = _map_limit()


def memory_mappings() -> int:
    """The number of memory mappings this process holds (0 where /proc is missing)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def _drop_compiled_programs(threshold: int) -> None:
    if _MAP_LIMIT is not None and memory_mappings() > threshold:
        import gc
        jax.clear_caches()
        gc.collect()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # the test's fixtures (a module's too, after its last test) are finalised by now
    if _MAP_LIMIT is not None and (nextitem is None or nextitem.path != item.path):
        _drop_compiled_programs(_MAP_LIMIT // 3)


# The slow run's longest tests (measured, 2 workers: each 40 s to 3 min), started first so the two
# workers share them instead of one finishing alone while the other runs a late long test. The
# order only schedules; every test runs. A notebook's second working folder comes later, after
# its first run has filled the compilation cache.
LONGEST_FIRST = ("tests/eval/test_eval.py::test_eval_reproduces_the_whole_card",
                 "tests/test_readme.py::test_readme_python_blocks_run",
                 "tests/serving/test_engine.py::test_each_request_decodes_as_alone_whatever_shares_the_slots[fast-dllm-prefix]",
                 "tests/benchmarks/test_benchmark_gpu_scale.py::test_tiny_run_matches_pytorch_and_records_what_it_skips",
                 "tests/train/test_multihost_checkpoints.py::test_killed_resumed_and_moved_across_topologies_equals_one_uninterrupted_run",
                 "tests/test_notebooks.py::test_notebook_runs_top_to_bottom[03_certainty_forcing-from-colab]",
                 "tests/test_python_path.py::test_every_preset_decodes_a_shipped_model_at_its_length",
                 "tests/serving/test_engine.py::test_each_request_decodes_as_alone_whatever_shares_the_slots[diffusiongemma]",
                 "tests/test_notebooks.py::test_notebook_runs_top_to_bottom[04_jacobi_forcing-from-colab]",
                 "tests/test_tpu_lowering.py::test_diffusiongemma_decoding_loop_lowers_for_tpu[v5e-8-bf16]",
                 "tests/benchmarks/test_benchmark_multihost.py::test_tiny_run_reports_step_times_and_memory_per_process",
                 "tests/train/test_train_multihost.py::test_every_recipe_kind_trains_the_same_in_two_processes_as_in_one",
                 "tests/test_shipped_model.py::test_chain_models_match_their_cards",
                 "tests/test_shipped_model.py::test_the_shipped_moe_model_matches_its_card",
                 "tests/test_multihost_inference.py::test_generate_and_eval_across_processes_equal_one_process",
                 # the default run's longest (an xdist worker left alone with one of them at the end
                 # is the run's tail)
                 "tests/train/test_train.py::test_sharded_step_equals_single_device_step",
                 "tests/decoding/test_second_model.py::test_apd_at_the_ends_of_the_mixture",
                 "tests/serving/test_engine.py::test_each_request_decodes_as_alone_whatever_shares_the_slots[llada2.1]",
                 "tests/serving/test_engine.py::test_each_request_decodes_as_alone_whatever_shares_the_slots[jacobi]",
                 "tests/train/test_uniform_block_diffusion.py::test_training_logits_equal_the_decoding_path",
                 "tests/attention/test_splash_attention.py::test_model_forward_and_loss_gradient_equal_reference[tiny-block-diffusion]",
                 "tests/decoding/test_diffusiongemma_generate.py::test_generate_equals_transformers_alone_and_in_a_ragged_batch")


def pytest_collection_modifyitems(config, items):
    rank = {nodeid: i for i, nodeid in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _seed_torch():
    """Torch's global seed before each test, where torch is installed (without it the tests that use it
    skip: tests/support/optional.py), and one torch thread: torch's thread pool and XLA's contend for
    the machine's cores, and a tiny torch reference then waits up to seconds per call for its threads."""
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(0)
    torch.set_num_threads(1)


_COMPILES: list[str] = []
_LISTENING = False


@pytest.fixture
def compiles():
    """A list that collects the name of every XLA backend compile from now until the test ends.

    The persistent compilation cache stays on: a program loaded from it is listed too (JAX records
    the compile event around the cache's lookup, `compile_or_get_cached`, and a hit also records
    `cache_hits`), so the tests' claims ("nothing compiles", "a new shape compiles") read the same as
    without the cache, and the programs an earlier test compiled load instead of compiling again."""
    global _LISTENING
    if not _LISTENING:  # jax keeps listeners for the process: register them, once
        jax.monitoring.register_event_duration_secs_listener(
            lambda name, *_a, **_k: _COMPILES.append(name) if "backend_compile" in name else None)
        jax.monitoring.register_event_listener(
            lambda name, *_a, **_k: _COMPILES.append(name) if name.endswith("/cache_hits") else None)
        _LISTENING = True
    _COMPILES.clear()
    yield _COMPILES
