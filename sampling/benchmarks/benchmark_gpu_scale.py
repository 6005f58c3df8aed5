"""Every compiled decoding loop at the published models' real shapes on one GPU, beside the PyTorch
code people run today on the same card and the same weights (JSON + PNG).

    python -m sampling.benchmarks.benchmark_gpu_scale --fast-dllm ../Fast-dLLM            # one GPU (an H200 holds all four)
    python -m sampling.benchmarks.benchmark_gpu_scale --size tiny --fast-dllm ../Fast-dLLM  # CPU: tiny presets, fp32
    python -m sampling.benchmarks.benchmark_gpu_scale --models llada-8b qwen2.5-7b --budget-s 300
    python -m sampling.benchmarks.benchmark_gpu_scale --preflight --fast-dllm ../Fast-dLLM   # any machine, no weights

(run from the repository root with it on PYTHONPATH; `--fast-dllm`: a checkout of
https://github.com/NVlabs/Fast-dLLM, read at run time and never stored here (`.fast-dllm/` in the
repository root is ignored by git for it); without it the Fast-dLLM rows are recorded as skipped.)

Models (`MODELS`, in this order: those with a PyTorch counterpart first), random weights (normal,
std 0.02; norms 1) made on the device in bf16 (`benchmark_gpu_sampler.random_model`), no downloads:

* `llada-8b`: jaxdllm `llada` (one token per step), `fast-dllm-dual`, `dparallel`, `freedave`;
  PyTorch: the published Fast-dLLM `generate` (one token per step) and `generate_with_dual_cache`
  (threshold 0.9), `pytorch_counterparts.fast_dllm`.
* `diffusiongemma-26b-a4b`: jaxdllm `diffusiongemma` and transformers'
  `DiffusionGemmaForBlockDiffusion.generate`, both taking the argmax with shared canvas draws (the
  same work on both sides; `diffusiongemma_speed.py`), `--dg-steps` denoising steps per canvas.
* `qwen2.5-7b`: jaxdllm `ar` (Jacobi with a window of 1: one token per forward), `jacobi`,
  `jacobi-forcing`, `lookahead`; PyTorch: transformers' greedy `generate`.
* `llada2-mini` (16B, 256 experts, 8 routed): jaxdllm `llada2`.

The two MoE models also run a `pallas-experts` row: the same loop with `moe_impl="pallas"` (the
routed experts through the grouped matmul kernel of `jaxdllm.models.grouped_matmul` instead of
XLA's `ragged_dot`), side by side with the default.

The PyTorch models get jaxdllm's weights in memory through DLPack (`torch_handover`): the same
numbers on the same device, no file. Causal rows make exactly `--gen-length` tokens (no stop
id). Random weights are not confident: the threshold and entropy rules commit about one token per
step, and draft-and-verify accepts about one token per forward; the columns give NFE and tokens per
forward so tokens/s stays honest; read `ms_per_step` as the cost of a step.

Each row runs at batch 1 and 8 (`--batches`) on the same random prompts of `--prompt-len` tokens:

* `first_call_s` (compile and one run) and `compile_s` (that less a timed call's median;
  jaxdllm only: PyTorch eager compiles nothing), then `median_s` of `--reps` timed calls (one
  for a PyTorch call over `SLOW_CALL_S`, e.g. a published loop decoding 8 prompts in turn);
* `steps` (forwards of the batch: jaxdllm's loop steps; Fast-dLLM's `nfe`, summed over prompts
  where the published loop takes one at a time; transformers' greedy: `gen_length`), `nfe` (per
  row), `tokens_per_forward`, `tokens_per_s` (batch x gen_length / median);
* `ms_per_step` against `floor_ms`: the bytes of weights a step reads over the measured bandwidth
  (a `y = x + 1` copy of 4 GiB): every matmul weight once (the input embedding of an untied model
  is a lookup: not counted), routed experts at the share a step's tokens touch under uniform
  routing (`1 - (1 - k/E)^tokens`; all of them for a canvas of 256); `x_floor` the ratio;
* `peak_gb`: jaxdllm, XLA's `memory_analysis()` of the compiled loop (arguments, weights included,
  + temporaries + outputs); PyTorch, the weights (shared with JAX) + `torch.cuda.max_memory_allocated`
  during the row;
* PyTorch rows: `tokens_equal` / `token_agreement` with the jaxdllm row they stand beside (bf16 on
  a GPU may flip near-ties: recorded, not asserted); jaxdllm rows: `vs_pytorch`, their tokens/s over
  that PyTorch row's; `pallas-experts` rows: `tokens_equal` with the default row.

`--preflight` checks on any machine, in a minute or two and without weights, what a GPU run needs:
every jaxdllm row lowers for CUDA at the published shapes (and how many Triton kernels and host
callbacks its program holds), and every PyTorch model has a place for each checkpoint tensor.

`--budget-s` (default 450 s) bounds the whole run: rows that would start after it are recorded
as skipped, so one call of the script fits its slot; the JSON is written after every row. The
PNG: ms per step over the floor per row and batch (left), tokens/s of each jaxdllm row beside its
PyTorch counterpart (right).
"""

