"""Decode an evaluation task's items in batches with the compiled sampler, resumably.

`decode_batches` is the one resumable batched decoding loop: eval, the teacher's answers and
Jacobi trajectories (`jaxdllm.train.distill.teacher`) all run it. `run_task` splits the items
into fixed batches (items `[k*B, (k+1)*B)`), decodes each, scores every response and appends one JSON line per item to an `ItemStore`.
A batch is written only once it is complete, so after a kill the next run skips the finished
batches and decodes the rest in the same batches: the per-item records, and so every metric
but wall-clock time, are those of an uninterrupted run.

`summarize(records)` turns the records of one (sampler setting, task) into the reported numbers:
accuracy, mean NFE, answer tokens per forward (answer = generated tokens up to the first EOS),
and wall-clock throughput and latency (batches that compiled the loop are left out when others
exist).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import jax
import numpy as np

from jaxdllm.decoding import GenerateResult, SamplerConfig, generate
from jaxdllm.errors import ConfigError
from jaxdllm.eval.tasks import EvalItem, EvalTask
from jaxdllm.models.transformer import Transformer
from jaxdllm.tokenizer import Tokenizer, answer_length, decode_response


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """`([B, Lmax] ids, [B, Lmax] attention mask)` with every row right-aligned."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = row
        mask[i, width - len(row):] = 1
    return ids, mask


def setting_key(label: str, config: SamplerConfig, task: EvalTask) -> str:
    """A short stable key of what decides an item's result: the sampler setting and the task's settings."""
    text = json.dumps([label, repr(config), task.describe()], sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


_COMPILED_SHAPES: set[tuple] = set()  # (config, rows, prompt bucket) decoded in this process


class ItemStore:
    """Per-item results as JSON lines in `path`, appended batch by batch (flushed and synced).

    A truncated last line (a kill in the middle of a write) is ignored on reading.
    """

    def __init__(self, path: str | os.PathLike | None):
        self.path = None if path is None else Path(path)
        self._records: dict[tuple[str, str], dict] = {}
        if self.path is not None and self.path.is_file():
            for line in self.path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                self._records[(record["key"], record["id"])] = record

    def get(self, key: str, item_id: str) -> dict | None:
        return self._records.get((key, item_id))

    def add(self, records: list[dict]) -> None:
        for record in records:
            self._records[(record["key"], record["id"])] = record
        if self.path is None or jax.process_index() != 0:  # a multi-process job writes each record once
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())

    def __len__(self) -> int:
        return len(self._records)


@dataclasses.dataclass
class DecodedBatch:
    """One batch of `decode_batches`: rows `[lo, lo + size)` of the input.

    Attributes:
      lo, size: the first row's index and the number of real rows (the batch may be padded
        beyond them to keep one compiled shape).
      ids: `[B, Lp]` the left-padded prompts; `tokens`: `[B, G]` the generated tokens.
      result: the `GenerateResult` (nfe, commit steps, a trajectory when the config records one).
      seconds: wall-clock time of the `generate` call; `compiled`: whether this (config, rows,
        prompt bucket) shape was new to this process (its time includes compiling).
    """

    lo: int
    size: int
    ids: np.ndarray
    tokens: np.ndarray
    result: GenerateResult
    seconds: float
    compiled: bool


