"""The teacher's answers for distillation: a model answers a prompt set with `jaxdllm.generate`,
every answer is checked, and the results go to a JSONL file that training reads back.

    examples = load_prompts(section)                       # the [distill] section's prompt set
    stats = generate_answers(model, tokenizer, examples, sampler_config, "teacher.jsonl", batch_size=64)
    kept = read_answers("teacher.jsonl")                   # Examples of the correct answers

One line per prompt, in the prompt set's order: `{"index", "task", "prompt", "answer", "correct",
"nfe", "answer_tokens"}` (plus `"reference"` where the prompt has one). `answer` is the decoded
response up to EOS; `correct` is the task's checker (any valid answer of a many-answer task), or
for GSM8K-style prompts the final number (`#### n`, else the last number) against the reference;
null where nothing can check it.

With `trajectories=True` (`jaxdllm distill trajectories`) each line also holds the decoding's
states, for Jacobi Forcing and CLLM: `"prompt_ids"` (the ids the model was given), `"states"`
(the answer region from the first draft on, then after each forward but the last: `[nfe][G]`),
`"accepted"` (how many answer tokens were decided in each of those states, 0 for the first
draft) and `"fixed_point"` (the final answer region, `[G]`: greedy AR for a Jacobi teacher).

Batches are decoded in one compiled call each (the last one padded to full size, so one shape
compiles), with the PRNG key `fold_in(key(seed), batch index)`; with a model loaded on a mesh the
rows are sharded over its data axes. Each batch's lines are appended and flushed together. A run
that stops (or is killed) resumes where it stopped: the lines of complete batches are kept, a
partial batch is dropped and decoded again, and the file's settings (`<out>.meta.json`) must
match. A finished run also writes per-task statistics to `<out>.stats.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Sequence

import jax
import numpy as np

from jaxdllm.data import get_task, load_gsm8k, make_mixture
from jaxdllm.data.answers import extract_final_answer, final_number, same_number
from jaxdllm.data.jsonl import iter_jsonl_lines
from jaxdllm.data.records import Example
from jaxdllm.decoding import SamplerConfig
from jaxdllm.errors import DataError, Interrupted
from jaxdllm.interrupts import signal_number, stop_between_batches
from jaxdllm.tokenizer import Tokenizer, answer_length, decode_response
from jaxdllm.eval.runner import decode_batches

META_SUFFIX = ".meta.json"
STATS_SUFFIX = ".stats.json"


def read_prompt_files(files: Sequence[str | os.PathLike], prompt_keys: Sequence[str] = ("prompt",),
                      answer_keys: Sequence[str] = ("answer",)) -> list[Example]:
    """Prompts from JSONL files, in order: each line's first present `prompt_keys` field is the
    prompt, its first present `answer_keys` field (optional) the reference answer, `task` its task.
    A line without a prompt is an error naming the file and line."""
    out = []
    for path in files:
        for number, line in iter_jsonl_lines(path):
            try:
                record = json.loads(line)
            except ValueError as e:
                raise DataError(f"{path}:{number}: invalid JSON ({e})") from None
            prompt = next((record[k] for k in prompt_keys if isinstance(record, dict) and k in record), None)
            if not isinstance(prompt, str):
                raise DataError(f"{path}:{number}: no string field among {list(prompt_keys)} to use as the prompt")
            answer = next((record[k] for k in answer_keys if k in record), None)
            task = record.get("task", "")
            out.append(Example(prompt, "", task if isinstance(task, str) else "",
                               None if answer is None else str(answer)))
    return out


def load_prompts(section) -> list[Example]:
    """The prompt set a `[distill]` section names (`jaxdllm.train.config.DistillSection`)."""
    if section.source == "tasks":
        return make_mixture(section.tasks, section.examples_per_task, section.seed, split=section.split)
    if section.source == "gsm8k":
        return load_gsm8k(split=section.split, path=section.path, limit=section.limit)
    records = read_prompt_files(section.files, section.prompt_keys, section.answer_keys)
    return records[:section.limit] if section.limit else records


def check_answer(example: Example, response: str) -> bool | None:
    """Whether `response` answers `example`: its task's checker when the task is registered, else
    its final answer (`final_answer_text`) against the reference `example.answer` (itself a bare
    answer or a worked solution); None when neither applies."""
    try:
        task = get_task(example.task) if example.task else None
    except Exception:  # a dataset name (gsm8k, a user's JSONL), not a registered task
        task = None
    if task is not None:
        try:
            return bool(task.check(example.prompt, response))
        except ValueError:  # a prompt the task did not write
            return None
    if example.answer is None:
        return None
    mine, reference = final_answer_text(response), final_answer_text(example.answer, reference=True)
    if mine is None or reference is None:
        return False
    return same_number(mine, reference) or _normalised(mine) == _normalised(reference)


def final_answer_text(text: str, reference: bool = False) -> str | None:
    """The final answer a solution states: the last `\\boxed{...}` (MATH style), else the number
    after `####`, else (for a `reference` answer of one short line, e.g. `\\frac{1}{2}`) the whole
    text, else the last number (`jaxdllm.data.answers.final_number`)."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    marked = extract_final_answer(text)
    if marked is not None:
        return marked
    if reference and "\n" not in text.strip() and 0 < len(text.strip()) <= 32:
        return text.strip()
    return final_number(text)


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed{") - 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def _normalised(answer: str) -> str:
    return answer.replace(" ", "").replace("$", "").rstrip(".").lower()


def _sampler_settings(config: SamplerConfig) -> dict:
    """A JSON-able description of a `SamplerConfig` (its loop settings, policy and cache)."""
    out = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
           if f.name not in ("policy", "cache")}
    for part in ("policy", "cache"):
        piece = getattr(config, part)
        out[part] = {"name": piece.name, **dataclasses.asdict(piece)}
    return out