from __future__ import annotations

import os

# PyTorch shares the GPU in this process: JAX takes memory as it needs it, up to 90 % (a 26B model
# is held in two layouts at once).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")

import argparse
import dataclasses
import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from jaxdllm.extras import exit_if_missing

OUT = "sampling/results/gpu_scale"
SLOW_CALL_S = 10.0  # a PyTorch call this long is timed once (eager: its first call compiles nothing)


@dataclasses.dataclass(frozen=True)
class Row:
    """One decoder of a model: a jaxdllm sampler preset (`preset`, `overrides`) on the model run with
    `options` (`Transformer.with_options`), or a PyTorch decoder (`pytorch`: a key of
    `pytorch_builders`) standing beside the jaxdllm row `pairs`. `fed`: the tokens each row feeds a
    step, for the routed experts' floor (`canvas` or `block`)."""

    name: str
    preset: str | None = None
    overrides: tuple = ()
    options: tuple = ()
    pytorch: str | None = None
    pairs: str | None = None
    fed: str = "canvas"


@dataclasses.dataclass(frozen=True)
class Model:
    """A published shape (`preset`), its test-sized twin (`tiny`) and its rows."""

    preset: str
    tiny: str
    rows: tuple[Row, ...]


NO_STOP = (("stop_at_eos", False),)
MODELS = {
    "llada-8b": Model("llada-8b", "tiny-llada", (
        Row("llada", "llada", (("steps", "G"),)),
        Row("fast-dllm-dual", "fast-dllm-dual", fed="block"),
        Row("dparallel", "dparallel"),
        Row("freedave", "freedave", (("steps", "G"),)),
        Row("fast-dllm generate", pytorch="fast_dllm_generate", pairs="llada"),
        Row("fast-dllm dual cache", pytorch="fast_dllm_dual", pairs="fast-dllm-dual"))),
    "diffusiongemma-26b-a4b": Model("diffusiongemma-26b-a4b", "tiny-diffusiongemma", (
        Row("diffusiongemma", "diffusiongemma", (("sample", False), ("stop_ids", (1,)))),
        Row("diffusiongemma pallas-experts", "diffusiongemma", (("sample", False), ("stop_ids", (1,))),
            (("moe_impl", "pallas"),)),
        Row("transformers generate", pytorch="hf_diffusiongemma", pairs="diffusiongemma"))),
    "qwen2.5-7b": Model("qwen2.5-7b", "tiny-qwen2", (
        Row("ar", "jacobi", (("window", 1),) + NO_STOP),
        Row("jacobi", "jacobi", NO_STOP),
        Row("jacobi-forcing", "jacobi-forcing", NO_STOP),
        Row("lookahead", "lookahead", NO_STOP),
        Row("transformers greedy", pytorch="hf_greedy", pairs="ar"))),
    "llada2-mini": Model("llada2-mini", "tiny-llada2", (
        Row("llada2", "llada2", (("stop_at_eos", False),), fed="block"),
        Row("llada2 pallas-experts", "llada2", (("stop_at_eos", False),), (("moe_impl", "pallas"),), fed="block"))),
}


