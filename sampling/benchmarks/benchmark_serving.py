"""Serving under load: the OpenAI-compatible server (`jaxdllm serve`, Ray Serve) with continuous
admission against a batch formed once and against one request at a time (JSON + PNG).

    nice python -m sampling.benchmarks.benchmark_serving              # ~15 min on 2 cores
    python -m sampling.benchmarks.benchmark_serving --cases llada-dual --concurrency 1 4 \\
        --requests 8 --out /tmp/serving                               # a quick check

(run from the repository root; needs the serve extra: pip install -e '.[serve]'.)

One local Ray instance; per model, three Serve applications of the same checkpoint and settings
side by side, differing only in the scheduler behind the routes (`jaxdllm.serving.ray_app`'s
`scheduler` argument), each one replica with `--slots` rows:
  * `continuous`: the engine (`jaxdllm.serving.engine.Engine`): a request joins a free row at the
    next step while the others decode, leaves as soon as it is done, and streams what is decided;
  * `static`: a batch formed once (`jaxdllm.serving.static_batch.StaticBatchEngine`, what
    `@serve.batch` gives): up to `--slots` waiting requests gathered for at most 10 ms, decoded in
    one compiled call, each answer sent whole when the batch is done;
  * `one-at-a-time`: the same with one row (a plain `generate` per request).
Each replica compiles its programs before it takes requests (`warmup`), and one warm-up round of
requests runs before the measured ones.

Clients: the `openai` package's `AsyncOpenAI` (no retries), `stream=True` with usage, at each
`--concurrency` level (a fixed number of requests in flight: a new one starts as one ends) for
`--requests` requests (at least twice the level), the same distinct prompts for every scheduler.
Per request: time to first token (the first chunk with text), the gaps between text chunks
(inter-token latency: a chunk may hold several tokens; a scheduler that sends the answer whole has
none), latency, completion tokens (the server's usage), forwards. Per level: completion tokens per
second over the level's wall time, p50/p99 of each time. Every answer is compared with offline
`jaxdllm.generate` of its prompt (same settings and seed 0, in this process), except the static
batch's where the sampler draws random numbers (DiffusionGemma's: a batch's rows share one key),
and every request must get exactly one answer: `mismatched`, `errors`, `lost` and `duplicated`
are counted and must be empty.

The plain `generate` call: the median of 10 timed calls of one prompt in this process, after a
compile; beside it the engine's own time to first text for that prompt alone in this process
(`Engine` after `warm_up`, no HTTP), the reference for time to first token at concurrency 1, which
adds HTTP and Ray's proxy.

Cases (`--cases`): `llada-dual` (tasks-llada-small, `fast-dllm-dual`: a masked diffusion model with
Fast-dLLM's dual cache), `diffusiongemma` (tasks-diffusiongemma-tiny, its own sampler),
`qwen2-specdiff` (tasks-qwen2-small drafted by tasks-dream-small, `specdiff`).

Writes `<out>.json` (default `sampling/results/serving_cpu`) and `<out>.png` (throughput and p50
time to first token against concurrency, one panel per case, one line per scheduler).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

import numpy as np

CASES = {
    "llada-dual": {"model": "tasks-llada-small", "preset": "fast-dllm-dual", "tasks": "short"},
    "diffusiongemma": {"model": "tasks-diffusiongemma-tiny", "preset": None, "tasks": "short"},
    "qwen2-specdiff": {"model": "tasks-qwen2-small", "preset": "specdiff", "tasks": "long"},
}
SCHEDULERS = {"continuous": {"scheduler": "continuous"}, "static": {"scheduler": "static"},
              "one-at-a-time": {"scheduler": "static", "slots": 1}}


def prompts(kind: str, n: int, seed: int = 0) -> list[str]:
    """`n` distinct prompts of the synthetic tasks the shipped models know."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        if kind == "long":
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(10, 14)))
            text = f"{rng.choice(['copy', 'reverse', 'sort'])} {digits}="
        else:
            digits = "".join(rng.choice("123456789") for _ in range(rng.randint(3, 5)))
            text = rng.choice([f"reverse {digits}=", f"sort {digits}=", f"copy {digits}=",
                               f"{rng.randint(100, 499)}+{rng.randint(100, 499)}="])
        if text not in out:
            out.append(text)
    return out


