"""What running one job as several processes costs on one machine: training step time, and the
host memory each process needs to load a checkpoint (JSON + PNG).

    nice python -m sampling.benchmarks.benchmark_multihost          # ~2 min on 2 cores
    python -m sampling.benchmarks.benchmark_multihost --topologies 1x2 2x1 --load-topologies 1x2 2x1 \\
        --steps 8 --warmup 3 --ckpt-embed 256 --ckpt-mlp 512 --out /tmp/multihost   # the test's size

(run from the repository root.) Every command runs as users run it, in fresh interpreters with a
clean environment (no `JAXDLLM_*` variables, `JAX_PLATFORMS=cpu`, the compilation cache off, so
each topology compiles its own programs): a topology `PxD` is P processes of D CPU devices each
(`--xla_force_host_platform_device_count=D`); `1xD` is one plain process, `PxD` with P > 1 is
`jaxdllm launch -n P --devices-per-process D`.

1. Step time (`--topologies`, default 1x4 2x2 4x1: the same 4 devices): `jaxdllm train` of one
   recipe (tiny-llada, embed `--embed` 128, `--layers` 2 layers, 4 heads of 32, mlp 4x embed, the
   copy/reverse tasks, seq_len `--seq-len` 64, global batch `--batch` 16, data parallel over
   every device, `--steps` 60 steps, `[log] every = 1`, no checkpoint before the end). A step's
   time is the difference of consecutive `elapsed_s` in process 0's `metrics.jsonl`: process 0's
   wall time from one logged step to the next (next batch, host-to-device copy, the jitted step,
   fetching its metrics, which waits for the step, and in a multi-process job the per-step
   stop-flag collective). The first `--warmup` 5 differences are dropped (the first record
   includes compilation; the next ones settle). Reported: the median (and quartiles) in ms, and
   the ratio to the reference, the first single-process topology of the list. On one machine
   the processes' gradient all-reduce goes through gloo over localhost TCP instead of XLA's
   in-process all-reduce, and P processes of D devices share the machine's cores (on 2 cores, 4
   processes each running their own XLA thread pools are scheduled in turn): the ratio is both
   costs together, an upper bound for hosts that each have their own cores and a real network
   only where the network is as fast as localhost.

2. Host memory while loading (`--load-topologies`, default 1x1 1x4 2x2 4x1): a random-weight
   float32 checkpoint written once with `jaxdllm.save_pretrained` into a temporary folder
   (tiny-llada layout, embed `--ckpt-embed` 2048, `--ckpt-layers` 2 layers, mlp `--ckpt-mlp`
   4096, 16 heads of 128, vocab 101 with the character tokenizer: 337 MB (322 MiB) in one
   safetensors file, as `save_pretrained` writes anything under 5 GB), then `jaxdllm generate
   --model CKPT --prompt hello --no-chat --gen-length 8` on it: 1x1 on one device (no mesh),
   every other topology with `--mesh data=1,fsdp=P*D,tensor=1` (what a multi-process job takes
   by default). Each process runs the command line (`jaxdllm.cli.main`) under a wrapper
   (`--child-load`) that reads its own `/proc/self/status`:
   * `import_hwm`: VmHWM once jax and jaxdllm are imported (before the command starts);
   * `before_load_rss`: VmRSS when `from_pretrained` is called (after joining the job and
     starting the backend); then VmHWM is reset (`/proc/self/clear_refs` = 5) so
   * `load_hwm`: VmHWM when `from_pretrained` returns (its arrays ready), the peak of the load
     alone; `load_added` = `load_hwm - before_load_rss`;
   * `load_peak_anon` / `load_peak_file`: the largest RssAnon / RssFile a thread sampling every
     2 ms saw during the load, and `load_anon_added` / `load_file_added` their growth over the
     values at the call (file pages are the memory-mapped safetensors file: page cache, shared
     between the processes of one machine and reclaimable, but each process reads them;
     anonymous pages are the process's own copies: tensors read, shards placed);
   * `command_hwm`: the peak over the whole command (load, compile, generation);
   * `held_bytes`: bytes of the parameters' shards on this process's devices (each CPU device
     holds its own buffer; replicated tensors count once per device).
   `baseline_hwm`: VmHWM of a separate process that only imports jax and jaxdllm (`--child-baseline`).
   Reported per process: `load_hwm - baseline_hwm` and `command_hwm - baseline_hwm`, against
   the checkpoint's bytes, its largest tensor and `held_bytes`.

Writes `<out>.json` (default `sampling/results/multihost_cpu`): the machine's facts (cpu count,
jax version), the settings, per topology the raw per-step times and per process the memory
readings; and `<out>.png`: ms/step per topology, and peak RSS above the baseline per process
with the checkpoint's size as a line.
"""