# ----------------------------------------------------------------------------- the floor

def step_weight_bytes(config, itemsize: int, tokens: int) -> int:
    """Bytes of weights one step reads when it feeds `tokens` tokens in all: every parameter but
    an untied input embedding (a lookup), routed experts at the expected share `tokens` tokens
    touch when each picks `k` of `E` uniformly."""
    lookup = 0 if config.tie_embeddings else config.vocab_size * config.embed_dim
    read = config.num_params - lookup
    e = config.experts
    if e is not None:
        unpicked = config.num_params - config.active_params  # the E - k experts a token leaves, every layer
        routed = unpicked * e.num_experts // (e.num_experts - e.experts_per_token)
        touched = 1.0 - (1.0 - e.experts_per_token / e.num_experts) ** tokens
        read -= (1.0 - touched) * routed
    return int(read * itemsize)


def fed_tokens(row: Row, cfg, batch: int, prompt_len: int) -> int:
    """Tokens a step of `row` feeds, all rows together (the floor of routed experts)."""
    per_row = cfg.block_length if row.fed == "block" else prompt_len + cfg.gen_length
    return batch * per_row


# ----------------------------------------------------------------------------- measuring

def sampler_config(row: Row, config, gen_length: int, dg_steps: int):
    """The row's `SamplerConfig` for a model of `config` at `gen_length` (`"G"` in an override
    stands for it; DiffusionGemma's block is the model's canvas)."""
    from jaxdllm.decoding import SamplerConfig

    overrides = {k: gen_length if v == "G" else v for k, v in row.overrides}
    if row.preset == "diffusiongemma":
        overrides.update(max_denoising_steps=dg_steps, block_length=config.block_size)
    return SamplerConfig.preset(row.preset, gen_length=gen_length, **overrides)


def jax_row(sampler, cfg, ids: np.ndarray, reps: int, seed: int) -> tuple[dict, np.ndarray]:
    """Time one jaxdllm row; its columns and the last call's tokens `[B, G]`."""
    import jax

    from sampling.benchmarks.timing import timed

    key = jax.random.key(seed)
    t = timed(lambda: sampler(ids, cfg, key=key), repeats=reps)
    res = t.out
    memory = sampler.lower(ids.shape, cfg).compile().memory_analysis()  # loaded from the persistent cache
    peak = (memory.argument_size_in_bytes + memory.temp_size_in_bytes + memory.output_size_in_bytes
            - memory.alias_size_in_bytes)
    nfe = np.asarray(res.nfe, np.float64)
    return dict(first_call_s=t.first_s, compile_s=t.first_s - t.median_s, median_s=t.median_s,
                samples_s=list(t.samples_s), steps=int(res.steps), nfe=float(nfe.mean()),
                peak_gb=peak / 1e9), np.asarray(res.generated)


def pytorch_row(decode, ids: np.ndarray, reps: int, device: str, weight_bytes: int) -> tuple[dict, np.ndarray]:
    """Time one PyTorch decoder; its columns and the last call's tokens `[B, G]`."""
    import torch

    from sampling.benchmarks.timing import timed

    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    sync = (lambda out: torch.cuda.synchronize()) if cuda else (lambda out: None)
    t = timed(lambda: decode(ids), repeats=1, sync=sync)
    if reps > 1 and t.median_s < SLOW_CALL_S:
        more = timed(lambda: decode(ids), warmup=0, repeats=reps - 1, sync=sync)
        t = dataclasses.replace(t, samples_s=t.samples_s + more.samples_s, out=more.out)
    tokens, forwards, nfe = t.out
    return dict(first_call_s=t.first_s, median_s=t.median_s, samples_s=list(t.samples_s), steps=int(forwards),
                nfe=float(nfe), peak_gb=(weight_bytes + torch.cuda.max_memory_allocated()) / 1e9 if cuda else None), \
        tokens