def _complete_lines(path: Path) -> list[tuple[int, dict]]:
    """`(end byte offset, record)` of every complete, parseable line of `path`, in order; stops at
    the first partial or unreadable line (what a killed run may leave at the end)."""
    out, offset = [], 0
    data = path.read_bytes()
    while True:
        end = data.find(b"\n", offset)
        if end < 0:
            break
        try:
            record = json.loads(data[offset:end])
        except ValueError:
            break
        if not isinstance(record, dict):
            break
        offset = end + 1
        out.append((offset, record))
    return out


def _resume_point(out: Path, meta: dict, examples: Sequence[Example], batch_size: int) -> int:
    """How many prompts `out` already answers (a multiple of `batch_size`); truncates the rest."""
    meta_path = out.with_name(out.name + META_SUFFIX)
    if not out.exists():
        meta_path.write_text(json.dumps(meta, indent=1))
        return 0
    if not meta_path.is_file():
        raise DataError(f"{out} exists but {meta_path.name} does not: it was not written by "
                        "`jaxdllm distill generate`; choose another [distill] out or remove the file")
    saved = json.loads(meta_path.read_text())
    diff = sorted(k for k in set(saved) | set(meta) if saved.get(k) != meta.get(k))
    if diff:
        raise DataError(f"{out} was written with other settings ({', '.join(diff)} differ); choose another "
                        "[distill] out, or delete it and its .meta.json to start again")
    lines = _complete_lines(out)
    done = min(len(lines) // batch_size * batch_size, len(examples))
    for i, (_, record) in enumerate(lines[:done]):
        if record.get("prompt") != examples[i].prompt:
            raise DataError(f"{out}: line {i + 1} answers {record.get('prompt')!r}, but prompt {i + 1} of this "
                            f"prompt set is {examples[i].prompt!r}; choose another [distill] out")
    with out.open("r+b") as f:
        f.truncate(lines[done - 1][0] if done else 0)
    return done


def encode_prompt(tokenizer: Tokenizer, prompt: str, chat_template: bool) -> list[int]:
    """A prompt's ids as the teacher sees them: the tokenizer's chat template, or plain `encode`."""
    if chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True)
    return tokenizer.encode(prompt)


def generate_answers(model, tokenizer: Tokenizer, examples: Sequence[Example], config: SamplerConfig,
                     out: str | os.PathLike, *, batch_size: int = 64, seed: int = 0, chat_template: bool = False,
                     progress: bool = True, meta: dict | None = None, trajectories: bool = False) -> dict:
    """Answer every prompt of `examples` with `model` and write the checked answers to `out`.

    Args:
      model: the teacher `Transformer` (on one device, or loaded on a mesh: rows are sharded).
      tokenizer: its tokenizer.
      examples: the prompt set (`Example.prompt`; `task` and `answer` for checking).
      config: the teacher's `SamplerConfig`.
      out: the JSONL file (appended to; a previous run with the same settings is resumed).
      batch_size: prompts per compiled call.
      seed: the sampling key of batch b is `fold_in(PRNGKey(seed), b)`.
      chat_template: wrap each prompt in the tokenizer's chat template.
      progress: show a progress bar (answers/s and the share kept).
      meta: extra settings recorded in `<out>.meta.json` (a resumed run must match them).
      trajectories: also record every intermediate state (see the module docstring).

    Returns:
      The statistics of the whole file, also written to `<out>.stats.json`: per task and overall,
      `{"n", "kept", "kept_rate", "mean_nfe", "answer_tokens_per_forward"}`, plus `"seconds"` and
      `"answers_per_s"` of this run.
    """
    if not examples:
        raise DataError("the prompt set is empty: nothing for the teacher to answer")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if trajectories:  # a slot for every forward the loop may take
        config = config.replace(max_trajectory=config.canvas.max_steps(config))
    meta = {"prompts": len(examples), "batch_size": batch_size, "seed": seed, "chat_template": chat_template,
            "sampler": _sampler_settings(config), **(meta or {})}
    meta = json.loads(json.dumps(meta))  # what the file holds (tuples as lists)
    done = _resume_point(out, meta, examples, batch_size)
    bar = None
    if progress and jax.process_index() == 0:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(examples), initial=done, unit="answer", desc="teacher", dynamic_ncols=True)
    start = time.perf_counter()
    try:
        with stop_between_batches() as stop:  # Ctrl-C or SIGTERM: after the batch in progress
            answered, kept = _answer_batches(model, tokenizer, examples, config, out, done, batch_size=batch_size,
                                             seed=seed, chat_template=chat_template, trajectories=trajectories,
                                             bar=bar, stop=stop)
    except KeyboardInterrupt as e:  # the lines of every finished batch are in `out`
        raise Interrupted(signal_number(e), f"{len(_complete_lines(out))} answers kept in {out}") from None
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - start
    stats = answer_statistics(out)
    stats.update(seconds=seconds, answers_per_s=answered / seconds if seconds > 0 else None)
    if jax.process_index() == 0:
        out.with_name(out.name + STATS_SUFFIX).write_text(json.dumps(stats, indent=1))
    return stats


