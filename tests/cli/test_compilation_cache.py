"""The command line's persistent compilation cache: a second `jaxdllm generate` of the same shapes
loads its compiled programs from the folder instead of compiling them again."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jaxdllm.compilation_cache import DEFAULT_DIR, ENV, compilation_cache_dir
from support.cli import cli_env

# Runs `jaxdllm generate` in this fresh process and prints JAX's persistent-cache events.
COUNT_EVENTS = """
import collections, json, sys
import jax
events = collections.Counter()
jax.monitoring.register_event_listener(lambda name, **kw: events.update([name]))
from jaxdllm.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "hits": events["/jax/compilation_cache/cache_hits"],
                  "misses": events["/jax/compilation_cache/cache_misses"]}))
"""


def test_folder_from_argument_environment_or_default(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    assert compilation_cache_dir() == DEFAULT_DIR.expanduser()
    monkeypatch.setenv(ENV, str(tmp_path / "xla"))
    assert compilation_cache_dir() == tmp_path / "xla"
    assert compilation_cache_dir(tmp_path / "mine") == tmp_path / "mine"
    for off in ("off", "OFF", "0", "false", "none", ""):
        monkeypatch.setenv(ENV, off)
        assert compilation_cache_dir() is None
    assert compilation_cache_dir("off") is None


def _generate(model_dir: Path, cache: str) -> dict:
    env = cli_env(**{ENV: cache}, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    out = subprocess.run([sys.executable, "-c", COUNT_EVENTS, "generate", "--model", str(model_dir), "--prompt",
                          "w1 w2 w3", "--preset", "fast-dllm-parallel", "--gen-length", "8", "--block-length", "8"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"text": out.stdout.strip().splitlines()[0]}


@pytest.mark.slow  # moved to the slow run: the default run's 6-minute budget
def test_second_generate_loads_the_compiled_programs(tmp_path):
    from test_cli import _tiny_llada_with_tokenizer

    _tiny_llada_with_tokenizer(tmp_path / "model")
    folder = tmp_path / "xla"
    first = _generate(tmp_path / "model", str(folder))
    assert first["code"] == 0 and first["misses"] > 0 and first["hits"] == 0, first
    written = sorted(p.name for p in folder.iterdir())
    assert written, "nothing written to the cache folder"
    second = _generate(tmp_path / "model", str(folder))
    assert second["hits"] >= first["misses"] and second["misses"] == 0, second
    assert second["text"] == first["text"]
    assert sorted(p.name for p in folder.iterdir()) == written

    off = _generate(tmp_path / "model", "off")
    assert off["hits"] == off["misses"] == 0 and off["text"] == first["text"]


@pytest.mark.slow  # a fresh process: the slow run, for the default run's 6-minute budget
def test_uncreatable_folder_warns_and_runs_without(tmp_path):
    (tmp_path / "file").write_text("not a folder")  # the cache folder would have to be inside a file
    code = ("import warnings, jax\nfrom jaxdllm import enable_compilation_cache\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            f"    print(enable_compilation_cache({str(tmp_path / 'file' / 'xla')!r}), jax.config.jax_compilation_cache_dir,"
            " 'cannot be created' in str(w[0].message))\n")
    env = cli_env()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "None", "True"]