def pytorch_builders(args, gen_length: int) -> dict:
    """Key -> its `pytorch_counterparts.Counterpart`, or the reason it cannot run here (a str).
    The Fast-dLLM loops use the block of the presets they stand beside."""
    from jaxdllm.decoding import SamplerConfig
    from sampling.benchmarks import pytorch_counterparts as pc

    one_per_step, dual = SamplerConfig.preset("llada"), SamplerConfig.preset("fast-dllm-dual")
    assert one_per_step.block_length == dual.block_length

    builders: dict = {"hf_greedy": pc.hf_greedy(gen_length=gen_length),
                      "hf_diffusiongemma": pc.hf_diffusiongemma(gen_length=gen_length, steps=args.dg_steps,
                                                                key_seed=args.seed)}
    for key, loop, threshold in (("fast_dllm_generate", "generate", None),
                                 ("fast_dllm_dual", "generate_with_dual_cache", dual.policy.threshold)):
        builders[key] = "no Fast-dLLM checkout given (--fast-dllm)"
        if args.fast_dllm is not None:
            try:
                builders[key] = pc.fast_dllm(args.fast_dllm, loop, gen_length=gen_length,
                                             block_length=dual.block_length, threshold=threshold)
            except (OSError, ValueError, ImportError) as e:  # a wrong folder or another version of the code
                builders[key] = f"{type(e).__name__}: {e}"
    return builders