def _answer_batches(model, tokenizer: Tokenizer, examples: Sequence[Example], config: SamplerConfig, out: Path,
                    done: int, *, batch_size: int, seed: int, chat_template: bool, trajectories: bool,
                    bar, stop) -> tuple[int, int]:
    """Answer `examples[done:]` batch by batch (`jaxdllm.eval.runner.decode_batches`), appending
    each batch's records to `out`; returns `(answered, kept)` of this call."""
    eos = model.config.eos_token_id
    kept = answered = 0
    rows = [encode_prompt(tokenizer, e.prompt, chat_template) for e in examples]
    for batch in decode_batches(model, rows, config, batch_size=batch_size, start=done, same_shape=True, seed=seed,
                                progress=bar, stop=stop):
        lines = []
        for i, example in enumerate(examples[batch.lo:batch.lo + batch.size]):
            response = decode_response(tokenizer, batch.tokens[i], eos)
            correct = check_answer(example, response)
            record = {"index": batch.lo + i, "task": example.task, "prompt": example.prompt, "answer": response,
                      "correct": correct, "nfe": int(batch.result.nfe[i]),
                      "answer_tokens": answer_length(batch.tokens[i], eos)}
            if example.answer is not None:
                record["reference"] = example.answer
            if trajectories:
                record.update(_states(batch.result, i, batch.ids.shape[1], rows[batch.lo + i]))
            lines.append(json.dumps(record, ensure_ascii=False) + "\n")
            kept += correct is True
        answered += batch.size
        if jax.process_index() == 0:
            with out.open("a", encoding="utf-8") as f:
                f.write("".join(lines))
                f.flush()
                os.fsync(f.fileno())
        if bar is not None:
            bar.set_postfix(kept=f"{kept / answered:.1%}", refresh=False)
    return answered, kept


def _states(result, row: int, width: int, prompt_ids: list[int]) -> dict:
    """Row `row`'s recorded states (answer region only) from a `GenerateResult` with a trajectory."""
    nfe = int(result.nfe[row])
    states = np.concatenate([result.initial[row, None, width:], result.trajectory[row, :nfe - 1, width:]])
    decided_at = result.commit_step[row, width:]
    accepted = [int((decided_at <= k).sum()) for k in range(nfe)]
    return {"prompt_ids": [int(t) for t in prompt_ids], "states": states.tolist(), "accepted": accepted,
            "fixed_point": result.tokens[row, width:].tolist()}


def _records(path: str | os.PathLike) -> list[dict]:
    out = []
    for number, line in iter_jsonl_lines(path):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) \
                    or not isinstance(record.get("answer"), str):
                raise DataError("expected an object with string fields 'prompt' and 'answer'")
        except ValueError as e:
            raise DataError(f"{path}:{number}: not a teacher answer ({e})") from None
        out.append(record)
    return out


def answer_statistics(path: str | os.PathLike) -> dict:
    """Per task and overall (`"all"`): answers, how many are correct (kept), the kept rate, the
    mean NFE and the answer tokens per forward of the teacher, from a teacher JSONL file."""
    records = _records(path)
    groups: dict[str, list[dict]] = {}
    for record in records:
        groups.setdefault(record.get("task") or "", []).append(record)
    groups["all"] = records
    stats = {}
    for task, records in groups.items():
        kept = sum(r.get("correct") is True for r in records)
        nfe = sum(r.get("nfe", 0) for r in records)
        stats[task] = {"n": len(records), "kept": kept, "kept_rate": kept / len(records),
                       "mean_nfe": nfe / len(records),
                       "answer_tokens_per_forward": sum(r.get("answer_tokens", 0) for r in records) / max(nfe, 1)}
    return {"tasks": stats}


def read_answers(path: str | os.PathLike, keep: str = "correct") -> list[Example]:
    """The teacher's answers in `path` as training `Example`s (`response` = the answer):
    only the correct ones (`keep="correct"`), or all of them (`keep="all"`)."""
    records = _records(path)
    examples = [Example(r["prompt"], r["answer"], r.get("task") or "", r.get("reference"))
                for r in records if keep == "all" or r.get("correct") is True]
    if not examples:
        raise DataError(f"{path}: none of its {len(records)} teacher answers is correct; nothing to train on "
                        "(set [data] keep = \"all\" to train on unchecked answers)")
    return examples
