"""Where a sampler step's time goes: a JAX profiler trace of one compiled generation with its XLA
ops grouped by the JAX operation they came from, and an audit of whole-K/V-cache copies in the
compiled program.

    python -m sampling.benchmarks.profile_sampler --preset fast-dllm-dual --batch 8     # GPU: llada-8b shapes, bf16
    python -m sampling.benchmarks.profile_sampler --size small --preset llada --batch 1  # CPU: a small LLaDA, fp32
    python -m sampling.benchmarks.profile_sampler --size small --preset fast-dllm-prefix --batch 8 --trace-dir /tmp/t

(run from the repository root.) Weights are random; the LM head is scaled as in
`sampling.benchmarks.benchmark_side_by_side` so the threshold presets commit several tokens per forward.

Writes `<out>.json` (default `sampling/results/profile_<device>_<size>_<preset>_b<batch>.json`,
device `cpu` or the GPU's kind):

* `groups`: XLA op time summed by the JAX operation in its metadata (`bld,dm->blm` is the MLP's
  up/gate matmul, `dynamic_update_slice` a K/V write, `reduce` e.g. an argmax), each with ms,
  share of all XLA op time and ms per loop step, largest first; `--top` of them are printed.
* `top_ops`: the largest single XLA ops (fusions) with their JAX operation.
* `cache_copies`: `copy` instructions whose result has a K/V cache array's shape, by the
  computation holding them. `ENTRY` copies run once per generation (the empty cache); copies in
  any other computation (the loop body, a branch of the cache's conditional) run every step that
  reaches them, and each moves a whole layer's cache through memory.

The trace's op times are the profiler's; on a CPU they include the XLA runtime's thread waits
inside an op. `wall_s` is an untraced call for comparison.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
from flax import nnx

import jaxdllm
from jaxdllm.decoding import SamplerConfig
from jaxdllm.decoding.loop import decode
from jaxdllm.decoding.sampler import prepare
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.run_options import RunOptions
from jaxdllm.models.transformer import Transformer
from sampling.benchmarks.report import kind_slug, write_report
from sampling.benchmarks.timing import timed

_HLO_OP = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\([^)]*\)|\S+) ([\w\-]+)\((.*)")  # name, type, opcode, rest
_OP_NAME = re.compile(r'op_name="([^"]+)"')
_COMPUTATION = re.compile(r"^(ENTRY )?%(\S+) ")
_WRAPPERS = re.compile(r"^(jit\(.*\)|while|body|cond|branch_\d+_fun|closed_call|checkpoint|remat)$")


def device_slug() -> str:
    """`kind_slug` of this process's first device."""
    return kind_slug(jax.devices()[0].device_kind)


def build_model(size: str, head_scale: float | None) -> Transformer:
    """Random LLaDA-shaped weights: `8b` (llada-8b, bf16, made on the device) or `tiny`/`small`
    (`sampling.benchmarks.benchmark_sampler.SIZES`, fp32), LM head times `head_scale` (default: the
    side-by-side benchmark's calibrated factor for the shape)."""
    from sampling.benchmarks.benchmark_gpu_sampler import random_model
    from sampling.benchmarks.benchmark_sampler import SIZES
    from sampling.benchmarks.benchmark_side_by_side import default_head_scale

    if size == "8b":
        model = random_model(ModelConfig.preset("llada-8b"), RunOptions("bfloat16", "bfloat16"))
    else:
        model = Transformer(ModelConfig.preset("tiny-llada", **SIZES[size]), rngs=nnx.Rngs(0))
    scale = default_head_scale(model.config) if head_scale is None else head_scale
    model.lm_head.set_value(model.lm_head[...] * scale)
    return model


def op_group(op_name: str) -> str:
    """The JAX operation an XLA op came from, without the loop/branch path: `bld,dm->blm` for an
    einsum's matmul, else the last name (`dynamic_update_slice`, `reduce_max`, ...)."""
    parts = [p for p in op_name.split("/") if not _WRAPPERS.match(p)]
    if not parts:  # the loop's own control flow (e.g. the cache's conditional)
        return op_name.rsplit("/", 1)[-1]
    if parts[-1] == "dot_general" and len(parts) > 1:
        return parts[-2]
    return parts[-1]


def _instruction_lines(hlo_text: str):
    """`(computation, line)` for every instruction line of a compiled module's text; the entry
    computation is named `ENTRY`."""
    computation = None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header and line.rstrip().endswith("{"):
            computation = "ENTRY" if header.group(1) else header.group(2)
        elif computation:
            yield computation, line