def free_device_memory() -> None:
    """Drop what the last model left: compiled programs, collected arrays, PyTorch's cached blocks."""
    import jax

    gc.collect()
    jax.clear_caches()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def run_model(name: str, args, result: dict, out: Path, deadline: float) -> None:
    """Every row of one model at every batch, appended to `result["rows"]` (JSON written after each)."""
    import jax

    from jaxdllm.decoding import Sampler
    from jaxdllm.models.config import ModelConfig
    from jaxdllm.models.families.diffusion_gemma import DiffusionGemmaConfig
    from jaxdllm.models.run_options import RunOptions
    from sampling.benchmarks.benchmark_gpu_sampler import random_model
    from sampling.benchmarks.report import write_report

    spec = MODELS[name]
    tiny = args.size == "tiny"
    config = ModelConfig.preset(spec.tiny if tiny else spec.preset)
    dtype = "float32" if tiny else "bfloat16"
    gen_length = config.block_size if isinstance(config, DiffusionGemmaConfig) else args.gen_length  # DiffusionGemma: one canvas
    if tiny and isinstance(config, DiffusionGemmaConfig):
        gen_length = 2 * config.block_size
    itemsize = 4 if tiny else 2
    device = "cuda" if jax.devices()[0].platform == "gpu" else "cpu"
    refusal = refuse(config, itemsize, any(r.pytorch for r in spec.rows))
    if refusal is None and time.perf_counter() > deadline:  # do not build weights no row will use
        refusal = f"time budget ({args.budget_s:.0f} s) spent before this model"
    model = sampler = None
    try:
        samplers: dict = {}
        if refusal is None:
            model = random_model(config, RunOptions(dtype, dtype))
            sampler = Sampler(model)

        def sampler_for(options: tuple):
            if not options:
                return sampler
            if options not in samplers:  # a view over the same weights
                samplers[options] = Sampler(model.with_options(**dict(options)))
            return samplers[options]

        weight_bytes = config.num_params * itemsize
        rng = np.random.default_rng(args.seed)
        prompts = rng.integers(0, min(config.mask_token_id or config.vocab_size, config.vocab_size) - 8,
                               (max(args.batches), args.prompt_len)).astype(np.int32)
        builders = pytorch_builders(args, gen_length)
        tokens_of: dict = {}
        decoders: dict = {}
        for row in spec.rows:
            for batch in args.batches:
                record = dict(model=name, shape=spec.tiny if tiny else spec.preset, row=row.name,
                              side="pytorch" if row.pytorch else "jaxdllm", batch=batch, gen_length=gen_length,
                              prompt_len=args.prompt_len)
                ids = prompts[:batch]
                try:
                    if refusal is not None:
                        record["skipped"] = refusal
                    elif time.perf_counter() > deadline:
                        record["skipped"] = f"time budget ({args.budget_s:.0f} s) spent before this row"
                    elif row.pytorch is None:
                        cfg = sampler_config(row, config, gen_length, args.dg_steps)
                        record.update(preset=row.preset, options=dict(row.options))
                        cols, tokens = jax_row(sampler_for(row.options), cfg, ids, args.reps, args.seed)
                        tokens_of[(row.name, batch)] = tokens
                        base = next((r.name for r in spec.rows if r.preset == row.preset and not r.options), None)
                        if row.options and (base, batch) in tokens_of:  # the same loop, another implementation
                            same = tokens_of[(base, batch)] == tokens
                            record.update(tokens_equal=bool(same.all()), token_agreement=float(same.mean()),
                                          pairs=base)
                        record.update(cols)
                        step_bytes = step_weight_bytes(config, itemsize, fed_tokens(row, cfg, batch, args.prompt_len))
                        record.update(_rates(cols, batch, gen_length, step_bytes, result["bandwidth_GBps"]))
                    elif isinstance(builders[row.pytorch], str):
                        record["skipped"] = builders[row.pytorch]
                    else:
                        if row.pytorch not in decoders:
                            decoders[row.pytorch] = builders[row.pytorch](model, device)
                        cols, tokens = pytorch_row(decoders[row.pytorch], ids, args.reps, device, weight_bytes)
                        record.update(cols)
                        paired = next(r for r in spec.rows if r.name == row.pairs)
                        cfg = sampler_config(paired, config, gen_length, args.dg_steps)
                        step_bytes = step_weight_bytes(config, itemsize, fed_tokens(paired, cfg, batch, args.prompt_len))
                        record.update(_rates(cols, batch, gen_length, step_bytes, result["bandwidth_GBps"]))
                        record["pairs"] = row.pairs
                        theirs = tokens_of.get((row.pairs, batch))
                        if theirs is not None:
                            same = theirs == tokens
                            record.update(tokens_equal=bool(same.all()), token_agreement=float(same.mean()))
                            _pair(result["rows"], name, row.pairs, batch, record["tokens_per_s"])
                except Exception as e:  # record and go on: one failing row must not lose the others
                    record["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                print(_line(record), flush=True)
                result["rows"].append(record)
                write_report(out, result, quiet=True)
    finally:
        del model, sampler
        if "samplers" in locals():
            samplers.clear()
        if "decoders" in locals():
            decoders.clear()
        free_device_memory()


def refuse(config, itemsize: int, with_pytorch: bool) -> str | None:
    """Why a model cannot be measured on this device (None: it can): its weights in both layouts
    (jaxdllm's and the PyTorch model's) plus a fifth for working memory must fit."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    need = config.num_params * itemsize * ((2 if with_pytorch else 1) + 0.2)
    if limit is not None and need > limit:
        return f"needs ~{need / 1e9:.0f} GB (weights in both layouts + working memory), the device has {limit / 1e9:.0f} GB"
    return None


def _rates(cols: dict, batch: int, gen_length: int, step_bytes: int, bandwidth_gbps: float) -> dict:
    floor_ms = step_bytes / (bandwidth_gbps * 1e9) * 1e3
    ms = cols["median_s"] / cols["steps"] * 1e3 if cols["steps"] else None
    return dict(tokens_per_s=batch * gen_length / cols["median_s"], ms_per_step=ms, floor_ms=floor_ms,
                x_floor=ms / floor_ms if ms else None, step_weight_gb=step_bytes / 1e9,
                tokens_per_forward=gen_length / cols["nfe"] if cols["nfe"] else None)


def _pair(rows: list, model: str, jax_row_name: str, batch: int, pytorch_tokens_per_s: float) -> None:
    for r in rows:
        if r["model"] == model and r["row"] == jax_row_name and r["batch"] == batch and "tokens_per_s" in r:
            r["vs_pytorch"] = r["tokens_per_s"] / pytorch_tokens_per_s


def _line(r: dict) -> str:
    head = f"{r['model']:>22} {r['row']:>22} b{r['batch']}"
    if "skipped" in r or "error" in r:
        return f"{head}  {'skipped: ' + r['skipped'] if 'skipped' in r else 'error: ' + r['error']}"
    return (f"{head}  {r['tokens_per_s']:9.1f} tok/s  {r['ms_per_step']:8.2f} ms/step  x{r['x_floor']:.2f} floor  "
            f"first call {r['first_call_s']:6.1f} s  nfe {r['nfe']:.0f}  peak {r['peak_gb'] or 0:.1f} GB")


def preflight(args, out: Path) -> dict:
    """On any machine, without weights: every jaxdllm row at the published shapes lowered for CUDA
    (`Sampler.export`: seconds to lower, Triton kernels, host callbacks, while loops), and every
    PyTorch model checked against the checkpoint tensors it would be handed
    (`Counterpart.name_mismatches`). What a GPU run would fail on, found before it starts."""
    from jaxdllm.decoding import Sampler
    from jaxdllm.lowering import abstract_model, program_facts
    from jaxdllm.models.config import ModelConfig
    from jaxdllm.models.families.diffusion_gemma import DiffusionGemmaConfig
    from jaxdllm.models.run_options import RunOptions
    from sampling.benchmarks.report import write_report

    result = dict(preflight=True, rows=[])
    for name in args.models:
        spec = MODELS[name]
        config = ModelConfig.preset(spec.preset)
        gen_length = config.block_size if isinstance(config, DiffusionGemmaConfig) else args.gen_length
        builders = pytorch_builders(args, gen_length)
        for row in spec.rows:
            sampler = Sampler(abstract_model(config, options=RunOptions("bfloat16", "bfloat16", **dict(row.options))))
            record = dict(model=name, row=row.name, side="pytorch" if row.pytorch else "jaxdllm")
            try:
                if row.pytorch is None:
                    batch = max(args.batches)
                    cfg = sampler_config(row, config, gen_length, args.dg_steps)
                    t0 = time.perf_counter()
                    facts = program_facts(sampler.export((batch, args.prompt_len), cfg, platform="cuda"))
                    record.update(batch=batch, lower_s=time.perf_counter() - t0, **facts)
                elif isinstance(builders[row.pytorch], str):
                    record["skipped"] = builders[row.pytorch]
                else:
                    record["name_mismatches"] = builders[row.pytorch].name_mismatches(config)
            except Exception as e:  # record and go on
                record["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            print(record, flush=True)
            result["rows"].append(record)
            write_report(out, result, quiet=True)
        del sampler
        free_device_memory()
    return result


def main(argv=None) -> int:
    exit_if_missing(("matplotlib", "torch", "transformers"), "bench", "python -m sampling.benchmarks.benchmark_gpu_scale")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["real", "tiny"], default="real")
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--gen-length", type=int, default=128)
    p.add_argument("--dg-steps", type=int, default=16, help="DiffusionGemma's denoising steps per canvas")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=450.0)
    p.add_argument("--fast-dllm", default=None, help="a Fast-dLLM checkout (its llada/ folder is read)")
    p.add_argument("--out", default=None, help=f"output stem (default {OUT}_<device>)")
    p.add_argument("--preflight", action="store_true",
                   help="lower every row for CUDA and check the PyTorch models' names, without weights (any machine)")
    args = p.parse_args(argv)
    start = time.perf_counter()

    import jax

    from jaxdllm.compilation_cache import enable_compilation_cache
    from sampling.benchmarks.pytorch_counterparts import source_digests
    from sampling.benchmarks.benchmark_gpu_sampler import measured_bandwidth
    from sampling.benchmarks.report import kind_slug, torch_facts, write_report

    if args.preflight:
        result = preflight(args, Path(args.out or f"{OUT}_preflight"))
        failed = [r for r in result["rows"] if r.get("error") or r.get("name_mismatches") or r.get("host_callbacks")]
        print(f"preflight: {len(result['rows'])} rows, {len(failed)} with a problem")
        return 1 if failed else 0
    if args.size == "real" and jax.devices()[0].platform != "gpu":
        print("the real shapes need a GPU; on a CPU run --size tiny", file=sys.stderr)
        return 2
    if args.size == "tiny":
        args.prompt_len, args.gen_length = min(args.prompt_len, 16), min(args.gen_length, 32)
    # The persistent cache lets each row's memory analysis load the program its first call compiled
    # (JAX writes programs that took 1 s or more: every real-shape loop). A folder set before wins.
    enable_compilation_cache(tempfile.mkdtemp(prefix="gpu_scale_xla_"))
    out = Path(args.out or f"{OUT}_{kind_slug(jax.devices()[0].device_kind)}")
    bandwidth = measured_bandwidth(0.25 if args.size == "tiny" else 4.0)
    result = dict(size=args.size, bandwidth_GBps=bandwidth / 1e9, budget_s=args.budget_s, reps=args.reps,
                  dg_steps=args.dg_steps,
                  fast_dllm_sha256=None if args.fast_dllm is None else source_digests(args.fast_dllm),
                  **torch_facts(), rows=[])
    print(f"{jax.devices()[0].device_kind}: bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    deadline = start + args.budget_s
    for name in args.models:
        run_model(name, args, result, out, deadline)
    result["wall_s"] = time.perf_counter() - start
    data = write_report(out, result, _plot)
    print(markdown(data))
    return 0


def markdown(result: dict) -> str:
    """The rows as a markdown table (the README's)."""
    lines = ["| model | row | batch | tokens/s | ms/step | floor ms | x floor | first call s | NFE | peak GB | vs PyTorch |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "tokens_per_s" not in r:
            why = r.get("skipped") or r.get("error", "")
            lines.append(f"| {r['model']} | {r['row']} | {r['batch']} | {why[:70]} |  |  |  |  |  |  |  |")
            continue
        vs = f"{r['vs_pytorch']:.2f}x" if r.get("vs_pytorch") else ""
        peak = f"{r['peak_gb']:.1f}" if r.get("peak_gb") is not None else ""
        lines.append(f"| {r['model']} | {r['row']} | {r['batch']} | {r['tokens_per_s']:.1f} | {r['ms_per_step']:.2f} | "
                     f"{r['floor_ms']:.2f} | {r['x_floor']:.2f} | {r['first_call_s']:.1f} | {r['nfe']:.0f} | {peak} | {vs} |")
    return "\n".join(lines)


def _plot(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if "x_floor" in r and r["x_floor"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 2 + 0.22 * len(rows)))
    labels = [f"{r['model'].split('-')[0]} {r['row']} b{r['batch']}" for r in rows]
    left.barh(labels, [r["x_floor"] for r in rows], color=["C1" if r["side"] == "pytorch" else "C0" for r in rows])
    left.axvline(1.0, color="k", lw=1)
    left.axvline(1.3, color="red", ls="--", lw=1, label="goal 1.3x")
    left.set_xscale("log")
    left.set_xlabel("ms per step / bandwidth floor (blue jaxdllm, orange PyTorch)")
    left.invert_yaxis()
    left.legend()
    pairs = [r for r in rows if r["side"] == "pytorch" and r.get("pairs")]
    names, ours, theirs = [], [], []
    for r in pairs:
        jax_row = next((j for j in rows if j["model"] == r["model"] and j["row"] == r["pairs"]
                        and j["batch"] == r["batch"]), None)
        if jax_row is not None:
            names.append(f"{r['model'].split('-')[0]} {r['pairs']} b{r['batch']}")
            ours.append(jax_row["tokens_per_s"])
            theirs.append(r["tokens_per_s"])
    x = np.arange(len(names))
    right.bar(x - 0.2, ours, 0.4, label="jaxdllm")
    right.bar(x + 0.2, theirs, 0.4, label="PyTorch")
    right.set_xticks(x, names, rotation=30, ha="right")
    right.set_ylabel("tokens/s")
    right.set_yscale("log")
    right.legend()
    shapes = "the published shapes" if result["size"] == "real" else "tiny shapes, float32"
    fig.suptitle(f"Decoding loops at {shapes} on {result['device']}, random weights")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
