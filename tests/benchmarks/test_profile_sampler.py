"""The compiled loop updates its K/V caches in place, and `sampling/benchmarks/profile_sampler.py` reads a JAX
profiler trace into op groups.

A whole-cache `copy` inside the loop moves every layer's K/V through memory at each step (at
8B, batch 8, 320 slots: 1.3 GB); the caches whose steps write one window per step must not have
one. The audit reads XLA's optimized program, so it checks what runs, not what the code says."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxdllm
from jaxdllm import ModelConfig, SamplerConfig

from sampling.benchmarks.profile_sampler import build_model, cache_copies, compiled_loop, op_group, profile


def _loop_copies(model, config, batch=2, prompt_len=8):
    """Whole-cache copies per computation other than the entry (which runs once per generation)."""
    ids = np.random.default_rng(0).integers(0, 200, (batch, prompt_len)).astype(np.int32)
    text, kv_dims = compiled_loop(jaxdllm.Sampler(model), ids, config)
    # the program writes arrays of the cache's dims in place (else no copy could match them)
    dims = ",".join(map(str, kv_dims))
    assert re.search(rf"= \w+\[{dims}\]\S* (dynamic-update-slice|fusion)\(.*dynamic.update.slice", text)
    counts = cache_copies(text, kv_dims)
    counts.pop("ENTRY", None)
    return counts


@pytest.mark.parametrize("shape", [(2, 24, 4, 16), (3, 2, 24, 4, 16)])  # per layer; stacked (scanned models)
def test_audit_counts_the_loop_copy_of_a_carried_buffer(shape):
    def body(i, carry):
        cache, _ = carry
        return cache.at[..., i, :, :].set(1.0), cache  # the old cache stays live: XLA must copy it

    kv = jnp.zeros(shape)
    text = jax.jit(lambda c: jax.lax.fori_loop(0, 3, body, (c, c))).lower(kv).compile().as_text()
    counts = cache_copies(text, shape[-4:])
    counts.pop("ENTRY", None)
    assert sum(counts.values()) >= 1, counts


def test_dual_cache_writes_its_window_in_place():
    model = jaxdllm.Transformer(ModelConfig.preset("tiny-llada"), rngs=nnx.Rngs(0))
    config = SamplerConfig.preset("fast-dllm-dual", gen_length=64, steps=64, prompt_bucket=8)
    assert _loop_copies(model, config) == {}


def test_block_cache_writes_its_window_in_place():
    model = jaxdllm.Transformer(ModelConfig.preset("tiny-block-diffusion"), rngs=nnx.Rngs(0))
    config = SamplerConfig(gen_length=32, block_length=8, steps=32, policy="threshold", cache="block",
                           prompt_bucket=8)
    assert _loop_copies(model, config) == {}


def test_op_group_names_the_jax_operation():
    assert op_group("jit(decode)/while/body/cond/branch_0_fun/bld,dm->blm/dot_general") == "bld,dm->blm"
    assert op_group("jit(decode)/while/body/cond/branch_1_fun/cond/branch_2_fun/dynamic_update_slice") == \
        "dynamic_update_slice"
    assert op_group("jit(decode)/while/body/cond") == "cond"


@pytest.mark.slow  # a traced generation (~10 s)
def test_profile_attributes_the_step_to_the_model_matmuls(tmp_path):
    model = build_model("tiny", None)
    result = profile(model, "llada", 1, 16, 32, str(tmp_path / "trace"))
    groups = {g["op"]: g for g in result["groups"]}
    assert result["steps"] == 32 and result["xla_op_ms"] > 0
    assert abs(sum(g["share"] for g in result["groups"]) - 1) < 1e-6
    # the MLP and the Q/K/V projections are einsums of the model (`jaxdllm/models/layers.py`)
    for eqn in ("bld,dm->blm", "blm,md->bld", "bld,dhk->blhk"):
        assert groups[eqn]["ms"] > 0, sorted(groups)
    assert result["cache_copies"] == {}  # no cache at all with cache="none"
