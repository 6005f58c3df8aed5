"""`impl="auto"` per platform: the GPU table agrees with the H100 benchmark JSON it cites, cuDNN is
chosen only for calls it can express, and TPUs get the splash kernel."""

import json
import statistics
from pathlib import Path

import jax.numpy as jnp
import pytest

from jaxdllm.attention import GPU_AUTO, MaskSpec, resolve_impl

BENCHMARK = Path(__file__).resolve().parents[1] / "sampling" / "results" / "attention_benchmark_h100.json"
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
])
def test_gpu_auto_uses_cudnn_only_where_it_can(mask, q, k, expected):
    assert resolve_impl("auto", "gpu", mask=mask, q=q, k=k) == expected


def test_other_platforms():
    mask = MaskSpec(kind="causal")
    assert resolve_impl("auto", "tpu", mask=mask, q=_q(), k=_q()) == "splash"
    assert resolve_impl("auto", "cpu", mask=mask, q=_q(), k=_q()) == "reference"
    assert resolve_impl("cudnn", "gpu") == "cudnn"
