"""`impl="auto"` per platform: the GPU table agrees with the H100 benchmark JSON it cites, cuDNN is
chosen only for calls it can express, and TPUs get the splash kernel."""

import json
import statistics
from pathlib import Path

import jax.numpy as jnp
import pytest

from jaxdllm.attention import GPU_AUTO, MaskSpec, resolve_impl
from support import registries
from support.mask_rules import MEDUSA

BENCHMARK = Path(__file__).resolve().parents[2] / "sampling" / "results" / "attention_benchmark_h100.json"
KIND_OF = {"dense": "bidirectional", "causal": "causal", "block_diffusion": "block_diffusion",
           "jacobi_forcing": "jacobi_forcing"}


def test_gpu_table_picks_the_faster_backend_of_the_benchmark():
    rows = json.loads(BENCHMARK.read_text())["rows"]
    times: dict[tuple, dict[str, float]] = {}
    for r in rows:
        times.setdefault((r["mask"], r["length"], r["mode"]), {})[r["impl"]] = r["ms"]
    checked = set()
    for (mask, _, _), by_impl in times.items():
        if "pallas" in by_impl and "cudnn" in by_impl:
            checked.add(mask)
    assert set(KIND_OF) <= checked
    for mask in checked:
        ratios = [t["pallas"] / t["cudnn"] for (m, _, _), t in times.items() if m == mask and {"pallas", "cudnn"} <= set(t)]
        faster = "cudnn" if statistics.median(ratios) > 1 else "pallas"   # median over lengths and fwd / fwd+bwd
        assert GPU_AUTO[KIND_OF[mask]] == faster, (mask, ratios)


def _q(length=256, dtype=jnp.bfloat16, d=128):
    return jnp.zeros((1, length, 4, d), dtype)


@pytest.mark.parametrize("mask,q,k,expected", [
    (MaskSpec(kind="causal"), _q(), _q(), "cudnn"),
    (MaskSpec(kind="bidirectional"), _q(64), _q(), "cudnn"),
    (MaskSpec(kind="causal"), _q(64), _q(), "pallas"),                      # queries offset into longer keys
    (MaskSpec(kind="causal"), _q(dtype=jnp.float32), _q(dtype=jnp.float32), "pallas"),  # cuDNN: bf16/fp16 only
    (MaskSpec(kind="causal"), _q(d=256), _q(d=256), "pallas"),
    (MaskSpec(kind="bidirectional", q_segment_ids=jnp.ones((1, 256), jnp.int32),
              kv_segment_ids=jnp.ones((1, 256), jnp.int32)), _q(), _q(), "pallas"),  # per-row structure
    (MaskSpec(kind="bidirectional", q_offset=32), _q(), _q(), "pallas"),
    (MaskSpec(kind="block_causal", block_size=32), _q(), _q(), "pallas"),
    (MaskSpec(kind="block_diffusion", block_size=32), _q(), _q(), "pallas"),
    (MaskSpec(kind="jacobi_forcing", block_size=32), _q(), _q(), "pallas"),
    (MaskSpec(kind="lookahead", window_shape=(4, 7, 4), prefix_len=64), _q(), _q(), "pallas"),
    (MaskSpec(kind="tree", tree=MEDUSA, prefix_len=64), _q(), _q(), "pallas"),
    (MaskSpec(kind="tree", tree=MEDUSA, block_size=4, prefix_len=jnp.array([64])), _q(), _q(), "pallas"),
])
def test_gpu_auto_uses_cudnn_only_where_it_can(mask, q, k, expected):
    assert resolve_impl("auto", "gpu", mask=mask, q=q, k=k) == expected


def test_other_platforms():
    mask = MaskSpec(kind="causal")
    assert resolve_impl("auto", "tpu", mask=mask, q=_q(), k=_q()) == "splash"
    assert resolve_impl("auto", "cpu", mask=mask, q=_q(), k=_q()) == "reference"
    assert resolve_impl("cudnn", "gpu") == "cudnn"


# -- under the mesh context current JAX documents: jax.set_mesh(jax.make_mesh(...)), Explicit axes --

def _explicit_cases():
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((2, 128, 4, 32)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((2, 160, 2, 32)), jnp.float32)
    seg = jnp.asarray(np.r_[[[1] * 160], [[0] * 40 + [1] * 120]], jnp.int32)
    masks = {"causal": MaskSpec(kind="causal", q_offset=32),
             "block_diffusion+segments": MaskSpec(kind="block_diffusion", block_size=32, q_offset=32,
                                                  q_segment_ids=seg[:, 32:], kv_segment_ids=seg)}
    return jax, q, k, masks


# Every registered backend, placed both ways, in the slow run (the default run's 6-minute budget);
# tests/test_contracts.py checks each backend unsharded, and tests/test_meshes.py the model under an
# Explicit-axes mesh, in the default run.
@pytest.mark.mesh
@pytest.mark.parametrize("impl,placed", [
    pytest.param(i, p, marks=pytest.mark.slow) for i in registries.attention_backends() for p in ("sharded", "unsharded")])
def test_every_backend_under_an_explicit_axes_mesh(impl, placed):
    """Forward and gradient inside `jax.set_mesh(jax.make_mesh(...))` equal the dense reference
    outside it, for inputs that carry no sharding and for inputs sharded over the mesh; the
    output keeps the query's sharding."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxdllm.attention import attend
    from jaxdllm.attention.reference import reference_attention

    jax, q, k, masks = _explicit_cases()
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    options = registries.backend_options(impl)  # the Pallas kernels in interpret mode; cuDNN off a GPU: skipped
    for name, mask in masks.items():
        want = reference_attention(q, k, k, mask)
        want_grad = jax.grad(lambda q: reference_attention(q, k, k, mask).sum())(q)
        with jax.set_mesh(mesh):
            a, b = q, k
            if placed == "sharded":
                a, b = (jax.device_put(x, NamedSharding(mesh, P("data", None, "tensor", None))) for x in (q, k))
            got = jax.jit(lambda q, k: attend(q, k, k, mask, impl=impl, **options))(a, b)
            grad = jax.grad(lambda q: attend(q, b, b, mask, impl=impl, **options).sum())(a)
            assert jax.typeof(got).sharding.spec == jax.typeof(a).sharding.spec, name
        assert jnp.abs(got - want).max() < 1e-5, name
        assert jnp.abs(grad - want_grad).max() < 1e-4, name