def offline_answers(case: dict, texts: list[str], slots: int) -> dict:
    """What the server's answers are checked against and compared with, in this process:
    * `answers`: `{prompt: answer}` of `jaxdllm.generate` with the server's settings and seed 0;
    * `sampled`: whether the sampler draws random numbers (seed 1 changes an answer of these
      prompts): then a batch formed once, whose rows share one key, is not checked;
    * `generate_s`: the median of 10 plain `generate` calls of the first prompt after a compile;
    * `engine_ttft_s`: the median time to the first text of the same prompt through an `Engine` in
      this process (no HTTP), alone, after `warm_up`."""
    import threading

    import jax

    import jaxdllm
    from jaxdllm.serving.engine import Engine
    from jaxdllm.serving.requests import Request

    model, tok, _ = jaxdllm.load(case["model"])
    config = jaxdllm.sampler_defaults(case["model"], case["preset"])
    params = jaxdllm.policy_params(case["model"], config)
    answers, sampled = {}, False
    for text in texts:
        ids = np.asarray([tok.encode(text)], np.int32)
        out = jaxdllm.generate(model, ids, config, policy_params=params, key=jax.random.PRNGKey(0))
        answers[text] = tok.answers(out)[0]
        if not sampled:
            other = jaxdllm.generate(model, ids, config, policy_params=params, key=jax.random.PRNGKey(1))
            sampled = tok.answers(other)[0] != answers[text]
    ids = np.asarray([tok.encode(texts[0])], np.int32)
    times = []
    for _ in range(11):
        t0 = time.perf_counter()
        out = jaxdllm.generate(model, ids, config, policy_params=params)
        jax.block_until_ready(out.tokens)
        times.append(time.perf_counter() - t0)
    engine = Engine(model, tok, slots=slots, policy_params=params)
    engine.warm_up(tuple(tok.encode(texts[0])), config)
    engine.start()
    firsts = []
    for i in range(11):
        got = threading.Event()
        t0 = time.perf_counter()
        engine.submit(Request(f"ttft{i}", tuple(tok.encode(texts[0])), config),
                      lambda e, got=got: got.set() if (e.text or e.finished) else None)
        got.wait(60)
        firsts.append(time.perf_counter() - t0)
        while engine.stats()["running"]:
            time.sleep(0.001)
    engine.shutdown()
    return {"answers": answers, "sampled": sampled, "generate_s": statistics.median(times[1:]),
            "engine_ttft_s": statistics.median(firsts[1:])}


async def one_request(client, model_name: str, text: str) -> dict:
    t0 = time.perf_counter()
    chunks, pieces, usage = [], [], None
    try:
        stream = await client.completions.create(model=model_name, prompt=text, stream=True, seed=0,
                                                 stream_options={"include_usage": True})
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].text:
                chunks.append(now - t0)
                pieces.append(chunk.choices[0].text)
            if getattr(chunk, "usage", None):
                usage = chunk.usage
    except Exception as e:  # counted, never retried
        return {"prompt": text, "error": f"{type(e).__name__}: {e}"}
    end = time.perf_counter() - t0
    return {"prompt": text, "text": "".join(pieces), "ttft": chunks[0] if chunks else end, "latency": end,
            "gaps": [b - a for a, b in zip(chunks, chunks[1:])],
            "tokens": usage.completion_tokens if usage else None,
            "forwards": (usage.model_extra or {}).get("forwards") if usage else None}


async def run_level(base_url: str, model_name: str, texts: list[str], concurrency: int) -> tuple[list, float]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    queue = list(texts)
    results = []

    async def worker():
        while queue:
            results.append(await one_request(client, model_name, queue.pop(0)))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    await client.close()
    return results, wall


def percentile(values, q):
    return float(np.percentile(values, q)) if values else None


