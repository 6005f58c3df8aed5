"""Task-suite evaluation of a model during and after training (the model cards' tables).

`evaluate_task(model, tokenizer, task, sampler_config)` returns the accuracy of one suite task on
its held-out prompts (the task's own checker: any valid answer counts for many-answer tasks), the
mean NFE per example and the answer tokens per forward. It is `jaxdllm.eval` without a results
folder; `jaxdllm eval` adds sweeps, GSM8K, resuming and the Pareto plot.
"""

from __future__ import annotations

import time

from jaxdllm.data import get_task
from jaxdllm.decoding import SamplerConfig
from jaxdllm.eval.runner import ItemStore, left_pad, run_task, setting_key, summarize
from jaxdllm.eval.tasks import SuiteEvalTask
from jaxdllm.models.transformer import Transformer
from jaxdllm.tokenizer import Tokenizer

__all__ = ["evaluate_task", "evaluate_tasks", "left_pad"]


def evaluate_task(model: Transformer, tokenizer: Tokenizer, task: str, config: SamplerConfig, *,
                  n: int = 200, seed: int = 1234, batch_size: int = 100) -> dict:
    """Accuracy and NFE of one task on `n` held-out (`split="test"`) examples.

    Returns `{"task", "many_answers", "n", "accuracy", "mean_nfe", "answer_tokens_per_forward",
    "seconds", "samples"}` (`samples`: the first three prompts with their responses).
    """
    adapter = SuiteEvalTask(task)
    items = adapter.items(n, seed)
    start = time.perf_counter()
    records = run_task(model, tokenizer, adapter, items, config, key=setting_key("", config, adapter),
                       store=ItemStore(None), batch_size=batch_size)
    row = summarize(records)
    samples = [{"prompt": item.prompt, "response": r["response"], "correct": r["correct"]}
               for item, r in zip(items[:3], records)]
    return {"task": task, "many_answers": get_task(task).many_answers, "n": row["n"],
            "accuracy": row["accuracy"], "mean_nfe": row["mean_nfe"],
            "answer_tokens_per_forward": row["answer_tokens_per_forward"],
            "seconds": time.perf_counter() - start, "samples": samples}


def evaluate_tasks(model: Transformer, tokenizer: Tokenizer, tasks, config: SamplerConfig, **kw) -> list[dict]:
    """`evaluate_task` for every task name in `tasks`."""
    return [evaluate_task(model, tokenizer, task, config, **kw) for task in tasks]
