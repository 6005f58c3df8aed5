"""DiffusionGemma generation speed: jaxdllm (the uniform-noise canvas on one compiled `while_loop`,
policy `diffusiongemma`) against transformers' `DiffusionGemmaForBlockDiffusion.generate` (PyTorch
eager), side by side in one process on the same random weights (writes JSON + PNG).

    python -m sampling.benchmarks.diffusiongemma_speed                          # CPU: every size, batch 1 and 4
    python -m sampling.benchmarks.diffusiongemma_speed --sizes tiny --batch 1 --repeats 1    # a quick check
    python -m sampling.benchmarks.diffusiongemma_speed --real-shape --batch 1 8  # one GPU: the published 26B-A4B, bf16

(run from the repository root with it on PYTHONPATH.)

Weights: for each size, transformers builds `DiffusionGemmaForBlockDiffusion` from a config (its own
random initialisation, seed `--seed`) and writes it with `save_pretrained` to a temporary folder;
jaxdllm reads that folder with `jaxdllm.from_pretrained`. The config is the jaxdllm `ModelConfig`
of the size written by the family's `config_to_hf` (the keys of a published config.json), so both
sides hold the same weights in the same dtype.

Sizes (`SHAPES`; the JSON's `shape` per size): `tiny` is the test preset `tiny-diffusiongemma`;
the others scale the published 26B-A4B shape down and keep its proportions: the layer pattern (a
full-attention layer every 6th layer and last), GQA (sliding layers heads / 2 K/V heads, full
layers heads / 8 K/V heads of twice the head dim, K = V), the dense MLP at 3/4 of the width,
experts of 1/4 of the width with 1/16 of them routed per token, tied embeddings and the logit
softcap; the vocabulary and the canvas are cut so that a CPU run takes minutes (`small` 45M
parameters, `medium` 235M, `large` 407M of which 124M active per token; on 2 CPU cores the run of
every size takes ~5 minutes, `large` ~2). `--real-shape` is
the published shape itself (`ModelConfig.preset("diffusiongemma-26b-a4b")`: 25.25B parameters,
vocabulary 262,144, canvas 256) in bf16: it needs one GPU holding both copies (~101 GB: an H200)
and ~51 GB of free disk for the checkpoint; elsewhere the script refuses.

Generation: the same prompts on both sides (`--prompt-len` random ids, equal lengths, so no
padding; the batch-1 prompt is the first row of the larger batches), `--canvases` canvases of the
size's canvas length, the published sampler settings (`SETTINGS`: entropy bound 0.1, temperatures
0.4 to 0.8, stability 1, confidence 0.005), `--steps` denoising steps per canvas at most (published:
48), stop id 1 (EOS), pad 0, float32 on CPU. transformers gets `max_new_tokens`, `max_denoising_steps`,
`sampler_config=EntropyBoundSamplerConfig(entropy_bound=...)`, `t_min`, `t_max`,
`stability_threshold`, `confidence_threshold`, `eos_token_id`, `pad_token_id`.

Two modes of drawing (`draws` in the JSON):
* default, `argmax, shared draws`: jaxdllm with `sample=False` (the argmax of the tempered logits
  in place of a sample); transformers the same (`torch.multinomial` answered by the argmax) and fed
  the uniform canvas draws jaxdllm uses (`jaxdllm.decoding.uniform_canvas.canvas_draws`, looked up
  from a table made before the clock starts). Both sides then do the same work: equal tokens and
  equal forwards are recorded per row (`tokens_equal`, `rows_equal_fraction`, `token_agreement`: the
  fraction of equal generated tokens; `nfe_equal`), not asserted. The logits agree to ~1e-4 in
  float32, but random weights make every position's entropy nearly the same (10.23 to 10.24 nats at
  `small`, the lowest two ~1e-4 apart), so a last-digit difference can accept another position or
  flip a near-tied argmax, and a few tokens of the larger sizes differ while the forwards stay equal.
* `--sample`: each side samples as published with its own random numbers (jaxdllm's key,
  torch's generator); tokens and forwards may differ between the sides.

Random weights are not confident: the stop test (a stable argmax canvas and mean entropy under
0.005) is rarely met, so most canvases run all `--steps` steps and the entropy bound accepts about
one token a step. NFE is therefore near `--steps` per canvas, whatever the size: read the numbers
as time per forward and per generation, not as the tokens per forward of a trained model.

Per (size, batch) and side (`rows[*].sides.jaxdllm` / `.transformers`):
* `first_call_s`: the first call in this process with these shapes (jaxdllm: compile + one run;
  transformers: its first call; its kernels may be warm from an earlier row of the same size);
* `median_s`, `min_s`, `samples_s`: `--repeats` later calls (`timing.timed`);
* `tokens_per_s`: generated non-pad tokens of the batch / `median_s`; `generated_tokens`;
* `nfe` (mean denoiser forwards per row; `nfe_rows` each), `tokens_per_forward` (non-pad tokens /
  row forwards), `forwards` (forwards of the whole batch), `ms_per_forward` (`median_s` / `forwards`;
  the encoder's passes, one per canvas, are inside the time but not counted, as published).

On CPU, jaxdllm's routed experts (`jaxdllm.models.moe.grouped_swiglu`, `moe_impl="auto"`) run each
expert on its own rows only (`tiles`: the (token, expert) pairs sorted by expert, padded per expert
to whole row tiles, a loop over the tiles; XLA's CPU `ragged_dot` is a slow emulation: at
`medium`'s expert shapes ~49 ms per layer against ~0.8 ms for a dense matmul of the same rows).
`tiny`'s experts are small enough that they still run every expert on every token (`dense`, as
cheap there). Before `tiles`, every size ran `dense`: `num_experts / experts_per_token` times the
expert FLOPs (16x at `medium` and `large`), and jaxdllm trailed transformers' `grouped_mm` at those
sizes (0.95x and 0.73x). On TPU and GPU the experts run as `ragged_dot`.

Each row also records `load_average` (the host's 1, 5 and 15 minute load after it): the timings
assume nothing else runs.

The PNG: tokens/s per size and batch, a bar per side (left), and the first-call seconds (right).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave GPU memory for torch

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from jaxdllm.extras import exit_if_missing
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families.diffusion_gemma import config_to_hf, published_layer_types

SIDES = ("jaxdllm", "transformers")
# The published sampler settings (transformers' defaults and the checkpoint's generation config).
SETTINGS = dict(entropy_bound=0.1, t_min=0.4, t_max=0.8, stability_threshold=1, confidence_threshold=0.005)
STOP_IDS = (1,)
PAD_ID = 0
REAL = "diffusiongemma-26b-a4b"
# Scaled-down shapes: layers, width, query heads, head dim, experts, routed per token, vocabulary,
# canvas, sliding window (see `scaled_shape`).
SHAPES = {
    "tiny": None,  # the test preset `tiny-diffusiongemma`
    "small": dict(layers=6, width=512, heads=8, head_dim=64, experts=16, top_k=1, vocab=32768, canvas=32, window=128),
    "medium": dict(layers=12, width=768, heads=8, head_dim=96, experts=32, top_k=2, vocab=32768, canvas=32,
                   window=256),
    "large": dict(layers=12, width=1024, heads=8, head_dim=128, experts=32, top_k=2, vocab=32768, canvas=32,
                  window=256),
}
COLUMNS = ("first_call_s", "median_s", "min_s", "samples_s", "tokens_per_s", "generated_tokens", "nfe", "nfe_rows",
           "tokens_per_forward", "forwards", "ms_per_forward")


# ----------------------------------------------------------------------------- shapes

def scaled_shape(layers: int, width: int, heads: int, head_dim: int, experts: int, top_k: int, vocab: int,
                 canvas: int, window: int) -> ModelConfig:
    """The published 26B-A4B config at another size, in its proportions: a full layer every 6th
    and last (`published_layer_types`); sliding layers `heads / 2` K/V heads of `head_dim`, full
    layers `heads / 8` (at least 1) of `2 head_dim`; the dense MLP `3/4 width`; `experts` of
    `width / 4`, `top_k` routed; every other setting (RoPE, norms, softcap, ids) as published."""
    base = ModelConfig.preset(REAL)
    return base.replace(
        vocab_size=vocab, embed_dim=width, num_layers=layers, num_heads=heads, num_kv_heads=heads // 2,
        head_dim=head_dim, mlp_dim=3 * width // 4, block_size=canvas, max_position=4096,
        eot_token_id=base.eot_token_id if vocab > base.eot_token_id else None,
        gemma4=dict(layer_types=published_layer_types(layers), sliding_window=window, full_head_dim=2 * head_dim,
                    full_kv_heads=max(1, heads // 8)),
        experts=dict(num_experts=experts, experts_per_token=top_k, expert_dim=width // 4))


def size_config(size: str) -> ModelConfig:
    """The jaxdllm config of a size: `tiny`, a `SHAPES` entry, or `real` (the published shape)."""
    if size == "real":
        return ModelConfig.preset(REAL)
    if size == "tiny":
        return ModelConfig.preset("tiny-diffusiongemma")
    return scaled_shape(**SHAPES[size])


def describe(c: ModelConfig) -> dict:
    """A config's shape, as written to the JSON."""
    g, e = c.gemma4, c.experts
    return dict(layers=c.num_layers, layer_types="".join("F" if t == "full" else "s" for t in g.layer_types),
                width=c.embed_dim, heads=c.num_heads, sliding_kv_heads=c.num_kv_heads, sliding_head_dim=c.head_dim,
                full_kv_heads=g.full_kv_heads, full_head_dim=g.full_head_dim, sliding_window=g.sliding_window,
                mlp=c.mlp_dim, experts=e.num_experts, experts_per_token=e.experts_per_token, expert_dim=e.expert_dim,
                vocab=c.vocab_size, canvas=c.block_size, params=c.num_params, active_params=c.active_params)