def decode_batches(model: Transformer, rows: Sequence[list[int]], config: SamplerConfig, *, batch_size: int,
                   start: int = 0, same_shape: bool = False, seed: int | None = None,
                   finished: Callable[[int, int], bool] | None = None, progress=None, stop=None,
                   policy_params=None) -> Iterator[DecodedBatch]:
    """The one resumable batched decoding loop (eval, teacher answers, Jacobi trajectories).

    Decodes the prompt ids `rows` in fixed batches `[k*B, (k+1)*B)` from row `start`, one compiled
    `generate` call each, and yields each `DecodedBatch`. The caller stores a batch before asking
    for the next: only then is `progress` (a tqdm-like bar) advanced and `stop` (a
    `jaxdllm.interrupts.StopRequest`) checked, so a stop request ends the run between stored
    batches. `finished(lo, hi)` says a batch is already stored (it is skipped);
    `same_shape` pads the last batch to `batch_size` rows; `seed` makes batch k's key
    `fold_in(PRNGKey(seed), k)` (None: `generate`'s default key for every batch);
    `policy_params` goes to `generate` (a policy's own parameters, e.g. Learn2PD's filter).
    """
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    for lo in range(start, len(rows), batch_size):
        hi = min(lo + batch_size, len(rows))
        if finished is not None and finished(lo, hi):
            if progress is not None:
                progress.update(hi - lo)
            continue
        chunk = list(rows[lo:hi])
        if same_shape:
            chunk += [chunk[0]] * (batch_size - len(chunk))  # one batch shape: one compile
        ids, mask = left_pad(chunk, pad)
        key = None if seed is None else jax.random.fold_in(jax.random.PRNGKey(seed), lo // batch_size)
        begin = time.perf_counter()
        result = generate(model, ids, config, attention_mask=mask, key=key, policy_params=policy_params)
        tokens = np.asarray(result.tokens[:, ids.shape[1]:])
        seconds = time.perf_counter() - begin
        shape = (repr(config), len(chunk), -(-ids.shape[1] // config.prompt_bucket))
        compiled, _ = shape not in _COMPILED_SHAPES, _COMPILED_SHAPES.add(shape)
        yield DecodedBatch(lo, hi - lo, ids, tokens, result, seconds, compiled)
        if progress is not None:
            progress.update(hi - lo)
        if stop is not None:
            stop.check()


def decode_rows(model: Transformer, tokenizer: Tokenizer, rows: list[list[int]], config: SamplerConfig):
    """Left-pad the prompt ids `rows` (B lists), decode them in one `generate` call.

    Returns `(responses [B] texts up to EOS, nfe [B], answer_tokens [B], seconds, compiled)`;
    `compiled` says whether this (config, rows, prompt bucket) shape was new to this process.
    """
    eos = model.config.eos_token_id
    batch = next(decode_batches(model, rows, config, batch_size=len(rows)))
    responses = [decode_response(tokenizer, row, eos) for row in batch.tokens]
    return (responses, np.asarray(batch.result.nfe), [answer_length(row, eos) for row in batch.tokens],
            batch.seconds, batch.compiled)


def run_task(model: Transformer, tokenizer: Tokenizer, task: EvalTask, items: list[EvalItem],
             config: SamplerConfig, *, key: str, store: ItemStore, batch_size: int = 100,
             progress=None, stop=None, policy_params=None) -> list[dict]:
    """Decode and score `items` (fixed batches of `batch_size`), reusing the records in `store`.

    Returns one record per item, in item order: `id`, `response`, `extracted`, `correct`, `nfe`,
    `answer_tokens`, its `batch` index, and that batch's wall-clock `batch_seconds` and whether
    it `compiled` the loop.
    `progress` is an optional tqdm-like bar advanced by the number of items done; `stop` an
    optional `jaxdllm.interrupts.StopRequest`, checked after each batch is stored;
    `policy_params` the policy's own parameters (see `decode_batches`).
    """
    if not items:
        raise ConfigError(f"task {task.name!r} has no items to evaluate")
    eos = model.config.eos_token_id
    stored = lambda lo, hi: all(store.get(key, item.id) for item in items[lo:hi])
    for batch in decode_batches(model, [task.encode(tokenizer, item) for item in items], config,
                                batch_size=batch_size, finished=stored, progress=progress, stop=stop,
                                policy_params=policy_params):
        chunk = items[batch.lo:batch.lo + batch.size]
        responses = [decode_response(tokenizer, row, eos) for row in batch.tokens]
        store.add([{"key": key, "task": task.name, "id": item.id, "response": response,
                    "extracted": task.extract(response), "correct": bool(task.score(item, response)),
                    "nfe": int(n), "answer_tokens": answer_length(row, eos), "batch": batch.lo // batch_size,
                    "batch_seconds": batch.seconds, "compiled": batch.compiled}
                   for item, response, n, row in zip(chunk, responses, batch.result.nfe, batch.tokens)])
    return [store.get(key, item.id) for item in items]


def summarize(records: Iterable[dict]) -> dict:
    """`{"n", "accuracy", "mean_nfe", "answer_tokens_per_forward", "timing": {...}}` of one task's records.

    `timing` holds what depends on the machine and the run: `tokens_per_s` (answer tokens per
    wall-clock second) and `latency_s` (seconds from a batch's submission to its answers), over
    the batches that did not compile the loop when there are such batches, else over all.
    """
    records = list(records)
    nfe = np.array([r["nfe"] for r in records], np.float64)
    answer = np.array([r["answer_tokens"] for r in records], np.float64)
    batches: dict[int, dict] = {}  # batch index -> its seconds, compile flag and answer tokens
    for r in records:
        batch = batches.setdefault(r["batch"], {"seconds": r["batch_seconds"], "compiled": r["compiled"],
                                                "tokens": 0})
        batch["tokens"] += r["answer_tokens"]
    warm = [b for b in batches.values() if not b["compiled"]] or list(batches.values())
    seconds = sum(b["seconds"] for b in warm)
    return {"n": len(records), "accuracy": float(np.mean([r["correct"] for r in records])),
            "mean_nfe": float(nfe.mean()), "answer_tokens_per_forward": float(answer.sum() / max(nfe.sum(), 1)),
            "timing": {"tokens_per_s": float(sum(b["tokens"] for b in warm) / max(seconds, 1e-9)),
                       "latency_s": float(seconds / len(warm)), "batches": len(batches),
                       "compile_batches": sum(b["compiled"] for b in batches.values())}}