def hlo_ops(hlo_text: str) -> dict[str, tuple[str, str, str]]:
    """XLA op name -> (result type, JAX operation, opcode) from a compiled module's text: the op's
    `op_name` metadata; for a fusion without it, the first `op_name` inside its fused computation
    (XLA's CPU matmul fusions carry theirs there), else its root's opcode (`dot` for the
    attention matmuls, whose names XLA drops when it regroups their heads); for other ops XLA
    added itself (copies, layout changes), their opcode."""
    found, first_name, root_opcode = [], {}, {}
    for computation, line in _instruction_lines(hlo_text):
        meta = _OP_NAME.search(line)
        if meta:
            first_name.setdefault(computation, meta.group(1))
        m = _HLO_OP.match(line)
        if m:
            found.append((m, meta))
            if line.lstrip().startswith("ROOT "):
                root_opcode[computation] = m.group(3)
    ops = {}
    for m, meta in found:
        called = re.search(r"calls=%([\w.\-]+)", m.group(4))
        if meta:
            name = meta.group(1)
        elif called:  # a fusion: its body's name, else its root's opcode (`dot` for a renamed matmul)
            name = first_name.get(called.group(1)) or root_opcode.get(called.group(1), m.group(3))
        else:
            name = m.group(3)
        ops[m.group(1)] = (m.group(2), name, m.group(3))
    return ops


def cache_copies(hlo_text: str, kv_dims: tuple[int, ...]) -> dict[str, int]:
    """Count of whole-cache copies per computation name (`ENTRY` for the entry computation).

    A whole-cache copy is a `copy` whose result has a K/V array's dims (`[B, S, Hkv, Dh]`, or
    with a leading layer axis for scanned models) and whose operand is carried state (a
    `get-tuple-element` of a loop or branch parameter), a K/V write (a fusion XLA named after its
    `dynamic-update-slice`) or the empty cache (a `broadcast`); a layout copy of an activation of
    the same shape is not one. Instructions inside fused computations are not counted (their
    fusion is)."""
    dims = ",".join(map(str, kv_dims))
    shape = re.compile(rf"= \w+\[(?:\d+,)?{dims}\]\S* copy\(%([\w.\-]+)\)")
    carried = re.compile(r"(get-tuple-element|parameter|\w*dynamic-update-slice|\w*broadcast)")
    counts = collections.Counter()
    for computation, line in _instruction_lines(hlo_text):
        if "fused" in computation or computation.startswith("wrapped"):
            continue
        copied = shape.search(line)
        if copied and carried.match(copied.group(1)):
            counts[computation] += 1
    return dict(counts)


def trace_op_times(trace_dir: str, known: dict) -> tuple[collections.Counter, collections.Counter, collections.Counter]:
    """(total µs, count) per XLA op of the newest perfetto trace under `trace_dir`, and total µs of
    the other events. An event is an XLA op when its name or its `hlo_op` argument (GPU kernels)
    names an op in `known` (`hlo_ops` of the traced program); where the trace has device
    processes (`/device:...`), only their events count as XLA ops, so host-side launches of the
    same op are not added to the kernels' time."""
    path = max(glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True), key=os.path.getmtime)
    data = json.load(gzip.open(path))
    events = data["traceEvents"] if isinstance(data, dict) else data
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and "/device:" in str((e.get("args") or {}).get("name", ""))}
    total, count, other = collections.Counter(), collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        key = next((k for k in (e["name"], args.get("hlo_op")) if k in known), None)
        if key is None or (devices and e.get("pid") not in devices):
            other[e["name"]] += e.get("dur", 0)
        else:
            total[key] += e.get("dur", 0)
            count[key] += 1
    return total, count, other


def compiled_loop(sampler: jaxdllm.Sampler, ids: np.ndarray, cfg: SamplerConfig) -> tuple[str, tuple[int, ...]]:
    """(optimized HLO text of the compiled generation `sampler(ids, cfg)` runs, the dims `[B, S,
    Hkv, Dh]` of one layer's K/V cache in it) for prompts `ids [B, Lp]` without padding, on
    unsharded parameters (a sharded sampler also pads the batch and places it on the mesh)."""
    mc = sampler.model_config
    p = prepare(mc, ids, None, cfg)
    text = decode.lower(sampler._graphdef, sampler.params, p.ids, p.seg, p.valid, jax.random.PRNGKey(0), None,
                        canvas=cfg.canvas, lay=p.lay, config=cfg).compile().as_text()
    return text, (p.ids.shape[0], p.lay.total, mc.num_kv_heads, mc.head_dim)


