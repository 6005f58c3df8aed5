"""jaxdllm, the PyTorch eager port and a `torch.compile` port, side by side in one process on the
same weights: per decoding preset and batch size, ms per step against the memory-bandwidth floor,
model FLOP utilisation, tokens/s, NFE, tokens per forward, first-call time and token equality;
plus on-paper TPU v5e-8 / v6e-8 per-step times for the same work.

    python -m sampling.benchmarks.benchmark_side_by_side                      # GPU: llada-8b shapes, bf16
    python -m sampling.benchmarks.benchmark_side_by_side --size tiny --torch-threads 1   # CPU: tiny-llada, fp32
    python -m sampling.benchmarks.benchmark_side_by_side --rows llada fast-dllm-dual --batches 8 --reps 2
    python -m sampling.benchmarks.benchmark_side_by_side --size tiny --no-torch-compile --gen-length 32

(run from the repository root with it on PYTHONPATH.)

Decoders, all on identical weights read from one checkpoint directory (LLaDA layout):

* `jaxdllm`: `jaxdllm.Sampler(model)(prompts, SamplerConfig.preset(row, gen_length=G, steps=G))`:
  the whole generation in one compiled `jax.lax.while_loop`.
* `torch_eager`: the PyTorch eager port of the published loops (`sampling.torch_reference.torch_port.
  generate_batch`: one forward of the whole batch per step, per-row selection in Python) on
  `sampling.torch_reference.torch_llada.TorchLLaDA`.
* `torch_compile`: the same loop with `TorchLLaDA.forward`, `full` and `window` wrapped in
  `torch.compile` (`--no-torch-compile` skips it; a failure is recorded in the row).

Both torch decoders see logits whose MASK column is -1e30 (jaxdllm never predicts MASK).

Rows: the presets `llada` (steps = G: one token per step), `fast-dllm-parallel` (threshold 0.9),
`fast-dllm-prefix`, `fast-dllm-dual` (threshold 0.9 with Fast-dLLM's caches), `dparallel` (entropy
0.5), block 32, each at batch 1 and 8; G = 256 and prompt length 64 (tiny: G <= 64, prompt 16).

Weights: random (normal, std 0.02; norms 1), made on the accelerator by
`sampling.benchmarks.benchmark_gpu_sampler.random_model`, with the LM head multiplied by `--head-scale`, and
written to a temporary LLaDA-layout checkpoint (`jaxdllm.save_pretrained`) that both jaxdllm
(`jaxdllm.from_pretrained`) and `TorchLLaDA.from_pretrained` read. Unscaled random weights are
not confident, so the threshold policies would commit about one token per forward; the scaled
head peaks the logits. Default scale: 70 on tiny-llada (calibrated on the tiny run, G 64:
`fast-dllm-parallel` commits 2.4 tokens per forward at batch 8, 2.7 over its batch-1 and batch-8
rows together, the batch-1 prompt 12.8), and for other shapes the factor giving the
same logit std relative to `sqrt(2 ln V)` (the scale of the top-1 / top-2 gap of V Gaussian
logits): ~12.8 for llada-8b, an extrapolation, not a measured rate: read `tokens_per_forward` in
every row. Random weights predict nearly the same distribution at every masked position, so a
row tends to commit either one token per forward or a whole block at once; the rate is an average
over such rows, not a realistic per-step mix.

Columns per (row, decoder):

* `ms_per_step`: wall / forwards of the batch (`forwards`: jaxdllm's loop steps; torch: counted).
* `x_floor`: ms_per_step / (weight bytes / measured bandwidth) (`benchmark_gpu_sampler.
  measured_bandwidth`; a step reads every weight once at least).
* `mfu`: FLOPs fed / (wall x peak). FLOPs of a forward over T fed tokens of a canvas of L:
  `B (2 N T + 4 n_layers T L H hd)`, N the non-embedding parameters (LM head included, counted
  on every fed token). T: L (no cache; a block's first, refreshing step), the block and all after
  it (prefix), the block (dual). Peak: `--peak-tflops`, default by GPU name (H100 / H200 989,
  A100 312 bf16 dense), on CPU a measured fp32 matmul peak.
* `tokens_per_s` (B G / wall), `nfe` (mean forwards per row), `tokens_per_forward` (G / nfe),
  `first_call_s` (jaxdllm: compile + run; torch: the first, untimed call, compile included; the
  compiled torch functions are shared by all rows, so a later row pays only the recompiles for
  its new shapes, and inductor's on-disk cache can make even the first row warm),
  `tokens_equal_port` (all rows' answers equal the eager port's), `rows_equal_fraction`.
  bf16 numerics may differ slightly between frameworks on a GPU: this is recorded, not asserted.

TPU rows (`tpu`): for each row, jaxdllm's step schedule predicted on 8 chips with the weights
(bf16) and FLOPs split evenly: per step max(weight bytes / 8 / HBM bandwidth, FLOPs / 8 / bf16
peak); v5e 819 GB/s and 197 TFLOP/s per chip, v6e 1640 GB/s and 918 TFLOP/s. Collectives, K/V
and activation traffic and kernel overheads are ignored: these are lower bounds.

Writes `<out>.json` after every row, `<out>.png` (ms per step per row, a bar per decoder, the
floor line) and prints a markdown table at the end.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave GPU memory for torch

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from jaxdllm.extras import exit_if_missing
import jaxdllm
from jaxdllm.decoding import SamplerConfig
from jaxdllm.flops import forward_flops, matmul_params
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.run_options import RunOptions
from sampling.benchmarks.benchmark_gpu_sampler import measured_bandwidth, random_model
from sampling.benchmarks.report import torch_facts, write_report
from sampling.benchmarks.timing import timed

PRESETS = ("llada", "fast-dllm-parallel", "fast-dllm-prefix", "fast-dllm-dual", "dparallel")
DECODERS = ("jaxdllm", "torch_eager", "torch_compile")
COLUMNS = ("ms_per_step", "x_floor", "mfu", "tokens_per_s", "nfe", "tokens_per_forward", "forwards",
           "first_call_s", "tokens_equal_port", "rows_equal_fraction", "wall_s", "flops_per_step")
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # bf16 dense, by GPU name
TPUS = {"v5e-8": dict(chips=8, hbm_GBps=819.0, bf16_TFLOPs=197.0),
        "v6e-8": dict(chips=8, hbm_GBps=1640.0, bf16_TFLOPs=918.0)}
TPU_NOTE = ("on paper: 8 chips, weights (bf16) and FLOPs split evenly over them; per step "
            "max(weight bytes per chip / HBM bandwidth, FLOPs per chip / bf16 peak), summed over jaxdllm's "
            "steps of the row. Collectives, K/V and activation traffic and kernel overheads are ignored, "
            "so these are lower bounds.")
TINY_HEAD_SCALE = 70.0  # default LM head factor of tiny-llada (calibrated: fast-dllm-parallel 2-3 tokens/forward)
INIT_STD = 0.02         # random_model's weight std
NO_MASK = -1e30          # the MASK column of the torch decoders' logits (jaxdllm never predicts MASK)


# ----------------------------------------------------------------------------- weights

def logit_spread(config: ModelConfig) -> float:
    """Logit std per unit of head scale, over sqrt(2 ln V): the final RMSNorm leaves hidden states
    of norm ~sqrt(d), so a head of std 0.02 gives logits of std ~0.02 sqrt(d); sqrt(2 ln V) is the
    scale of the gap between the largest two of V Gaussian logits (what a confidence threshold reads)."""
    return INIT_STD * math.sqrt(config.embed_dim) / math.sqrt(2 * math.log(config.vocab_size))


def default_head_scale(config: ModelConfig) -> float:
    """`TINY_HEAD_SCALE` (70) for tiny-llada's shapes; other shapes get the factor that gives them the
    same `logit_spread` x factor (llada-8b: ~12.8). Calibrated on tiny only: read tokens per forward."""
    return TINY_HEAD_SCALE * logit_spread(ModelConfig.preset("tiny-llada")) / logit_spread(config)


def write_checkpoint(config: ModelConfig, path: Path, head_scale: float, dtype: str = "float32") -> Path:
    """Random `dtype` weights (`random_model`, on the default device) with the LM head `[d, V]` times
    `head_scale`, saved in LLaDA layout under `path` (config.json + safetensors)."""
    model = random_model(config, RunOptions(dtype, dtype))
    model.lm_head.set_value(model.lm_head[...] * head_scale)
    jaxdllm.save_pretrained(model, path)
    del model
    return path


# ----------------------------------------------------------------------------- step schedules

def fed_tokens(cache: str, first: bool, block: int, prompt_len: int, gen_length: int, block_length: int) -> int:
    """Tokens a forward feeds per row: the whole canvas without a cache or at a block's first
    step; the block and all after it (prefix); the block (dual)."""
    if cache == "none" or first:
        return prompt_len + gen_length
    return gen_length - block * block_length if cache == "prefix" else block_length


def jax_schedule(commit_step: np.ndarray, nfe: np.ndarray, config: SamplerConfig, prompt_len: int) -> list[tuple[int, bool]]:
    """jaxdllm's batch forwards as (block, first step of the block) from its result.

    commit_step `[B, Lp+G]` (a row's NFE counter at the forward that committed each token), nfe `[B]`.
    The batch decodes the blocks in lockstep; a row takes part in a block's forwards until the
    block is full for it, so block b takes max over rows of (last commit in b - last commit in
    b - 1) forwards. Scheduled policies (llada) take `steps_per_block` forwards per block.
    """
    nb, bl = config.num_blocks, config.block_length
    if config.policy.name == "llada":
        per_block = [config.steps_per_block] * nb
    else:
        last = commit_step[:, prompt_len:].reshape(len(nfe), nb, bl).max(-1)           # [B, nb]
        before = np.concatenate([np.zeros((len(nfe), 1), last.dtype), last[:, :-1]], 1)
        per_block = (last - before).max(0).tolist()
    return [(b, j == 0) for b in range(nb) for j in range(int(per_block[b]))]


class PortModel:
    """The model side of the torch decoders: `__call__`, `full`, `window` (a `torch_port.KVModel`)
    over a `TorchLLaDA` (or compiled versions of its three forwards), with the MASK logit set to
    -1e30 and every forward recorded in `calls` as (batch, fed tokens, keys)."""

    def __init__(self, model, mask_id: int, compile_fn=None):
        wrap = compile_fn or (lambda f: f)
        self.model = model
        self._forward, self._full, self._window = wrap(model.forward), wrap(model.full), wrap(model.window)
        self.mask_id, self.calls = mask_id, []

    def _no_mask(self, logits):
        logits[..., self.mask_id] = NO_MASK  # in place: logits are a fresh float32 tensor
        return logits

    def __call__(self, ids):
        """ids `[B, L]` -> logits `[B, L, V]` float32."""
        self.calls.append((ids.shape[0], ids.shape[1], ids.shape[1]))
        return self._no_mask(self._forward(ids))

    def full(self, ids):
        """ids `[B, L]` -> (logits `[B, L, V]`, per-layer K/V)."""
        self.calls.append((ids.shape[0], ids.shape[1], ids.shape[1]))
        logits, kv = self._full(ids)
        return self._no_mask(logits), kv

    def window(self, ids, start, kv, logits_len=None):
        """ids `[B, w]` at canvas positions [start, start + w) -> logits `[B, logits_len or w, V]`."""
        self.calls.append((ids.shape[0], ids.shape[1], kv[0][0].shape[2]))
        return self._no_mask(self._window(ids, start, kv, logits_len))


# ----------------------------------------------------------------------------- measuring

def peak_flops(device_kind: str, platform: str, flag: float | None) -> tuple[float, str]:
    """(FLOP/s, where it came from): the flag, the GPU's bf16 dense figure by name, or on CPU a
    measured fp32 matmul peak (`benchmark_sampler.matmul_peak_flops`)."""
    if flag:
        return flag * 1e12, "--peak-tflops"
    if platform == "gpu":
        for name, tflops in PEAK_TFLOPS.items():
            if name in device_kind.upper():
                return tflops * 1e12, f"{name} bf16 dense ({tflops} TFLOP/s)"
        raise SystemExit(f"unknown GPU {device_kind!r}: pass --peak-tflops")
    from sampling.benchmarks.benchmark_sampler import matmul_peak_flops

    return matmul_peak_flops(), "measured fp32 matmul (jax, 1024^3)"


def tpu_estimate(config: ModelConfig, schedule: list[tuple[int, bool]], batch: int, cache: str, prompt_len: int,
                 gen_length: int, block_length: int, chip: dict) -> dict:
    """Predicted per-step time and tokens/s of a row's steps (schedule: (block, first) per forward)
    on `chip['chips']` chips sharing bf16 weights (2 bytes a parameter) and FLOPs evenly."""
    n, total = chip["chips"], prompt_len + gen_length
    bytes_chip = 2.0 * config.num_params / n
    t_mem = bytes_chip / (chip["hbm_GBps"] * 1e9)
    times, compute_bound = [], 0
    for block, first in schedule:
        fed = fed_tokens(cache, first, block, prompt_len, gen_length, block_length)
        t_flop = forward_flops(config, fed, total, batch=batch) / n / (chip["bf16_TFLOPs"] * 1e12)
        times.append(max(t_mem, t_flop))
        compute_bound += t_flop > t_mem
    wall = sum(times)
    return dict(ms_per_step=wall / len(times) * 1e3, tokens_per_s=batch * gen_length / wall,
                compute_bound_steps=compute_bound / len(times), memory_floor_ms=t_mem * 1e3, **chip)


def _columns(wall: float, forwards: int, flops: float, nfe: np.ndarray, batch: int, gen: int, floor_ms: float,
             peak: float, first: float, tokens: np.ndarray, ref: np.ndarray | None) -> dict:
    """One decoder's columns from its run (tokens, ref: answers `[B, G]`)."""
    equal = None if ref is None else (tokens == ref).all(-1)
    return dict(ms_per_step=wall / forwards * 1e3, x_floor=wall / forwards * 1e3 / floor_ms,
                mfu=flops / wall / peak, tokens_per_s=batch * gen / wall, nfe=float(np.mean(nfe)),
                tokens_per_forward=gen / float(np.mean(nfe)), forwards=int(forwards), first_call_s=first,
                tokens_equal_port=None if ref is None else bool(equal.all()),
                rows_equal_fraction=None if ref is None else float(equal.mean()), wall_s=wall,
                flops_per_step=flops / forwards)


def run_row(name: str, batch: int, ctx: dict, args) -> dict:
    """Time the decoders on one (preset, batch) row; returns the row dict (see the module docstring)."""
    import torch

    from sampling.torch_reference.torch_port import generate_batch

    config = ctx["config"]
    lp, gen = args.prompt_len, args.gen_length
    cfg = SamplerConfig.preset(name, gen_length=gen, steps=gen, prompt_bucket=lp)
    policy = {"llada": "low_confidence"}.get(cfg.policy.name, cfg.policy.name)
    cache = cfg.cache.name
    # the same generator for every batch: the batch-1 prompt is the first row of the batch-8 prompts
    ids = np.random.default_rng(0).integers(0, min(config.mask_token_id, config.vocab_size) - 4,
                                            (batch, lp)).astype(np.int32)
    row = dict(row=f"{name}-b{batch}", preset=name, batch=batch, policy=policy, cache=cache,
               block_length=cfg.block_length, steps=cfg.steps, decoders={})
    for key in ("threshold", "entropy_threshold"):
        if key in type(cfg.policy).settings():
            row[key] = getattr(cfg.policy, key)
    floor_ms, peak = ctx["floor_ms"], ctx["peak"]

    # jaxdllm
    sampler = ctx["sampler"]
    try:
        t = timed(lambda: sampler(ids, cfg), repeats=args.reps)  # the first call, then the median of reps
    except Exception as e:  # an attention kernel that fails here: measure the sampler with XLA attention
        row["attention_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        ctx["model"] = ctx["model"].with_options(attention_impl="xla")
        sampler = ctx["sampler"] = jaxdllm.Sampler(ctx["model"])
        t = timed(lambda: sampler(ids, cfg), repeats=args.reps)
    first, wall, res = t.first_s, t.median_s, t.out
    schedule = jax_schedule(res.commit_step, res.nfe, cfg, lp)
    if len(schedule) != res.steps:
        row["schedule_warning"] = f"derived {len(schedule)} forwards, the loop ran {res.steps}"
    jax_flops = sum(forward_flops(config, fed_tokens(cache, f, b, lp, gen, cfg.block_length), lp + gen, batch=batch)
                    for b, f in schedule)
    jax_tokens = res.tokens[:, lp:]

    # torch decoders
    dev = ctx["torch_device"]
    prompts = torch.as_tensor(ids, dtype=torch.long, device=dev)
    sync = (lambda out: torch.cuda.synchronize()) if dev == "cuda" else (lambda out: None)  # torch on the CPU: done
    kw = dict(gen_length=gen, block_length=cfg.block_length, steps=cfg.steps, mask_id=config.mask_token_id,
              policy=policy, threshold=getattr(cfg.policy, "threshold", 0.9),
              entropy_threshold=getattr(cfg.policy, "entropy_threshold", 0.5), cache=cache)
    port_tokens = None
    for decoder in DECODERS[1:]:
        if decoder == "torch_compile" and args.no_torch_compile:
            row["decoders"][decoder] = {"skipped": "--no-torch-compile"}
            continue
        if decoder == "torch_compile" and "compiled" not in ctx:
            ctx["compiled"] = _compiled(ctx)
        model = ctx["port"] if decoder == "torch_eager" else ctx["compiled"]
        try:
            def call():
                model.calls.clear()
                return generate_batch(model, prompts, **kw)

            t = timed(call, repeats=args.reps, sync=sync)
            first_t, wall_t, out = t.first_s, t.median_s, t.out
            flops = sum(forward_flops(config, fed, keys, batch=b) for b, fed, keys in model.calls)
            tokens = out["tokens"][:, lp:].cpu().numpy()
            if decoder == "torch_eager":
                port_tokens = tokens
            row["decoders"][decoder] = _columns(wall_t, len(model.calls), flops, out["nfe"].numpy(), batch, gen,
                                                floor_ms, peak, first_t, tokens, port_tokens)
        except Exception as e:  # record and go on (torch.compile may fail on some setups)
            row["decoders"][decoder] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    row["decoders"]["jaxdllm"] = _columns(wall, res.steps, jax_flops, res.nfe, batch, gen, floor_ms, peak, first,
                                          jax_tokens, port_tokens)
    row["decoders"] = {d: row["decoders"][d] for d in DECODERS}
    j = row["decoders"]["jaxdllm"]
    for decoder, key in (("torch_eager", "jax_over_port_tokens_per_s"), ("torch_compile", "jax_over_compile_tokens_per_s")):
        other = row["decoders"][decoder].get("tokens_per_s")
        row[key] = j["tokens_per_s"] / other if other else None
    row["tpu"] = {chip: tpu_estimate(config, schedule, batch, cache, lp, gen, cfg.block_length, spec)
                  for chip, spec in TPUS.items()}
    return row


def _compiled(ctx: dict) -> PortModel:
    """A `PortModel` over `torch.compile`d forward, full and window of the same TorchLLaDA."""
    import torch

    for name in ("cache_size_limit", "recompile_limit"):  # prefix windows change shape per block
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    mode = ctx.get("compile_mode")
    return PortModel(ctx["port"].model, ctx["config"].mask_token_id,
                     compile_fn=lambda f: torch.compile(f, **({"mode": mode} if mode else {})))


# ----------------------------------------------------------------------------- main

def main(argv=None) -> int:
    """Run the rows, writing `<out>.json` after each, then `<out>.png` and a markdown table."""
    exit_if_missing(("torch", "matplotlib"), "bench", "python -m sampling.benchmarks.benchmark_side_by_side")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["8b", "tiny"], default="8b")
    p.add_argument("--rows", nargs="*", default=list(PRESETS), choices=PRESETS)
    p.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=64, help="tiny: at most 16")
    p.add_argument("--gen-length", type=int, default=256, help="tiny: at most 64")
    p.add_argument("--reps", type=int, default=2, help="timed calls per decoder (median), after one first call")
    p.add_argument("--head-scale", type=float, default=None,
                   help="LM head factor (default: logit std HEAD_LOGIT_SPREAD * sqrt(2 ln V))")
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak (default: by GPU name; CPU: measured)")
    p.add_argument("--no-torch-compile", action="store_true")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: torch's default)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's; 1 avoids spinning threads on a busy CPU)")
    p.add_argument("--attention-impl", default=None, help="jaxdllm attention_impl override")
    p.add_argument("--tmp-dir", default=None, help="where the temporary checkpoint goes (8b: 16 GB)")
    p.add_argument("--out", default=None, help="path stem (default sampling/results/side_by_side_{gpu,cpu})")
    args = p.parse_args(argv)

    import torch

    from sampling.torch_reference.torch_llada import TorchLLaDA

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    tiny = args.size == "tiny"
    platform = jax.default_backend()
    on_gpu = platform == "gpu"
    if tiny:
        args.gen_length, args.prompt_len = min(args.gen_length, 64), min(args.prompt_len, 16)
        config, dtype = ModelConfig.preset("tiny-llada"), "float32"
    else:
        config, dtype = ModelConfig.preset("llada-8b"), "bfloat16"  # the published checkpoint's dtype
    config = config.replace(max_position=max(config.max_position, args.prompt_len + args.gen_length))
    head_scale = args.head_scale if args.head_scale is not None else default_head_scale(config)
    out = Path(args.out or f"sampling/results/side_by_side_{'gpu' if on_gpu else 'cpu'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    torch_device = "cuda" if on_gpu and torch.cuda.is_available() else "cpu"
    torch_dtype = torch.float32 if dtype == "float32" else torch.bfloat16

    ctx = dict(config=config, compile_mode=args.compile_mode)
    with tempfile.TemporaryDirectory(dir=args.tmp_dir) as tmp:
        path = write_checkpoint(config, Path(tmp) / "llada", head_scale, dtype)
        overrides = {"attention_impl": args.attention_impl} if args.attention_impl else {}
        model = jaxdllm.from_pretrained(path, dtype=dtype, **overrides)
        ctx.update(model=model, sampler=jaxdllm.Sampler(model))
        torch_model = TorchLLaDA.from_pretrained(path, dtype=torch_dtype, device=torch_device).eval()
    ctx["port"] = PortModel(torch_model, config.mask_token_id)
    ctx["torch_device"] = torch_device
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
    bandwidth = measured_bandwidth(0.25 if tiny else 4.0)
    ctx["floor_ms"] = weight_bytes / bandwidth * 1e3
    ctx["peak"], peak_source = peak_flops(jax.devices()[0].device_kind, platform, args.peak_tflops)

    result = dict(
        torch_device=torch_device, **torch_facts(),
        model="tiny-llada" if tiny else "llada-8b", dtype=dtype,
        dims=dict(vocab=config.vocab_size, d=config.embed_dim, layers=config.num_layers, heads=config.num_heads,
                  kv_heads=config.num_kv_heads, head_dim=config.head_dim, mlp=config.mlp_dim),
        params=config.num_params, non_embedding_params=matmul_params(config), weight_bytes=weight_bytes,
        bandwidth_GBps=bandwidth / 1e9, floor_ms_per_step=ctx["floor_ms"], peak_tflops=ctx["peak"] / 1e12,
        peak_source=peak_source, head_scale=head_scale,
        weights=(f"random_model (normal std {INIT_STD}, norms 1) on {platform}, LM head x {head_scale:.3g}, saved with "
                 "jaxdllm.save_pretrained in LLaDA layout to a temporary directory; jaxdllm.from_pretrained and "
                 "TorchLLaDA.from_pretrained both read that checkpoint. The scaled head makes the threshold "
                 "policies commit several tokens per forward (see tokens_per_forward); default scale 70 on "
                 "tiny-llada (calibrated), other shapes the same logit std relative to sqrt(2 ln V) (not "
                 "calibrated). Random weights predict nearly the same distribution at every masked position, so "
                 "a row tends to commit one token or a whole block per forward"),
        prompt_len=args.prompt_len, gen_length=args.gen_length, block_length=32, reps=args.reps,
        flops_note="FLOPs fed per forward (jaxdllm.flops.forward_flops): B (2 N T + 4 n_layers T L H hd), N "
                   "non-embedding params (LM head counted on every fed token), T fed tokens, L canvas; "
                   "MFU = FLOPs / (wall x peak)",
        tpu_assumptions=dict(chips=TPUS, note=TPU_NOTE), rows=[])
    print(f"{jax.devices()[0].device_kind} ({platform}, torch on {torch_device}): {config.num_params / 1e9:.3g}B params, "
          f"{weight_bytes / 1e9:.3g} GB, bandwidth {bandwidth / 1e9:.0f} GB/s, floor {ctx['floor_ms']:.3g} ms/step, "
          f"peak {ctx['peak'] / 1e12:.3g} TFLOP/s ({peak_source}), head scale {head_scale:.3g}", flush=True)

    for name in args.rows:
        for batch in args.batches:
            try:
                row = run_row(name, batch, ctx, args)
            except Exception as e:  # record and go on
                row = dict(row=f"{name}-b{batch}", preset=name, batch=batch, error=f"{type(e).__name__}: {str(e)[:400]}")
            result["rows"].append(row)
            result["summary"] = _summary(result["rows"])
            result = write_report(out, result)  # now with the device facts
            print(json.dumps({k: v for k, v in row.items() if k != "tpu"}), flush=True)
    result = write_report(out, result, plot, quiet=True)
    print(markdown(result))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


def _summary(rows: list[dict]) -> dict:
    """Fraction of rows whose jaxdllm (and torch.compile) answers equal the eager port's, and
    jaxdllm's tokens per forward per row."""
    out = {}
    for decoder in ("jaxdllm", "torch_compile"):
        flags = [r["decoders"][decoder]["tokens_equal_port"] for r in rows
                 if "decoders" in r and r["decoders"][decoder].get("tokens_equal_port") is not None]
        out[f"{decoder}_rows_equal_port"] = (sum(flags) / len(flags)) if flags else None
    out["tokens_per_forward"] = {r["row"]: r["decoders"]["jaxdllm"]["tokens_per_forward"] for r in rows
                                 if "decoders" in r}
    return out


def markdown(result: dict) -> str:
    """The rows as markdown tables: the decoders, then the TPU estimates."""
    lines = [f"\n{result['model']} {result['dtype']} on {result['device']}, G={result['gen_length']}, "
             f"prompt {result['prompt_len']}, floor {result['floor_ms_per_step']:.3g} ms/step, peak "
             f"{result['peak_tflops']:.3g} TFLOP/s, head scale {result['head_scale']:.3g}\n",
             "| row | decoder | ms/step | x floor | MFU | tok/s | NFE | tok/fwd | first call s | = port | jax/this tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['row']} | error: {r['error'][:100]} |")
            continue
        j = r["decoders"]["jaxdllm"]
        for d in DECODERS:
            c = r["decoders"][d]
            if "ms_per_step" not in c:
                lines.append(f"| {r['row']} | {d} | {c.get('skipped') or c.get('error', '')[:100]} |")
                continue
            ratio = j["tokens_per_s"] / c["tokens_per_s"]
            lines.append(f"| {r['row']} | {d} | {c['ms_per_step']:.3g} | {c['x_floor']:.3g} | {100 * c['mfu']:.2g}% | "
                         f"{c['tokens_per_s']:.4g} | {c['nfe']:.1f} | {c['tokens_per_forward']:.2f} | "
                         f"{c['first_call_s']:.2f} | {c['tokens_equal_port']} | {ratio:.2f} |")
    s = result.get("summary", {})
    lines += [f"\nrows with jaxdllm answers equal to the eager port's: {s.get('jaxdllm_rows_equal_port')}; "
              f"torch.compile: {s.get('torch_compile_rows_equal_port')}\n",
              "| row | v5e-8 ms/step | v5e-8 tok/s | v6e-8 ms/step | v6e-8 tok/s | v6e-8 compute-bound steps |",
              "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "tpu" in r:
            a, b = r["tpu"]["v5e-8"], r["tpu"]["v6e-8"]
            lines.append(f"| {r['row']} | {a['ms_per_step']:.3g} | {a['tokens_per_s']:.4g} | {b['ms_per_step']:.3g} | "
                         f"{b['tokens_per_s']:.4g} | {100 * b['compute_bound_steps']:.0f}% |")
    lines.append(f"\nTPU: {TPU_NOTE}")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Bars of ms per step per row, one per decoder, and the bandwidth floor as a line."""
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if "decoders" in r]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(rows) + 2), 4.5))
    w = 0.27
    for i, d in enumerate(DECODERS):
        ms = [r["decoders"][d].get("ms_per_step", np.nan) for r in rows]
        ax.bar(x + (i - 1) * w, ms, w, label=d)
    ax.axhline(result["floor_ms_per_step"], color="red", ls="--", label="bandwidth floor")
    ax.set_xticks(x, [r["row"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms per step (forward of the batch)")
    ax.set_title(f"{result['model']} {result['dtype']} on {result['device']}, G={result['gen_length']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