from __future__ import annotations

from jaxdllm.extras import exit_if_missing
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SELF = ["-m", "sampling.benchmarks.benchmark_multihost"]  # this script in a child interpreter
VOCAB = dict(vocab_size=101, mask_token_id=3, eos_token_id=2, eot_token_id=2, pad_token_id=0, bos_token_id=1)


# -- readings of this process's memory --------------------------------------------------------------
def proc_status() -> dict[str, int]:
    """`/proc/self/status`'s memory lines in bytes (VmRSS, VmHWM, RssAnon, RssFile, ...)."""
    text = Path("/proc/self/status").read_text()
    return {k: int(v) * 1024 for k, v in re.findall(r"^(Vm\w+|Rss\w+):\s+(\d+) kB", text, re.M)}


def reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class Sampler(threading.Thread):
    """Samples RssAnon and RssFile every `interval_s` while `active`, keeping the largest."""

    def __init__(self, interval_s: float = 0.002):
        super().__init__(daemon=True)
        self.interval_s, self.active, self.peak_anon, self.peak_file, self.samples = interval_s, False, 0, 0, 0

    def run(self):
        while True:
            if self.active:
                s = proc_status()
                self.peak_anon = max(self.peak_anon, s.get("RssAnon", 0))
                self.peak_file = max(self.peak_file, s.get("RssFile", 0))
                self.samples += 1
            time.sleep(self.interval_s)


# -- children ---------------------------------------------------------------------------------------
def child_baseline(out: Path) -> int:
    import jax  # noqa: F401

    import jaxdllm  # noqa: F401

    s = proc_status()
    out.write_text(json.dumps({"baseline_hwm": s["VmHWM"], "baseline_rss": s["VmRSS"]}))
    return 0


def child_load(outdir: Path, cli_args: list[str]) -> int:
    """Run `jaxdllm <cli_args>` (a generate) in this process and write this process's memory readings
    to `outdir/process_<JAXDLLM_PROCESS_ID>.json`."""
    import jax

    import jaxdllm  # noqa: F401
    import jaxdllm.cli
    from flax import nnx

    from jaxdllm.checkpoint import hf_io

    rec: dict = {"import_hwm": proc_status()["VmHWM"]}
    sampler = Sampler()
    sampler.start()
    original = hf_io.from_pretrained

    def measured(*a, **kw):
        s = proc_status()
        rec.update(before_load_rss=s["VmRSS"], before_load_hwm=s["VmHWM"], before_load_anon=s.get("RssAnon", 0),
                   before_load_file=s.get("RssFile", 0), hwm_reset=reset_hwm())
        sampler.active = True
        t0 = time.perf_counter()
        model = original(*a, **kw)
        leaves = jax.tree.leaves(nnx.state(model))
        jax.block_until_ready(leaves)
        rec["load_s"] = time.perf_counter() - t0
        arrays = [x for x in leaves if isinstance(x, jax.Array)]
        sampler.active = False
        s = proc_status()
        rec.update(load_hwm=s["VmHWM"], after_load_rss=s["VmRSS"], load_peak_anon=sampler.peak_anon,
                   load_peak_file=sampler.peak_file, load_samples=sampler.samples,
                   held_bytes=sum(sh.data.nbytes for x in arrays for sh in x.addressable_shards),
                   model_bytes=sum(x.nbytes for x in arrays), local_devices=jax.local_device_count())
        return model

    hf_io.from_pretrained = measured  # generate_command imports it from hf_io when it runs
    code = jaxdllm.cli.main(cli_args)
    s = proc_status()
    rec["command_hwm"] = max(s["VmHWM"], rec.get("before_load_hwm", 0))
    rec["end_rss"] = s["VmRSS"]
    rec["returncode"] = code
    (outdir / f"process_{os.environ.get('JAXDLLM_PROCESS_ID', '0')}.json").write_text(json.dumps(rec))
    return code