def profile(model, preset: str, batch: int, prompt_len: int, gen_length: int, trace_dir: str, top: int = 15) -> dict:
    """Trace one generation of `preset` (G `gen_length`, steps = G) on `batch` random prompts of
    `prompt_len` tokens `[batch, prompt_len]`.

    Returns a dict: the run (`preset`, `batch`, `prompt_len`, `gen_length`, `steps` loop
    iterations, `nfe_mean`, `device`, `first_call_s`, `wall_s` and `ms_per_step` of an untraced
    call, `xla_op_ms` traced), `groups` and `top_ops` (each entry `ms`, `share` of `xla_op_ms`,
    `ms_per_step`), `cache_copies` (`cache_copies` of the compiled loop) and `other_events`
    (the largest trace events that are not XLA ops: runtime, Python, host waits)."""
    cfg = SamplerConfig.preset(preset, gen_length=gen_length, steps=gen_length, prompt_bucket=prompt_len)
    mc = model.config
    ids = np.random.default_rng(0).integers(0, mc.mask_token_id - 4, (batch, prompt_len)).astype(np.int32)
    sampler = jaxdllm.Sampler(model)
    t = timed(lambda: sampler(ids, cfg), repeats=1)  # compile + run, then one untraced run
    first, wall = t.first_s, t.min_s
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        res = sampler(ids, cfg)

    text, kv_dims = compiled_loop(sampler, ids, cfg)
    ops = hlo_ops(text)
    # control flow is left out: a loop's or a branch's event spans the ops it runs
    leaves = {k: v for k, v in ops.items() if v[2] not in ("while", "conditional", "call")}
    xla, count, other = trace_op_times(trace_dir, leaves)
    xla_us = sum(xla.values())
    groups = collections.Counter()
    for k, v in xla.items():
        groups[op_group(ops[k][1])] += v
    steps = res.steps

    def row(us):
        return dict(ms=us / 1e3, share=us / xla_us if xla_us else 0.0, ms_per_step=us / 1e3 / steps)

    result = dict(
        preset=preset, batch=batch, prompt_len=prompt_len, gen_length=gen_length, steps=steps,
        nfe_mean=float(res.nfe.mean()), device=jax.devices()[0].device_kind, first_call_s=first, wall_s=wall,
        ms_per_step=wall / steps * 1e3, xla_op_ms=xla_us / 1e3,
        groups=[dict(op=k, **row(v)) for k, v in groups.most_common()],
        top_ops=[dict(xla_op=k, op=op_group(ops[k][1]), calls=count[k], **row(v))
                 for k, v in sorted(xla.items(), key=lambda kv: -kv[1])[:top]],
        cache_copies=cache_copies(text, kv_dims),
        # the largest events that are not XLA ops of the program (runtime, Python, host waits)
        other_events=[dict(name=k[:120], ms=v / 1e3) for k, v in other.most_common(top)])
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["8b", "small", "tiny"], default="8b")
    p.add_argument("--preset", default="fast-dllm-dual")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=None, help="default 64 (8b), 32 otherwise")
    p.add_argument("--gen-length", type=int, default=None, help="default 256 (8b), 128 otherwise")
    p.add_argument("--head-scale", type=float, default=None)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--trace-dir", default=None, help="keep the profiler trace here (default: a temporary folder)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    jaxdllm.enable_compilation_cache()  # the program is compiled twice (run, then its text): load it the second time
    big = args.size == "8b"
    lp = args.prompt_len or (64 if big else 32)
    gen = args.gen_length or (256 if big else 128)
    model = build_model(args.size, args.head_scale)
    with tempfile.TemporaryDirectory() as tmp:
        result = profile(model, args.preset, args.batch, lp, gen, args.trace_dir or tmp, args.top)
    result["size"] = args.size
    stem = f"sampling/results/profile_{device_slug()}_{args.size}_{args.preset}_b{args.batch}"
    out = Path(args.out or stem).with_suffix(".json")
    write_report(out, result)  # JSON only: the groups are a table, not a curve
    print(f"{args.size} {args.preset} batch {args.batch}: {result['steps']} steps, {result['ms_per_step']:.2f} ms/step "
          f"untraced, XLA ops {result['xla_op_ms']:.0f} ms traced on {result['device']}")
    if not result["groups"]:
        print("  no trace event named an XLA op of the program; the largest events are in other_events")
    for g in result["groups"][:args.top]:
        print(f"  {g['ms']:9.1f} ms {100 * g['share']:5.1f} % {g['ms_per_step']:8.3f} ms/step  {g['op']}")
    print(f"  whole-cache copies by computation: {result['cache_copies']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
