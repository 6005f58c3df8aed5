"""Learn2PD's filter (Bao et al., 2025, "Learning to Parallel"), trained from the engine's own decoding.

1. `jaxdllm distill trajectories RECIPE` decodes the prompts with the base sampler and records
   every state (the batched, resumable runner that teacher answers also use).
2. `oracle_examples` replays each recorded state through the model once, as the sampler saw it
   (the MASK logit at -inf): the current block's top-1 probabilities are the features, and "this
   masked position's argmax already equals the final answer's token" is the label. Decided
   positions are features only.
3. `train_filter` fits `Learn2PDFilter` (hidden > 0: the published 2-layer MLP; 0: logistic
   regression) with BCE over the masked positions.
4. `save_filter` (in `decoding/policies/learn2pd.py`) writes it beside the model; `jaxdllm
   generate --preset learn2pd` finds it there.

`distill_learn2pd` runs steps 2-4 for a recipe (what `jaxdllm distill learn2pd` calls).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxdllm.attention import MaskSpec
from jaxdllm.data.jsonl import iter_jsonl_lines
from jaxdllm.decoding.canvases import canvas_of
from jaxdllm.decoding.policies import policy_class
from jaxdllm.decoding.policies.learn2pd import FILTER_FILE, Learn2PDFilter, save_filter
from jaxdllm.errors import ConfigError, DataError
from jaxdllm.models.transformer import Transformer
from jaxdllm.output_paths import check_output_file
from jaxdllm.shipped import checkpoint_dir


@dataclasses.dataclass
class OracleExamples:
    """Per recorded state: `features [N, L]` the block's top-1 probabilities, `labels [N, L]` 1 where
    the argmax equals the final token, `weights [N, L]` 1 on the positions still masked, and
    `prompt [N]` the index of the prompt the state came from (to split by prompt)."""

    def split(self, held_out: float, seed: int = 0) -> tuple["OracleExamples", "OracleExamples"]:
        """`(train, held_out)` by prompt: every state of a prompt lands on the same side."""
        prompts = np.unique(self.prompt)
        rng = np.random.default_rng(seed)
        chosen = rng.permutation(prompts)[:int(round(held_out * len(prompts)))]
        out = np.isin(self.prompt, chosen)
        return self.take(np.nonzero(~out)[0]), self.take(np.nonzero(out)[0])

    features: np.ndarray
    labels: np.ndarray
    weights: np.ndarray
    prompt: np.ndarray

    def take(self, rows: np.ndarray) -> "OracleExamples":
        return OracleExamples(self.features[rows], self.labels[rows], self.weights[rows], self.prompt[rows])


def read_trajectories(path: str | Path) -> list[dict]:
    """The records of a `jaxdllm distill trajectories` file (each with `prompt_ids`, `states`,
    `fixed_point`)."""
    out = []
    for number, line in iter_jsonl_lines(path):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not all(k in record for k in ("prompt_ids", "states", "fixed_point")):
                raise DataError("expected fields 'prompt_ids', 'states' and 'fixed_point'")
        except ValueError as e:
            raise DataError(f"{path}:{number}: not a trajectory record of `jaxdllm distill trajectories` "
                            f"({e})") from None
        out.append(record)
    if not out:
        raise DataError(f"{path}: no trajectory records")
    return out


def oracle_examples(model: Transformer, records: Sequence[dict], block_length: int, *,
                    batch_size: int = 64) -> OracleExamples:
    """Features and labels of every recorded state (see the module docstring), in record order.

    `records`: `read_trajectories` output, decoded with blocks of `block_length`; states are the
    answer region `[G]` before each step, with MASK on undecided positions. The decoding block
    of a state is its first block holding a MASK. States are replayed `batch_size` at a time,
    grouped by that block, so a forward computes the LM head over one block only (`[B, L, V]`
    logits, not `[B, G, V]`: what keeps the replay of a 126k-vocabulary model in memory).
    """
    c = model.config
    if c.mask_token_id is None:
        raise ConfigError("Learn2PD filters read a diffusion model's decoding: the model has no mask_token_id")
    gen = len(records[0]["fixed_point"])
    if gen % block_length:
        raise ConfigError(f"the trajectories' gen_length {gen} is not a multiple of block_length {block_length}")
    rows = [(r["prompt_ids"], s, r["fixed_point"], i) for i, r in enumerate(records) for s in r["states"]]
    states = np.asarray([s for _, s, _, _ in rows], np.int32)
    masked_any = (states == c.mask_token_id).any(1)
    block_of = np.where(masked_any, np.argmax(states == c.mask_token_id, axis=1) // block_length, -1)
    # prompts left-padded as the sampler pads them (block-causal models start on a block boundary);
    # padding has segment id 0 and positions count real tokens, so it changes nothing else
    unit = c.block_size if c.attention == "block_causal" else 1
    width = -(-max(len(p) for p, *_ in rows) // unit) * unit
    pad = c.pad_token_id if c.pad_token_id is not None else 0

    @jax.jit
    def features(ids, seg, states, final, block):
        canvas = jnp.concatenate([ids, states], 1)
        seg = jnp.concatenate([seg, jnp.ones_like(states)], 1)
        positions = jnp.maximum(jnp.cumsum(seg, axis=1) - 1, 0)
        start = block * block_length
        logits = model(canvas, positions, MaskSpec.from_padding(seg, kind=c.attention, block_size=c.block_size),
                       logits_slice=(width - int(c.shift_logits) + start, block_length)).logits
        logits = logits.at[..., c.mask_token_id].set(-jnp.inf)  # as the sampler sees them
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        take = lambda x: jax.lax.dynamic_slice_in_dim(x, start, block_length, axis=1)
        right = jnp.argmax(probs, axis=-1) == take(final)
        return jnp.max(probs, axis=-1), right, take(states) == c.mask_token_id

    n = len(rows)
    feats = np.zeros((n, block_length), np.float32)
    labels, weights = np.zeros_like(feats), np.zeros_like(feats)
    for block in np.unique(block_of[block_of >= 0]):
        where = np.nonzero(block_of == block)[0]
        for lo in range(0, len(where), batch_size):
            take = where[lo:lo + batch_size]
            chunk = np.concatenate([take, np.full(batch_size - len(take), take[0])])  # one shape: one compile
            ids = np.full((batch_size, width), pad, np.int32)
            seg = np.zeros((batch_size, width), np.int32)
            for i, row in enumerate(chunk):
                prompt = rows[row][0]
                ids[i, width - len(prompt):], seg[i, width - len(prompt):] = prompt, 1
            final = np.asarray([rows[row][2] for row in chunk], np.int32)
            f, y, w = (np.asarray(x)[:len(take)] for x in features(ids, seg, states[chunk], final, block))
            feats[take], labels[take], weights[take] = f, y, w
    examples = OracleExamples(feats, labels, weights, np.asarray([r[3] for r in rows]))
    keep = examples.weights.any(1)  # a state with nothing masked has nothing to learn
    return examples.take(np.nonzero(keep)[0])


def bce(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """Mean binary cross-entropy of accept logits over the weighted positions (`[N, L]` each)."""
    per = optax.sigmoid_binary_cross_entropy(logits, labels)
    return (per * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def train_filter(train: OracleExamples, *, hidden: int = 32, steps: int = 2000, batch_size: int = 1024,
                 learning_rate: float = 3e-3, seed: int = 0, held_out: OracleExamples | None = None,
                 log_every: int = 500) -> tuple[Learn2PDFilter, list[dict]]:
    """Fit a `Learn2PDFilter` to oracle examples with BCE (Adam); returns it and its log (step,
    train loss and, with `held_out`, held-out loss)."""
    block_length = train.features.shape[1]
    module = Learn2PDFilter(block_length, hidden, rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(module, nnx.Param)
    tx = optax.adam(learning_rate)
    opt = tx.init(params)

    def loss_of(params, x, y, w):
        return bce(nnx.merge(graphdef, params)(x), y, w)

    @jax.jit
    def step(params, opt, x, y, w):
        loss, grads = jax.value_and_grad(loss_of)(params, x, y, w)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    evaluate = jax.jit(loss_of)
    rng = np.random.default_rng(seed)
    log, start = [], time.perf_counter()
    n = len(train.features)
    for i in range(1, steps + 1):
        rows = rng.integers(0, n, min(batch_size, n))
        params, opt, loss = step(params, opt, train.features[rows], train.labels[rows], train.weights[rows])
        if i % log_every == 0 or i == steps:
            entry = {"step": i, "train_loss": float(loss), "seconds": time.perf_counter() - start}
            if held_out is not None:
                entry["held_out_loss"] = float(evaluate(params, held_out.features, held_out.labels, held_out.weights))
            log.append(entry)
    return nnx.merge(graphdef, params), log


def _accepted_rows(scores: np.ndarray, examples: OracleExamples, thresholds: Sequence[float]) -> list[dict]:
    """Per threshold t, over the masked positions: the share with `scores > t` and how many of
    those are already final."""
    w = examples.weights > 0
    out = []
    for t in thresholds:
        accepted = (scores > t) & w
        out.append({"threshold": float(t), "accepted": float(accepted.sum() / max(w.sum(), 1)),
                    "precision": float(examples.labels[accepted].mean()) if accepted.any() else 1.0})
    return out


def acceptance(module: Learn2PDFilter, examples: OracleExamples, thresholds: Sequence[float]) -> list[dict]:
    """Per threshold, over the masked positions of `examples`: the share the filter accepts and the
    share of those whose argmax is already final (precision: a wrong accepted token is an error)."""
    return _accepted_rows(np.asarray(jax.nn.sigmoid(module(jnp.asarray(examples.features)))), examples, thresholds)


def confidence_acceptance(examples: OracleExamples, thresholds: Sequence[float]) -> list[dict]:
    """`acceptance` of the filter-free rule "accept where the top-1 probability is above t": what
    the trained filter is measured against."""
    return _accepted_rows(examples.features, examples, thresholds)


def trajectory_settings(path: str | Path) -> dict:
    """The sampler settings a `jaxdllm distill trajectories` file was decoded with (from its
    `.meta.json`): `block_length`, `gen_length`, the policy, ..."""
    meta = Path(str(path) + ".meta.json")
    if not meta.is_file():
        raise DataError(f"{meta} is missing: {path} was not written by `jaxdllm distill trajectories`")
    return json.loads(meta.read_text())["sampler"]


def cached_oracle_examples(model: Transformer, records: Sequence[dict], block_length: int,
                           cache: str | Path | None, log=print) -> tuple[OracleExamples, float]:
    """`oracle_examples`, kept in the `.npz` file `cache` when one is named (name it after the
    trajectories and the model's weights: a new filter setting then skips the replay). Returns
    the examples and the seconds the replay took (0 when read from `cache`)."""
    cache = None if cache is None else Path(cache)
    if cache is not None and cache.is_file():
        with np.load(cache) as f:
            examples = OracleExamples(f["features"], f["labels"], f["weights"], f["prompt"])
        log(f"oracle traces read from {cache}")
        return examples, 0.0
    start = time.perf_counter()
    examples = oracle_examples(model, records, block_length)
    seconds = time.perf_counter() - start
    if cache is None:
        return examples, seconds
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache.with_suffix(".tmp.npz"), **dataclasses.asdict(examples))
    cache.with_suffix(".tmp.npz").replace(cache)  # a killed run leaves no half-written cache
    return examples, seconds


def fit_filter(model: Transformer, records: Sequence[dict], block_length: int, *, hidden: int = 32,
               steps: int = 2000, batch_size: int = 1024, lr: float = 3e-3, held_out: float = 0.1, seed: int = 0,
               thresholds: Sequence[float] = (0.5, 0.9, 0.96), cache: str | Path | None = None,
               log=print) -> tuple[Learn2PDFilter, dict]:
    """The whole fit: oracle examples of `records` (`oracle_examples`; kept in `cache` when
    given, see `cached_oracle_examples`), a split by prompt (`held_out` of them only measured),
    `train_filter`, and `acceptance` at each threshold on both sides. Returns the filter and a
    JSON-able report (counts, seconds of each stage, the loss log, the acceptance tables)."""
    examples, replay = cached_oracle_examples(model, records, block_length, cache, log=log)
    train, test = examples.split(held_out, seed)
    if not len(train.features):
        raise DataError("no recorded state to train on: record more prompts or lower [learn2pd] held_out")
    log(f"oracle traces: {len(examples.features)} block states of {len(records)} prompts "
        f"({len(train.features)} train, {len(test.features)} held out) in {replay:.1f}s")
    start = time.perf_counter()
    module, history = train_filter(train, hidden=hidden, steps=steps, batch_size=batch_size, learning_rate=lr,
                                   seed=seed, held_out=test if len(test.features) else None,
                                   log_every=max(steps // 10, 1))
    seconds = time.perf_counter() - start
    for entry in history:
        log("  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in entry.items()))
    masked = lambda e: float((e.labels * e.weights).sum() / max(e.weights.sum(), 1))
    report = {"block_length": block_length, "hidden": hidden, "steps": steps, "batch_size": batch_size, "lr": lr,
              "prompts": len(records), "held_out_prompts": int(len(np.unique(test.prompt))),
              "states": {"train": len(train.features), "held_out": len(test.features)},
              "masked_positions": {"train": int(train.weights.sum()), "held_out": int(test.weights.sum())},
              "already_final": {"train": masked(train), "held_out": masked(test) if len(test.features) else None},
              "seconds": {"oracle_replay": replay, "training": seconds}, "log": history,
              "acceptance": {"train": acceptance(module, train, thresholds),
                             "held_out": acceptance(module, test, thresholds) if len(test.features) else []},
              "confidence_rule": {"held_out": confidence_acceptance(test, [*thresholds, 0.999])
                                  if len(test.features) else []}}
    side = "held_out" if len(test.features) else "train"
    for row in report["acceptance"][side]:
        log(f"threshold {row['threshold']:.2f}: accepts {row['accepted']:.1%} of the masked positions "
            f"({side.replace('_', '-')}), {row['precision']:.2%} of them already final")
    log(f"trained in {seconds:.1f}s ({steps} steps)")
    return module, report


def distill_learn2pd(config, recipe: str, out: str | Path | None = None, log=print) -> Path:
    """Learn2PD's filter for a recipe (a `TrainConfig`): its `[distill]` model (the teacher, else
    `[model] init_from`) replays the trajectories `jaxdllm distill trajectories` recorded, and
    `fit_filter` fits the filter with the `[learn2pd]` settings. The filter goes to `out` (a
    `.safetensors` file or a folder; default `[learn2pd] out`, else the model's folder, where
    `--preset learn2pd` finds it), with the fit's JSON report beside it.

    Args:
      config: the recipe, overrides applied.
      recipe: the recipe's name or path, as errors name it.
      out: the command line's `--out`, or None.
      log: called with each progress line.

    Returns the filter file (the report is the same path with `.json`). Raises `ConfigError` or
    `DataError` before any model is loaded when the recipe, the trajectories or `out` cannot serve.
    """
    from jaxdllm.checkpoint.hf_io import from_pretrained
    from jaxdllm.eval.evaluate import weights_version
    from jaxdllm.train.config import Learn2PDSection

    if config.distill is None:
        raise ConfigError(f"recipe {recipe} has no [distill] section: it names the model (teacher) and the "
                          "prompts whose trajectories train the filter")
    section = config.learn2pd or Learn2PDSection()
    teacher = checkpoint_dir(config.distill.teacher or config.model.init_from)
    path = Path(section.trajectories or config.distill.out)
    if not path.is_file():
        raise DataError(f"no trajectories at {path}: record them first with `jaxdllm distill trajectories "
                        f"{recipe}`")
    settings = trajectory_settings(path)
    if not canvas_of(policy_class(settings["policy"]["name"])).unmasks:
        raise ConfigError(f"{path} holds draft-and-verify trajectories; Learn2PD's oracle traces are a diffusion "
                          "model's decoding ([distill] preset = \"llada\")")
    target = Path(out or section.out or teacher)
    target = target if target.suffix == ".safetensors" else target / FILTER_FILE  # a folder: the file inside
    check_output_file(target, "--out" if out else "[learn2pd] out")
    model = from_pretrained(teacher, dtype=config.distill.dtype)
    records = read_trajectories(path)
    # the replayed features, kept beside the trajectories per model weights and dtype: another
    # filter setting (hidden, steps, lr) on the same traces skips the replay
    cache = path.with_name(f"{path.stem}.oracle-{weights_version(teacher)}-{config.distill.dtype or 'stored'}.npz")
    module, report = fit_filter(model, records, settings["block_length"], hidden=section.hidden, steps=section.steps,
                                batch_size=section.batch_size, lr=section.lr, held_out=section.held_out,
                                seed=section.seed, thresholds=section.thresholds, cache=cache, log=log)
    report.update(model=teacher.name, weights=weights_version(teacher), trajectories=str(path),
                  trajectory_sampler=settings)
    saved = save_filter(module, target, model=teacher.name, weights=weights_version(teacher),
                        trained_on=f"{len(records)} prompts of {path.name} ({settings['policy']['name']}, "
                                   f"gen_length {settings['gen_length']})")
    saved.with_suffix(".json").write_text(json.dumps(report, indent=1))
    return saved
