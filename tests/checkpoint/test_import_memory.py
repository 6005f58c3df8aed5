"""Host memory while a checkpoint imports, measured as the peak resident set (`VmHWM`) of a fresh
process, on a LLaDA-layout checkpoint scaled down from 8B (same vocabulary, narrower, 4 layers,
several safetensors files).

On a TPU the model lives in HBM; on this CPU it lives in host memory too, so what the import
itself costs the host is the peak minus the process before loading minus the model's own bytes.
That must stay within one safetensors file (its memory-mapped pages, released when the file is
done) plus two copies of the largest tensor (read, then placed). For LLaDA-8B this bounds the
host at the process's baseline + its largest file (at most 5 GB as published by transformers'
default shard size) + 2 GiB (two copies of its 0.97 GiB embedding table): about 7.5 GiB, under the
~12 GB a Colab host gives (README, TPU section)."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdllm import ModelConfig, Transformer
from jaxdllm.checkpoint import save_pretrained

MIB = 2 ** 20

CHILD = r"""
import json, sys
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
import jax, jaxdllm
from flax import nnx
jax.numpy.zeros(1).block_until_ready()  # the runtime is up before the baseline is taken
before = rss("VmRSS:")
extra = {"quantization": "int8"} if sys.argv[2] == "int8" else {}
model = jaxdllm.from_pretrained(sys.argv[1], dtype="bfloat16", **extra)
model_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
print(json.dumps({"before": before, "peak": rss("VmHWM:"), "model_bytes": model_bytes}))
"""


@pytest.fixture(scope="module")
def scaled_llada(tmp_path_factory):
    """LLaDA-8B's vocabulary and layout at a quarter of its width and 4 layers, bf16, in files of
    at most 64 MiB (the published checkpoint: six files)."""
    config = ModelConfig.preset("llada-8b", embed_dim=1024, num_heads=8, num_kv_heads=8, mlp_dim=3072,
                                num_layers=4)
    path = tmp_path_factory.mktemp("scaled-llada")
    # Random weights drawn by numpy into the model's own structure: JAX's eager initialisers draw these
    # 310M numbers in about five times the CPU time under the test processes' quick-compile flags
    # (tests/conftest.py); the values are irrelevant here, the layout, dtypes and files are the same.
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(0)
    state = jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape, np.float32) * np.float32(0.02),
                                               s.dtype), state)
    save_pretrained(nnx.merge(graphdef, state), path, max_shard_size="64MiB", dtype="bfloat16")
    return path, config


@pytest.mark.slow  # fresh processes loading a 600 MB checkpoint
@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
def test_import_costs_the_host_one_file_and_a_few_copies_of_the_largest_tensor(scaled_llada, weights):
    path, config = scaled_llada
    run = subprocess.run([sys.executable, "-c", CHILD, str(path), weights], capture_output=True, text=True,
                         timeout=600, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin",
                                           "JAXDLLM_COMPILATION_CACHE": "off"})
    assert run.returncode == 0, run.stderr[-2000:]
    m = json.loads(run.stdout.splitlines()[-1])
    files = sorted(path.glob("*.safetensors"))
    largest_file = max(f.stat().st_size for f in files)
    largest_tensor = config.vocab_size * config.embed_dim * 2  # the bf16 embedding table / LM head
    overhead = m["peak"] - m["before"] - m["model_bytes"]
    budget = largest_file + 2 * largest_tensor + 64 * MIB  # 64 MiB: allocator and compile slack
    if weights == "int8":  # quantized on its device from a float32 copy: on a TPU that copy is in HBM
        budget += 2 * largest_tensor
    print(f"{weights}: model {m['model_bytes'] / MIB:.0f} MiB, import overhead {overhead / MIB:.0f} MiB, "
          f"largest file {largest_file / MIB:.0f} MiB, largest tensor {largest_tensor / MIB:.0f} MiB")
    assert len(files) >= 3 and overhead <= budget, (overhead / MIB, budget / MIB)