def hf_config_dict(c: ModelConfig) -> dict:
    """transformers' config of `c`, as a published config.json holds it (`config_to_hf`)."""
    out: dict = {}
    config_to_hf(c, out)
    return out


def make_model(c: ModelConfig, dtype: str, device: str, seed: int):
    """transformers' `DiffusionGemmaForBlockDiffusion` of `c` from its own random initialisation
    (seed `seed`), made in `dtype` on `device` (eval mode)."""
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    hf_config = DiffusionGemmaConfig.from_dict(hf_config_dict(c))
    torch.manual_seed(seed)
    before = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # made in dtype: the real shape does not fit twice in float32
    try:
        with torch.device(device):
            return DiffusionGemmaForBlockDiffusion(hf_config).eval()
    finally:
        torch.set_default_dtype(before)


def build_checkpoint(c: ModelConfig, path: Path, dtype: str, device: str, seed: int):
    """`make_model`, written to `path` with `save_pretrained`; returns the model."""
    model = make_model(c, dtype, device, seed)
    model.save_pretrained(path)
    return model


# ----------------------------------------------------------------------------- transformers' side

def draw_table(key, batch: int, canvases: int, steps: int, canvas: int, vocab: int) -> np.ndarray:
    """`[canvases, steps + 1, batch, canvas]` the uniform draws jaxdllm makes (`canvas_draws`):
    each canvas's start (step 0) and the renoise after each step."""
    import jax.numpy as jnp

    from jaxdllm.decoding.uniform_canvas import canvas_draws

    rows = jnp.arange(batch)
    return np.stack([np.stack([np.asarray(canvas_draws(key, rows, k, s, canvas, vocab)) for s in range(steps + 1)])
                     for k in range(canvases)])


