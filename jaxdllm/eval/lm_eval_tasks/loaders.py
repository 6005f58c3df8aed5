"""Datasets and scoring for jaxdllm's offline lm-eval tasks (referenced from the YAML files).

The items are those `jaxdllm eval` decodes: the suite task's held-out draw (`n`, `seed` from the
task's `metadata`, overridable with lm-eval's `--metadata '{"n": 50}'`), and GSM8K's test split
from `gsm8k_dir` (metadata), else `$JAXDLLM_GSM8K_DIR`, else the copy shipped with jaxdllm.
"""

from __future__ import annotations

import datasets

from jaxdllm.data import get_task
from jaxdllm.data.gsm8k import load_fewshot, load_gsm8k
from jaxdllm.eval.tasks import SuiteEvalTask, gsm8k_correct


def suite_dataset(task_name: str, n: int = 200, seed: int = 1234, **_) -> datasets.DatasetDict:
    """`{"test": [{"task", "prompt", "answer"}]}`: the held-out items of suite task `task_name`."""
    items = SuiteEvalTask(task_name).items(int(n), int(seed))
    rows = [{"task": task_name, "prompt": i.prompt, "answer": i.reference or ""} for i in items]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def suite_process_results(doc: dict, results: list[str]) -> dict:
    """Accuracy by the task's own checker (any valid answer counts)."""
    return {"acc": float(get_task(doc["task"]).check(doc["prompt"], results[0]))}


def gsm8k_dataset(gsm8k_dir: str | None = None, n: int | None = None, **_) -> datasets.DatasetDict:
    """GSM8K's test split (first `n` problems, or all) and up to 8 train problems for few-shot."""
    rows = lambda examples: [{"question": e.prompt, "answer": e.response, "final": e.answer} for e in examples]
    test = load_gsm8k("test", gsm8k_dir or None, limit=None if n is None else int(n))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows(test)),
                                 "train": datasets.Dataset.from_list(rows(load_fewshot(8, gsm8k_dir or None)))})


def gsm8k_process_results(doc: dict, results: list[str]) -> dict:
    """`acc`: the response's answer (`jaxdllm.eval.tasks.gsm8k_answer`) equals the reference."""
    return {"acc": float(gsm8k_correct(results[0], doc["final"]))}