def summarise(results: list, wall: float, answers: dict, texts: list[str], checked: bool = True) -> dict:
    ok = [r for r in results if "error" not in r]
    seen = [r["prompt"] for r in results]
    tokens = sum(r["tokens"] or 0 for r in ok)
    gaps = [g for r in ok for g in r["gaps"]]
    return {
        "requests": len(texts), "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall,
        "requests_per_s": len(ok) / wall,
        "ttft_p50_ms": 1e3 * percentile([r["ttft"] for r in ok], 50),
        "ttft_p99_ms": 1e3 * percentile([r["ttft"] for r in ok], 99),
        "itl_p50_ms": None if not gaps else 1e3 * percentile(gaps, 50),
        "itl_p99_ms": None if not gaps else 1e3 * percentile(gaps, 99),
        "latency_p50_ms": 1e3 * percentile([r["latency"] for r in ok], 50),
        "latency_p99_ms": 1e3 * percentile([r["latency"] for r in ok], 99),
        "forwards_per_request": statistics.mean(r["forwards"] for r in ok if r["forwards"] is not None)
        if any(r.get("forwards") is not None for r in ok) else None,
        "errors": [r["error"] for r in results if "error" in r][:5],
        "error_count": len(results) - len(ok),
        "checked": checked,
        "mismatched": [{"prompt": r["prompt"], "got": r["text"], "offline": answers[r["prompt"]]}
                       for r in ok if checked and r["text"] != answers[r["prompt"]]],
        "lost": sorted(set(texts) - set(seen)),
        "duplicated": sorted({p for p in seen if seen.count(p) > 1}),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=64, help="requests per level (at least 2x the level)")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--out", default="sampling/results/serving_cpu")
    args = parser.parse_args(argv)

    import ray
    from ray import serve

    from jaxdllm.serving.ray_app import build_app

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
             object_store_memory=300 * 2**20)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    report = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
              "settings": {"slots": args.slots, "concurrency": args.concurrency, "requests": args.requests,
                           "batch_wait_s": 0.01, "steps_per_dispatch": 4},
              "cases": {}}
    try:
        for name in args.cases:
            case = CASES[name]
            most = max(args.requests, 2 * max(args.concurrency))
            texts = prompts(case["tasks"], most + 8)
            warm, texts = texts[:8], texts[8:]
            offline = offline_answers(case, warm + texts, args.slots)
            answers = offline["answers"]
            entry = {"model": case["model"], "preset": case["preset"], "sampled": offline["sampled"],
                     "generate_call_ms": 1e3 * offline["generate_s"],
                     "engine_ttft_ms": 1e3 * offline["engine_ttft_s"], "schedulers": {}}
            print(f"{name}: one generate call {entry['generate_call_ms']:.1f} ms, the engine's first text alone "
                  f"{entry['engine_ttft_ms']:.1f} ms (in process)", flush=True)
            for sched, options in SCHEDULERS.items():
                app = build_app({"model": case["model"], "preset": case["preset"], "slots": args.slots,
                                 "num_cpus": 1, **options})
                t0 = time.perf_counter()
                serve.run(app, name=sched, route_prefix=f"/{sched}", blocking=False)
                entry.setdefault("ready_s", {})[sched] = time.perf_counter() - t0
            model_name = Path(case["model"]).name
            for sched in SCHEDULERS:  # a warm-up round through HTTP for each
                asyncio.run(run_level(f"http://127.0.0.1:{args.port}/{sched}/v1", model_name, warm, 4))
            for level in args.concurrency:
                n = max(args.requests, 2 * level)
                for sched in SCHEDULERS:  # side by side, level by level
                    results, wall = asyncio.run(run_level(f"http://127.0.0.1:{args.port}/{sched}/v1", model_name,
                                                          texts[:n], level))
                    # a sampling preset: a static batch's rows share one key, so only the others are checked
                    checked = not (offline["sampled"] and sched == "static")
                    summary = summarise(results, wall, answers, texts[:n], checked)
                    entry["schedulers"].setdefault(sched, {})[str(level)] = summary
                    print(f"{name:15s} {sched:14s} c={level:3d}: {summary['tokens_per_s']:8.1f} tok/s  "
                          f"ttft p50 {summary['ttft_p50_ms']:7.1f} ms  itl p50 {summary['itl_p50_ms'] or 0:6.1f} ms  "
                          f"errors {summary['error_count']} mismatched {len(summary['mismatched'])} "
                          f"lost {len(summary['lost'])}", flush=True)
            for sched in SCHEDULERS:
                serve.delete(sched)
            report["cases"][name] = entry
            write(report, args.out)
    finally:
        serve.shutdown()
        ray.shutdown()
    write(report, args.out)
    return 0


def write(report: dict, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out + ".json").write_text(json.dumps(report, indent=1))
    cases = report["cases"]
    if not cases:
        return
    fig, axes = plt.subplots(2, len(cases), figsize=(4.5 * len(cases), 7), squeeze=False)
    for col, (name, entry) in enumerate(cases.items()):
        for sched, levels in entry["schedulers"].items():
            xs = [int(k) for k in levels]
            axes[0, col].plot(xs, [levels[k]["tokens_per_s"] for k in levels], marker="o", label=sched)
            axes[1, col].plot(xs, [levels[k]["ttft_p50_ms"] for k in levels], marker="o", label=sched)
        axes[1, col].axhline(entry["generate_call_ms"], color="gray", ls="--", label="one generate call")
        axes[0, col].set_title(f"{name} ({entry['model']})")
        for row, label in ((0, "completion tokens / s"), (1, "time to first token p50 (ms)")):
            axes[row, col].set_xscale("log", base=2)
            axes[row, col].set_xlabel("concurrent requests")
            axes[row, col].set_ylabel(label)
        axes[1, col].set_yscale("log")
        axes[0, col].legend(fontsize=8)
    fig.suptitle(f"jaxdllm serve on {report['machine']['cpus']} CPU cores: continuous admission vs a static "
                 "batch vs one at a time")
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