@contextlib.contextmanager
def shared_draws(table, device: str = "cpu"):
    """transformers' `generate` with the canvas draws taken from `table` (`draw_table`) and its
    `torch.multinomial` answered by the argmax, for one call; counts the batch's denoiser forwards
    in the yielded dict (`forwards`)."""
    import torch
    from transformers.models.diffusion_gemma import generation_diffusion_gemma as gen

    draws = torch.as_tensor(table, dtype=torch.long, device=device)
    state = {"canvas": -1, "step": 0, "forwards": 0}
    mixin = gen.DiffusionGemmaGenerationMixin
    prepare, step = mixin._prepare_denoiser_inputs, mixin._denoising_step

    def prepare_next_canvas(self, *args, **kwargs):
        state["canvas"] += 1
        state["step"] = 0
        return prepare(self, *args, **kwargs)

    def counted_step(self, *args, **kwargs):
        state["forwards"] += 1
        return step(self, *args, **kwargs)

    def initialize_canvas(self, batch_size, device):
        out = draws[state["canvas"], state["step"], :batch_size]
        state["step"] += 1
        return out

    def argmax(probs, num_samples):
        return probs.argmax(-1, keepdim=True)

    patches = [(mixin, "_prepare_denoiser_inputs", prepare_next_canvas), (mixin, "_denoising_step", counted_step),
               (gen.EntropyBoundSampler, "initialize_canvas", initialize_canvas), (torch, "multinomial", argmax)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, fn in patches:
            setattr(owner, name, fn)
        yield state
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


@contextlib.contextmanager
def counted_forwards():
    """transformers' `generate` untouched but for a count of the batch's denoiser forwards."""
    from transformers.models.diffusion_gemma import generation_diffusion_gemma as gen

    state = {"forwards": 0}
    mixin = gen.DiffusionGemmaGenerationMixin
    step = mixin._denoising_step

    def counted_step(self, *args, **kwargs):
        state["forwards"] += 1
        return step(self, *args, **kwargs)

    mixin._denoising_step = counted_step
    try:
        yield state
    finally:
        mixin._denoising_step = step


def hf_result(sequences, tokens_per_forward, prompt_len: int, gen_length: int, forwards: int) -> dict:
    """transformers' output as `[B, G]` tokens (its output stops once every row ended: padded
    here), per-row NFE (non-pad tokens / tokens per forward; None for a row with no token) and
    the batch's forwards."""
    tokens = np.asarray(sequences)[:, prompt_len:]
    tokens = np.pad(tokens, ((0, 0), (0, gen_length - tokens.shape[1])), constant_values=PAD_ID)
    valid = (tokens != PAD_ID).sum(-1)
    tpf = np.asarray(tokens_per_forward, dtype=np.float64)
    nfe = [int(round(v / t)) if t > 0 else None for v, t in zip(valid, tpf)]
    return dict(tokens=tokens, nfe=nfe, forwards=forwards)


# ----------------------------------------------------------------------------- measuring

def side_columns(timing, tokens: np.ndarray, nfe, forwards: int) -> dict:
    """One side's columns (module docstring) from its `timed` result and the last call's
    tokens `[B, G]`, per-row NFE and batch forwards."""
    generated = int((tokens != PAD_ID).sum())
    known = [n for n in nfe if n is not None]
    return dict(first_call_s=timing.first_s, median_s=timing.median_s, min_s=timing.min_s,
                samples_s=list(timing.samples_s), tokens_per_s=generated / timing.median_s,
                generated_tokens=generated, nfe=float(np.mean(known)) if known else None,
                nfe_rows=[None if n is None else int(n) for n in nfe],
                tokens_per_forward=generated / sum(known) if known and sum(known) else None,
                forwards=int(forwards), ms_per_forward=timing.median_s / forwards * 1e3 if forwards else None)


def run_row(size: str, batch: int, ctx: dict, args) -> dict:
    """Both sides on one (size, batch): see the module docstring."""
    import jax
    import torch

    from jaxdllm.decoding import SamplerConfig
    from sampling.benchmarks.timing import timed
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    c, g = ctx["config"], ctx["gen_length"]
    ids = ctx["prompts"][:batch]
    key = jax.random.key(args.seed)
    config = SamplerConfig.preset("diffusiongemma", gen_length=g, block_length=c.block_size,
                                  max_denoising_steps=args.steps, sample=args.sample, stop_ids=STOP_IDS,
                                  prompt_bucket=args.prompt_len, **SETTINGS)
    sampler = ctx["sampler"]
    jax_t = timed(lambda: sampler(ids, config, key=key), repeats=args.repeats)
    res = jax_t.out
    jax_cols = side_columns(jax_t, res.generated, res.nfe.tolist(), res.steps)

    model, device = ctx["torch_model"], ctx["torch_device"]
    table = None if args.sample else draw_table(key, batch, args.canvases, args.steps, c.block_size, c.vocab_size)
    prompt = torch.as_tensor(ids, dtype=torch.long, device=device)
    hf_kwargs = dict(max_new_tokens=g, max_denoising_steps=args.steps,
                     sampler_config=EntropyBoundSamplerConfig(entropy_bound=SETTINGS["entropy_bound"]),
                     t_min=SETTINGS["t_min"], t_max=SETTINGS["t_max"],
                     stability_threshold=SETTINGS["stability_threshold"],
                     confidence_threshold=SETTINGS["confidence_threshold"], eos_token_id=list(STOP_IDS),
                     pad_token_id=PAD_ID)

    def hf_generate():
        with (counted_forwards() if table is None else shared_draws(table, device)) as state, torch.no_grad():
            out = model.generate(prompt, **hf_kwargs)
        return out, state["forwards"]

    sync = (lambda out: torch.cuda.synchronize()) if device == "cuda" else (lambda out: None)
    torch.manual_seed(args.seed)
    hf_t = timed(hf_generate, repeats=args.repeats, sync=sync)
    out, forwards = hf_t.out
    hf = hf_result(out.sequences.cpu().numpy(), out.tokens_per_forward.float().cpu().numpy(), ids.shape[1], g,
                   forwards)
    hf_cols = side_columns(hf_t, hf["tokens"], hf["nfe"], forwards)

    same = res.generated == hf["tokens"]
    equal = same.all(-1)
    return dict(row=f"{size}-b{batch}", size=size, batch=batch, sides=dict(jaxdllm=jax_cols, transformers=hf_cols),
                tokens_equal=bool(equal.all()), rows_equal_fraction=float(equal.mean()),
                token_agreement=float(same.mean()), load_average=list(os.getloadavg()) if hasattr(os, "getloadavg")
                else None,
                nfe_equal=jax_cols["nfe_rows"] == hf_cols["nfe_rows"],
                jax_over_transformers_tokens_per_s=jax_cols["tokens_per_s"] / hf_cols["tokens_per_s"]
                if hf_cols["tokens_per_s"] else None)


def refuse_real_shape(platform: str, gpu_bytes: int | None, free_disk: int, config: ModelConfig) -> str | None:
    """Why `--real-shape` cannot run here (None: it can): it needs a GPU (jax's backend `gpu` and
    torch's CUDA) with room for both bf16 copies plus a working margin, and the disk for the
    checkpoint."""
    weights = 2 * config.num_params  # bf16
    if platform != "gpu" or gpu_bytes is None:
        return (f"--real-shape builds the published {REAL} shape ({config.num_params / 1e9:.1f}B parameters, "
                f"{weights / 1e9:.0f} GB in bf16 per side) and runs on one GPU; this machine's jax backend is "
                f"{platform!r}{'' if gpu_bytes else ' and torch sees no CUDA device'}. On CPU run the scaled sizes "
                f"(--sizes {' '.join(SHAPES)}).")
    need = 2 * weights * 1.1
    if gpu_bytes < need:
        return (f"--real-shape holds the weights twice on the GPU ({2 * weights / 1e9:.0f} GB in bf16, "
                f"~{need / 1e9:.0f} GB with activations); this GPU has {gpu_bytes / 1e9:.0f} GB (an H200 has 141).")
    if free_disk < 1.05 * weights:
        return (f"--real-shape writes a {weights / 1e9:.0f} GB checkpoint; {free_disk / 1e9:.0f} GB free under "
                "--tmp-dir: point it at a larger disk.")
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    p.add_argument("--batch", nargs="+", type=int, default=[1, 4], help="batch sizes (default 1 4)")
    p.add_argument("--out", default=None, help="path stem of the JSON and PNG (default "
                   "sampling/results/diffusiongemma_speed_cpu; with --real-shape diffusiongemma_speed_<gpu>)")
    p.add_argument("--real-shape", action="store_true",
                   help=f"the published {REAL} shape in bf16 on one GPU (refused elsewhere); replaces --sizes")
    p.add_argument("--steps", type=int, default=None, help="max_denoising_steps (default 8; 48 with --real-shape)")
    p.add_argument("--canvases", type=int, default=2, help="canvases generated (gen length = canvases x canvas)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="timed calls after the first (their median is reported)")
    p.add_argument("--sample", action="store_true", help="sample as published, each side its own random numbers")
    p.add_argument("--torch-threads", type=int, default=None, help="torch intra-op threads (default: the CPUs "
                   "this process may run on)")
    p.add_argument("--hf-experts", default=None, help="transformers' experts_implementation (default: its own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tmp-dir", default=None, help="where the temporary checkpoints go")
    args = p.parse_args(argv)
    exit_if_missing(("torch", "transformers", "matplotlib"), "bench", "the DiffusionGemma speed benchmark")

    import jax
    import torch
    import transformers

    import jaxdllm
    from sampling.benchmarks.report import torch_facts, write_report

    platform = jax.default_backend()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(args.torch_threads or cpus)
    if args.real_shape:
        config = size_config("real")
        gpu = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
        tmp_root = args.tmp_dir or tempfile.gettempdir()
        why = refuse_real_shape(platform, gpu, shutil.disk_usage(tmp_root).free, config)
        if why:
            raise SystemExit(why)
        sizes, dtype = ["real"], "bfloat16"
    else:
        sizes, dtype = args.sizes, "float32"
    args.steps = args.steps or (48 if args.real_shape else 8)
    torch_device = "cuda" if platform == "gpu" and torch.cuda.is_available() else "cpu"
    from sampling.benchmarks.report import kind_slug

    out = Path(args.out or ("sampling/results/diffusiongemma_speed_" +
                            ("cpu" if platform == "cpu" else kind_slug(jax.devices()[0].device_kind))))
    rng = np.random.default_rng(args.seed)

    result = dict(
        **torch_facts(), transformers=transformers.__version__, torch_device=torch_device, dtype=dtype,
        draws="sampled, each side its own random numbers" if args.sample else
              "argmax, shared draws (jaxdllm sample=False; transformers' multinomial answered by the argmax and "
              "its canvas draws taken from jaxdllm's canvas_draws)",
        settings=dict(SETTINGS, max_denoising_steps=args.steps, canvases=args.canvases, prompt_len=args.prompt_len,
                      stop_ids=list(STOP_IDS), pad_id=PAD_ID, repeats=args.repeats, seed=args.seed),
        weights=("transformers' DiffusionGemmaForBlockDiffusion from its config (random initialisation, seed "
                 f"{args.seed}), save_pretrained to a temporary folder, read by jaxdllm.from_pretrained: the same "
                 f"weights on both sides, {dtype}"),
        note=("random weights are not confident: most canvases run every denoising step, so NFE is near "
              "max_denoising_steps per canvas (time per forward is the comparable figure); first_call_s is the "
              "first call with these shapes in this process (jaxdllm compiles; transformers may be warm from an "
              "earlier row of the same size)"),
        shapes={}, rows=[])
    print(f"{jax.devices()[0].device_kind} ({platform}), torch {torch.__version__} on {torch_device} with "
          f"{torch.get_num_threads()} threads, transformers {transformers.__version__}; {dtype}, steps {args.steps}, "
          f"{'sampled' if args.sample else 'argmax, shared draws'}", flush=True)

    for size in sizes:
        c = size_config(size)
        gen_length = args.canvases * c.block_size
        with tempfile.TemporaryDirectory(dir=args.tmp_dir) as tmp:
            torch_model = build_checkpoint(c, Path(tmp), dtype, torch_device, args.seed)
            if args.hf_experts:
                torch_model.set_experts_implementation(args.hf_experts)
            model = jaxdllm.from_pretrained(tmp, dtype=dtype)
        shape = describe(model.config)
        shape.update(gen_length=gen_length, hf_experts_implementation=torch_model.config._experts_implementation,
                     hf_attn_implementation=torch_model.config._attn_implementation)
        result["shapes"][size] = shape
        print(f"{size}: {json.dumps(shape)}", flush=True)
        prompts = rng.integers(3, c.vocab_size, (max(args.batch), args.prompt_len)).astype(np.int32)
        ctx = dict(config=model.config, gen_length=gen_length, prompts=prompts, sampler=jaxdllm.Sampler(model),
                   torch_model=torch_model, torch_device=torch_device)
        for batch in args.batch:
            try:
                row = run_row(size, batch, ctx, args)
            except Exception as e:  # record and go on
                row = dict(row=f"{size}-b{batch}", size=size, batch=batch, error=f"{type(e).__name__}: {str(e)[:400]}")
            result["rows"].append(row)
            result = write_report(out, result)
            print(json.dumps(row), flush=True)
        del ctx, model, torch_model
    result = write_report(out, result, plot, quiet=True)
    print(markdown(result))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


# ----------------------------------------------------------------------------- output

def markdown(result: dict) -> str:
    """The rows as a markdown table, a line per (size, batch, side)."""
    lines = [f"\n{result['device']} ({result['platform']}), {result['dtype']}, torch threads "
             f"{result['torch_threads']}, max_denoising_steps {result['settings']['max_denoising_steps']}, "
             f"{result['draws'].split(' (')[0]}\n",
             "| size | batch | side | tokens/s | median s | first call s | NFE/row | tokens/forward | ms/forward | "
             "jax/transformers | equal tokens |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['size']} | {r['batch']} | error: {r['error'][:120]} |")
            continue
        for side in SIDES:
            s = r["sides"][side]
            ratio = fmt(r["jax_over_transformers_tokens_per_s"], ".1f") if side == "jaxdllm" else ""
            equal = str(r["tokens_equal"]) if side == "jaxdllm" else ""
            lines.append(f"| {r['size']} | {r['batch']} | {side} | {fmt(s['tokens_per_s'], '.4g')} | "
                         f"{fmt(s['median_s'], '.3g')} | {fmt(s['first_call_s'], '.3g')} | {fmt(s['nfe'], '.1f')} | "
                         f"{fmt(s['tokens_per_forward'], '.2f')} | {fmt(s['ms_per_forward'], '.3g')} | {ratio} | "
                         f"{equal} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Tokens/s (left) and first-call seconds (right) per size and batch, a bar per side."""
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if "sides" in r]
    x = np.arange(len(rows))
    w = 0.38
    fig, axes = plt.subplots(1, 2, figsize=(max(9, 1.6 * len(rows) + 4), 4.5))
    for ax, column, label in ((axes[0], "tokens_per_s", "generated tokens / s (median call)"),
                              (axes[1], "first_call_s", "first call, s (jaxdllm: compile + run)")):
        for i, side in enumerate(SIDES):
            values = [r["sides"][side][column] or np.nan for r in rows]
            bars = ax.bar(x + (i - 0.5) * w, values, w, label=side)
            ax.bar_label(bars, fmt="%.3g", fontsize=7)
        ax.set_xticks(x, [f"{r['size']}\nb{r['batch']}" for r in rows], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    steps = result["settings"]["max_denoising_steps"]
    fig.suptitle(f"DiffusionGemma generation on {result['device']} ({result['dtype']}, {steps} steps per canvas, "
                 f"{result['draws'].split(' (')[0]}), random weights", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
