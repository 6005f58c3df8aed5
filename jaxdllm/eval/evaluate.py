"""`jaxdllm eval`: every sampler setting on every task, to JSON and a Pareto plot, resumably.

`sampler_settings(preset, overrides, sweep)` builds the labelled `SamplerConfig`s of a run (a
sweep is the product of its value lists), `checkpoint_samplers` those of a checkpoint (the model
card's table when no preset is named); `evaluate(...)` decodes every (setting, task) pair
through `runner.run_task`, writes `<out>/items.jsonl` as it goes (a rerun with the same `--out`
resumes) and `<out>/eval.json` plus `<out>/pareto.png` (accuracy against answer tokens per
forward, one panel per task) at the end.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import warnings
from pathlib import Path

import jax

from jaxdllm.decoding import SamplerConfig
from jaxdllm.errors import ConfigError, Interrupted
from jaxdllm.eval.runner import ItemStore, run_task, setting_key, summarize
from jaxdllm.eval.tasks import EvalTask
from jaxdllm.interrupts import signal_number, stop_between_batches

TIMING_KEYS = ("timing",)  # what differs between two runs of the same evaluation


def _value_text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def sampler_settings(preset: str, overrides: dict | None = None, sweep: dict | None = None,
                     base: dict | None = None) -> dict[str, SamplerConfig]:
    """`{label: SamplerConfig}`: `preset` with `overrides`, once per point of the `sweep` product.

    `sweep` maps a setting to its values (`{"threshold": [0.5, 0.9]}`); labels name the preset
    and the swept values (`"fast-dllm-parallel threshold=0.5"`). `base` holds settings that come
    before both (a checkpoint's defaults, `jaxdllm.pretrained.checkpoint_settings`): a
    `gen_length` in `overrides` or the sweep rescales their block length and steps
    (`SamplerConfig.resized`). Every config is built (and so validated) here, before any model
    is loaded.
    """
    overrides = dict(overrides or {})
    sweep = dict(sweep or {})
    for name, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"--sweep {name} needs a comma-separated list of values, e.g. {name}=0.5,0.7,0.9")
        if name in overrides:
            raise ConfigError(f"{name} is both set (--set) and swept (--sweep): keep one")
    unknown = sorted((set(overrides) | set(sweep)) - set(SamplerConfig.option_names()))
    if unknown:
        raise ConfigError(f"unknown sampler option(s) {unknown}; options: {list(SamplerConfig.option_names())}")
    start = SamplerConfig.preset(preset, **(base or {}))
    out = {}
    for point in itertools.product(*sweep.values()):
        chosen = dict(zip(sweep, point))
        label = " ".join([preset] + [f"{k}={_value_text(v)}" for k, v in chosen.items()])
        changes = {**overrides, **chosen}
        out[label] = start.resized(**changes) if "gen_length" in changes else start.replace(**changes)
    return out


def checkpoint_samplers(model_dir, preset: str | None = None, *, gen_length: int | None = None,
                        overrides: dict | None = None, sweep: dict | None = None) -> dict[str, SamplerConfig]:
    """The labelled samplers `jaxdllm eval` compares on the checkpoint `model_dir` (a folder, shipped
    name or `Checkpoint`), each built (and so checked) before any model is loaded.

    Without `preset`, the model card's table at the checkpoint's `gen_length` (or `gen_length`):
    for a causal model (its default preset decodes the draft canvas) autoregressive decoding
    (`ar`), Jacobi decoding (`jacobi`) and Jacobi Forcing's rule (`jacobi-mr`); for a diffusion
    model one token per step (`llada`) and Fast-dLLM's threshold rule (`threshold`); for
    DiffusionGemma its own sampler at the checkpoint's settings (`diffusiongemma`). `overrides`
    and `sweep` then raise `ConfigError`: they change a named preset.

    With `preset`: `sampler_settings` of it over the checkpoint's own settings, `gen_length` and
    `overrides` (`{name: value}`, the `--set` values) applied to every point of `sweep`
    (`{name: [values]}`; a single value counts as a list of one). A new length rescales the block
    length and steps.
    """
    from jaxdllm.pretrained import checkpoint_settings

    sets = dict(overrides or {})
    sweep = {k: v if isinstance(v, list) else [v] for k, v in (sweep or {}).items()}
    name, defaults = checkpoint_settings(model_dir, preset)
    if preset is None:
        if sets or sweep:
            raise ConfigError("--set and --sweep need --preset (the sampler they change)")
        g = gen_length or defaults.get("gen_length", 16)
        compared = SamplerConfig.preset(name).canvas.comparison_presets(name, g, defaults)
        return {label: SamplerConfig.preset(preset, **settings) for label, (preset, settings) in compared.items()}
    if gen_length is not None:
        if "gen_length" in sets and sets["gen_length"] != gen_length:
            raise ConfigError("--gen-length and --set gen_length disagree: keep one")
        sets["gen_length"] = gen_length
    clash = sorted(set(sets) & set(sweep))
    if clash:
        flag = "--gen-length" if clash[0] == "gen_length" and gen_length is not None else "--set"
        raise ConfigError(f"{clash[0]} is both set ({flag}) and swept (--sweep): keep one")
    # the checkpoint's settings come first; a new gen_length rescales its block length and steps
    return sampler_settings(preset, sets, sweep, base=defaults)


def _mean_row(rows: dict[str, dict]) -> dict:
    tasks = list(rows.values())
    nfe = sum(r["mean_nfe"] * r["n"] for r in tasks)
    tokens = sum(r["answer_tokens_per_forward"] * r["mean_nfe"] * r["n"] for r in tasks)
    return {"n": sum(r["n"] for r in tasks), "accuracy": sum(r["accuracy"] for r in tasks) / len(tasks),
            "mean_nfe": nfe / sum(r["n"] for r in tasks), "answer_tokens_per_forward": tokens / max(nfe, 1)}


def params_fingerprint(module) -> str:
    """A short fingerprint of a policy's parameters ("" for none): decoded items of another
    filter are not reused."""
    if module is None:
        return ""
    import numpy as np
    from flax import nnx

    digest = hashlib.blake2b(digest_size=8)
    for path, value in sorted(nnx.to_flat_state(nnx.state(module)), key=lambda kv: str(kv[0])):
        digest.update(str(path).encode())
        digest.update(np.asarray(value.get_value()).tobytes())
    return "\x00" + digest.hexdigest()


def weights_version(model_dir: str | Path) -> str:
    """A short fingerprint of a checkpoint directory's weight files (names, sizes, modification
    times): it changes when the weights are written again, e.g. by a new training run's export.
    Side files (a policy's parameters such as Learn2PD's filter, and their `.json` reports) do not
    count: a filter written beside the model does not change the model."""
    from jaxdllm.checkpoint.hf_io import is_side_file

    directory = Path(model_dir)
    side = {p.stem for p in directory.glob("*.safetensors") if is_side_file(p)}
    files = sorted(p for p in directory.iterdir()
                   if p.is_file() and p.suffix in (".safetensors", ".json") and p.stem not in side)
    text = json.dumps([(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files])
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def evaluate(model, tokenizer, tasks: list[EvalTask], samplers: dict[str, SamplerConfig], *, n: int | None,
             seed: int = 1234, batch_size: int = 100, out: str | Path | None = None, model_id: str = "",
             model_version: str = "", policy_params: dict | None = None, progress: bool = True,
             log=print) -> dict:
    """Evaluate every sampler setting on every task.

    Args:
      model, tokenizer: what `jaxdllm.generate` decodes with.
      tasks: `EvalTask` adapters (see `resolve_tasks`).
      samplers: `{label: SamplerConfig}` (see `sampler_settings`).
      n: items per task (None: the whole split of file-backed tasks such as GSM8K).
      seed: the held-out draw of the generated suite tasks.
      batch_size: rows per `generate` call; part of what a resumed run must keep.
      out: directory for `items.jsonl` (resume), `eval.json` and `pareto.png`; None writes nothing.
      model_id: names the model in the resume key and the JSON (e.g. its resolved directory).
      model_version: also part of the resume key: records of other weights at the same
        `model_id` are decoded again (the CLI passes `weights_version(model_dir)`).
      policy_params: `{label: module}` for the settings whose policy has parameters of its own
        (Learn2PD's filter: `jaxdllm.policy_params`); their fingerprint is part of the resume key.
      progress: show a progress bar per (setting, task).
      log: called with one line per finished (setting, task).

    Returns:
      `{"model", "n", "seed", "batch_size", "settings": {label: repr}, "results": {label: {task:
      row, "mean": row}}}`, where a row holds `n`, `accuracy`, `mean_nfe`,
      `answer_tokens_per_forward` and (tasks only) `timing` (`tokens_per_s`, `latency_s`, ...).
    """
    from tqdm.auto import tqdm

    out = None if out is None else Path(out)
    store = ItemStore(None if out is None else out / "items.jsonl")
    task_items = {task.name: task.items(n, seed) for task in tasks}
    report = {"model": model_id, "n": n, "seed": seed, "batch_size": batch_size,
              "settings": {label: repr(config) for label, config in samplers.items()}, "results": {}}
    for label, config in samplers.items():
        rows = {}
        params = (policy_params or {}).get(label)
        for task in tasks:
            items = task_items[task.name]
            key = setting_key(f"{model_id}\x00{model_version}\x00{label}\x00{batch_size}"
                              f"{params_fingerprint(params)}", config, task)
            bar = tqdm(total=len(items), desc=f"{label} | {task.name}", unit="item", disable=not progress,
                       leave=False)
            try:
                with stop_between_batches() as stop:  # Ctrl-C or SIGTERM: after the batch in progress
                    records = run_task(model, tokenizer, task, items, config, key=key, store=store,
                                       batch_size=batch_size, progress=bar, stop=stop, policy_params=params)
            except KeyboardInterrupt as e:  # every finished batch is in the store
                if store.path is None:
                    raise
                raise Interrupted(signal_number(e), f"{len(store)} decoded items kept in {store.path}") from None
            finally:  # an error message starts on its own line
                bar.close()
            rows[task.name] = summarize(records)
            r = rows[task.name]
            log(f"{label:28s} {task.name:8s} accuracy {r['accuracy']:.3f}  NFE {r['mean_nfe']:.2f}  "
                f"answer tokens/forward {r['answer_tokens_per_forward']:.2f}  "
                f"{r['timing']['tokens_per_s']:.1f} tokens/s  latency {r['timing']['latency_s']:.2f}s")
        rows["mean"] = _mean_row(rows)
        report["results"][label] = rows
    if out is not None and jax.process_index() == 0:  # a multi-process job writes its results once
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval.json").write_text(json.dumps(report, indent=1))
        plot_pareto(report, out / "pareto.png")
    return report


def without_timing(report: dict) -> dict:
    """`report` with the wall-clock entries removed: what two runs of one evaluation share."""
    if isinstance(report, dict):
        return {k: without_timing(v) for k, v in report.items() if k not in TIMING_KEYS}
    return report


def plot_pareto(report: dict, path: str | Path) -> Path | None:
    """Accuracy against answer tokens per forward, one panel per task plus the mean, a point per
    sampler setting (settings of one sweep joined by a line). Needs matplotlib (`.[eval]`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from jaxdllm.extras import missing_extra_message

        warnings.warn(missing_extra_message("matplotlib", "eval", "the Pareto plot (pareto.png)") + "; not written")
        return None
    labels = list(report["results"])
    panels = list(next(iter(report["results"].values())))
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False)
    groups: dict[str, list[str]] = {}
    for label in labels:  # a sweep's points share the preset and the swept names
        groups.setdefault(" ".join(part.split("=")[0] for part in label.split()), []).append(label)
    for ax, panel in zip(axes.flat, panels):
        for g, members in enumerate(groups.values()):
            xs = [report["results"][m][panel]["answer_tokens_per_forward"] for m in members]
            ys = [100 * report["results"][m][panel]["accuracy"] for m in members]
            ax.plot(xs, ys, "o-" if len(members) > 1 else "o", color=f"C{g}", label=members[0].split()[0])
            for m, x, y in zip(members, xs, ys):
                # a sweep point is tagged with its values; a label of the caller's own, whole
                tag = " ".join(p.split("=", 1)[1] for p in m.split()[1:] if "=" in p) or m
                ax.annotate(tag, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_title(panel)
        ax.set_xlabel("answer tokens per forward")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{Path(str(report['model'])).name or 'model'}: accuracy against tokens per forward", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