def child_write(path: Path, embed: int, layers: int, mlp: int) -> int:
    """A random float32 tiny-llada checkpoint with the character tokenizer in `path`."""
    import jaxdllm
    from flax import nnx

    from jaxdllm.data import save_char_tokenizer

    heads = max(1, embed // 128)
    config = jaxdllm.ModelConfig.preset("tiny-llada", embed_dim=embed, num_layers=layers, mlp_dim=mlp,
                                        num_heads=heads, num_kv_heads=heads, head_dim=embed // heads,
                                        max_position=64, **VOCAB)
    jaxdllm.save_pretrained(jaxdllm.Transformer(config, rngs=nnx.Rngs(0)), path)
    save_char_tokenizer(path)
    return 0


# -- the parent -------------------------------------------------------------------------------------
def parse_topology(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise argparse.ArgumentTypeError(f"a topology is PROCESSESxDEVICES, e.g. 2x2; got {text!r}")
    return int(m[1]), int(m[2])


def _env(devices: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXDLLM_")}
    env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
               JAXDLLM_COMPILATION_CACHE="off",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    return env


def run_job(command: list[str], processes: int, devices: int, timeout: float) -> tuple[float, str]:
    """Run `command` (a python program's arguments, after `python`) as `processes` x `devices`;
    returns the wall seconds and the output. Raises with the output's tail on failure."""
    cmd = [sys.executable, *command]
    if processes > 1:
        cmd = [sys.executable, "-m", "jaxdllm.cli", "launch", "-n", str(processes), "--devices-per-process",
               str(devices), "--grace", "5", "--", *cmd]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=_env(devices), cwd=REPO, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise RuntimeError(f"{processes}x{devices}: {' '.join(command[:4])}... exited {out.returncode}\n"
                           f"{(out.stdout + out.stderr)[-3000:]}")
    return wall, out.stdout + out.stderr


def recipe(args) -> str:
    return f"""[model]
preset = "tiny-llada"
embed_dim = {args.embed}
num_layers = {args.layers}
num_heads = 4
num_kv_heads = 4
head_dim = {args.embed // 4}
mlp_dim = {4 * args.embed}
max_position = {args.seq_len}
attention_impl = "xla"

[data]
source = "tasks"
tasks = ["copy", "reverse"]
examples_per_task = 400
seq_len = {args.seq_len}
batch_size = {args.batch}

[optim]
lr = 3e-3
warmup_steps = 2

[train]
steps = {args.steps}

[checkpoint]
every = 1000000

[log]
every = 1
progress = false
"""


def _quantiles(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return dict(median_ms=statistics.median(xs), q1_ms=q[0], q3_ms=q[2], min_ms=min(xs))


def step_times(args, tmp: Path) -> list[dict]:
    toml = tmp / "recipe.toml"
    toml.write_text(recipe(args))
    rows = []
    for p, d in args.topologies:
        workdir = tmp / f"train_{p}x{d}"
        wall, _ = run_job(["-m", "jaxdllm.cli", "train", str(toml), "--workdir", str(workdir)], p, d, args.timeout)
        records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        steps = [r["step"] for r in records]
        assert steps == list(range(1, args.steps + 1)), f"{p}x{d}: logged steps {steps}"
        elapsed = [r["elapsed_s"] for r in records]
        ms = [1000 * (b - a) for a, b in zip(elapsed, elapsed[1:])]  # ms[i]: step i + 2
        timed = ms[args.warmup:]
        row = dict(topology=f"{p}x{d}", processes=p, devices_per_process=d, wall_s=wall,
                   first_record_s=elapsed[0], step_ms=ms, timed_from_step=args.warmup + 2, **_quantiles(timed),
                   tokens_per_s_last=records[-1]["tokens_per_s"], final_loss=records[-1]["loss"])
        rows.append(row)
        print(f"train {row['topology']}: median {row['median_ms']:.1f} ms/step "
              f"(q1 {row['q1_ms']:.1f}, q3 {row['q3_ms']:.1f}; {len(timed)} steps), wall {wall:.0f} s", flush=True)
    ref = next((r for r in rows if r["processes"] == 1), rows[0])
    for r in rows:
        r["ratio_to_reference"] = r["median_ms"] / ref["median_ms"]
        r["reference"] = ref["topology"]
    return rows


def checkpoint_facts(folder: Path) -> dict:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    sizes = {}
    for f in files:
        with safe_open(str(f), framework="numpy") as h:
            for name in h.keys():
                sl = h.get_slice(name)
                n = 1
                for dim in sl.get_shape():
                    n *= dim
                sizes[name] = n * 4 if sl.get_dtype() in ("F32", "I32") else n * 2 if sl.get_dtype() in (
                    "BF16", "F16") else n
    largest = max(sizes, key=sizes.get)
    return dict(files=len(files), file_bytes=sum(f.stat().st_size for f in files), tensor_bytes=sum(sizes.values()),
                tensors=len(sizes), largest_tensor=largest, largest_tensor_bytes=sizes[largest])


def load_memory(args, tmp: Path) -> dict:
    ckpt = tmp / "checkpoint"
    t0 = time.perf_counter()
    run_job([*SELF, "--child-write", str(ckpt), "--ckpt-embed", str(args.ckpt_embed),
             "--ckpt-layers", str(args.ckpt_layers), "--ckpt-mlp", str(args.ckpt_mlp)], 1, 1, args.timeout)
    facts = checkpoint_facts(ckpt)
    facts["write_s"] = time.perf_counter() - t0
    print(f"checkpoint: {facts['file_bytes'] / 2**20:.1f} MiB in {facts['files']} file(s), largest tensor "
          f"{facts['largest_tensor']} {facts['largest_tensor_bytes'] / 2**20:.1f} MiB", flush=True)
    base_file = tmp / "baseline.json"
    run_job([*SELF, "--child-baseline", str(base_file)], 1, 1, args.timeout)
    baseline = json.loads(base_file.read_text())
    print(f"baseline (import jax, jaxdllm): {baseline['baseline_hwm'] / 2**20:.0f} MiB", flush=True)
    rows = []
    for p, d in args.load_topologies:
        outdir = tmp / f"load_{p}x{d}"
        outdir.mkdir()
        gen = ["generate", "--model", str(ckpt), "--prompt", "hello", "--no-chat", "--gen-length", "8"]
        if p * d > 1:
            gen += ["--mesh", f"data=1,fsdp={p * d},tensor=1"]
        wall, out = run_job([*SELF, "--child-load", str(outdir), "--", *gen], p, d, args.timeout)
        procs = []
        for i in range(p):
            rec = json.loads((outdir / f"process_{i}.json").read_text())
            rec["process"] = i
            for key in ("load_hwm", "command_hwm"):
                rec[f"{key}_above_baseline"] = rec[key] - baseline["baseline_hwm"]
            rec["load_added"] = rec["load_hwm"] - rec["before_load_rss"]  # the load's own peak
            rec["load_anon_added"] = rec["load_peak_anon"] - rec["before_load_anon"]
            rec["load_file_added"] = rec["load_peak_file"] - rec["before_load_file"]
            procs.append(rec)
        row = dict(topology=f"{p}x{d}", processes=p, devices_per_process=d, wall_s=wall,
                   mesh=None if p * d == 1 else f"data=1,fsdp={p * d},tensor=1", per_process=procs)
        rows.append(row)
        for r in procs:
            print(f"load {row['topology']} process {r['process']}: load peak {r['load_hwm'] / 2**20:.0f} MiB "
                  f"(+{r['load_hwm_above_baseline'] / 2**20:.0f} over baseline; the load added anon "
                  f"+{r['load_anon_added'] / 2**20:.0f}, file +{r['load_file_added'] / 2**20:.0f}), command peak "
                  f"+{r['command_hwm_above_baseline'] / 2**20:.0f}"
                  f" MiB, holds {r['held_bytes'] / 2**20:.0f} MiB of shards", flush=True)
    return dict(checkpoint=facts, baseline=baseline, rows=rows)


def machine_facts() -> dict:
    """The machine without starting a JAX backend in this process (the children measure)."""
    import jax
    import jaxlib

    return dict(device="cpu", platform="cpu", jax=jax.__version__, jaxlib=jaxlib.__version__,
                python=platform.python_version(), cpu_count=os.cpu_count(),
                cpu_affinity=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child-load"]:  # before argparse: the rest is the jaxdllm command line
        return child_load(Path(argv[1]), argv[3:] if argv[2:3] == ["--"] else argv[2:])
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.benchmark_multihost")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topologies", nargs="*", type=parse_topology, default=[(1, 4), (2, 2), (4, 1)],
                   help="PxD for the step times (the first single-process one is the reference)")
    p.add_argument("--load-topologies", nargs="*", type=parse_topology, default=[(1, 1), (1, 4), (2, 2), (4, 1)],
                   help="PxD for the checkpoint load's memory")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5, help="step-time differences dropped at the start")
    p.add_argument("--embed", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=16, help="global batch (rows over every device)")
    p.add_argument("--ckpt-embed", type=int, default=2048)
    p.add_argument("--ckpt-layers", type=int, default=2)
    p.add_argument("--ckpt-mlp", type=int, default=4096)
    p.add_argument("--timeout", type=float, default=400, help="seconds per command")
    p.add_argument("--out", default="sampling/results/multihost_cpu")
    p.add_argument("--child-baseline", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--child-write", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_baseline:
        return child_baseline(args.child_baseline)
    if args.child_write:
        return child_write(args.child_write, args.ckpt_embed, args.ckpt_layers, args.ckpt_mlp)
    if args.steps - 1 <= args.warmup:
        p.error(f"--steps {args.steps} leaves no timed step after --warmup {args.warmup}")

    from sampling.benchmarks.report import write_report

    t0 = time.perf_counter()
    settings = dict(train=dict(preset="tiny-llada", embed_dim=args.embed, num_layers=args.layers, num_heads=4,
                               head_dim=args.embed // 4, mlp_dim=4 * args.embed, seq_len=args.seq_len,
                               global_batch=args.batch, steps=args.steps, warmup_dropped=args.warmup,
                               mesh="data parallel over every device", tasks=["copy", "reverse"],
                               step_time="differences of consecutive elapsed_s in metrics.jsonl (log every step)"),
                    load=dict(preset="tiny-llada", embed_dim=args.ckpt_embed, num_layers=args.ckpt_layers,
                              mlp_dim=args.ckpt_mlp, dtype="float32", vocab_size=VOCAB["vocab_size"],
                              command="jaxdllm generate --prompt hello --no-chat --gen-length 8"),
                    compilation_cache="off", nice=os.nice(0))
    with tempfile.TemporaryDirectory(prefix="multihost_") as tmp:
        train = step_times(args, Path(tmp)) if args.topologies else []
        load = load_memory(args, Path(tmp)) if args.load_topologies else None
    result = dict(settings=settings, train=train, load=load, wall_s=time.perf_counter() - t0)
    write_report(args.out, result, plot, facts=machine_facts())
    print(f"wall time {result['wall_s']:.0f} s", flush=True)
    return 0


def plot(data: dict, path: Path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    mib = 2 ** 20
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.4), gridspec_kw=dict(width_ratios=[1, 1.6]))
    train = data["train"]
    if train:
        x = np.arange(len(train))
        med = [r["median_ms"] for r in train]
        err = [[r["median_ms"] - r["q1_ms"] for r in train], [r["q3_ms"] - r["median_ms"] for r in train]]
        a.bar(x, med, 0.6, yerr=err, capsize=4, color="tab:blue")
        for i, r in enumerate(train):
            a.text(i, r["q3_ms"], f"{r['median_ms']:.0f} ms\n{r['ratio_to_reference']:.2f}x", ha="center",
                   va="bottom", fontsize=8)
        a.set_xticks(x, [f"{r['processes']} proc x {r['devices_per_process']} dev" for r in train], fontsize=8)
        a.set_ylabel("ms per training step (median, quartiles)")
        a.set_ylim(0, max(r["q3_ms"] for r in train) * 1.25)
        s = data["settings"]["train"]
        a.set_title(f"Step time, same {train[0]['processes'] * train[0]['devices_per_process']} CPU devices\n"
                    f"embed {s['embed_dim']}, {s['num_layers']} layers, seq {s['seq_len']}, batch {s['global_batch']}",
                    fontsize=9)
    load = data["load"]
    if load:
        base = load["baseline"]["baseline_hwm"]
        width, pos, ticks, labels = 0.8, 0, [], []
        for row in load["rows"]:
            n = len(row["per_process"])
            w = width / n
            for j, r in enumerate(row["per_process"]):
                xj = pos - width / 2 + w * (j + 0.5)
                b.bar(xj, (r["command_hwm"] - base) / mib, w * 0.9, color="tab:orange", alpha=0.45,
                      label="whole command (load, compile, generate)" if pos == j == 0 else None)
                b.bar(xj, (r["load_hwm"] - base) / mib, w * 0.9, color="tab:orange",
                      label="during from_pretrained" if pos == j == 0 else None)
                b.bar(xj, r["load_file_added"] / mib, w * 0.9, color="none", edgecolor="saddlebrown", hatch="//",
                      lw=0, label="of which checkpoint file pages (RssFile growth)" if pos == j == 0 else None)
                b.plot([xj - w * 0.45, xj + w * 0.45], [r["held_bytes"] / mib] * 2, color="black", lw=2,
                       label="shards this process holds" if pos == j == 0 else None)
            ticks.append(pos)
            labels.append(f"{row['processes']} proc x {row['devices_per_process']} dev")
            pos += 1
        ck = load["checkpoint"]
        b.axhline(ck["file_bytes"] / mib, color="tab:red", ls="--",
                  label=f"checkpoint {ck['file_bytes'] / mib:.0f} MiB")
        b.axhline(ck["largest_tensor_bytes"] / mib, color="tab:green", ls=":",
                  label=f"largest tensor {ck['largest_tensor_bytes'] / mib:.0f} MiB")
        b.set_xticks(ticks, labels, fontsize=8)
        b.set_ylabel(f"peak RSS above import baseline ({base / mib:.0f} MiB), MiB")
        b.set_title("Host memory per process loading a float32 checkpoint (one bar per process)", fontsize=9)
        b.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
