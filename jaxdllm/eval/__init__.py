"""Evaluation: task adapters, resumable batched decoding, sweeps and Pareto plots, lm-eval.

- `tasks`: `EvalTask` adapters (the synthetic suite, GSM8K, the ParallelBench-style group) and
  `resolve_tasks`.
- `runner`: `run_task` (fixed batches through `jaxdllm.generate`, one JSON line per item,
  resumable) and `summarize`.
- `evaluate`: `sampler_settings` (presets, overrides, sweeps), `checkpoint_samplers` (a
  checkpoint's own settings, or its card's table), `evaluate` (JSON + Pareto PNG).
- `harness`: jaxdllm as an lm-evaluation-harness model (`pip install -e ".[eval]"`), with local
  task configs in `lm_eval_tasks/`.
"""

from jaxdllm.eval.evaluate import checkpoint_samplers, evaluate, plot_pareto, sampler_settings, without_timing
from jaxdllm.eval.runner import ItemStore, decode_rows, left_pad, run_task, summarize
from jaxdllm.eval.tasks import EvalItem, EvalTask, Gsm8kEvalTask, SuiteEvalTask, resolve_tasks

__all__ = ["EvalItem", "EvalTask", "Gsm8kEvalTask", "ItemStore", "SuiteEvalTask", "checkpoint_samplers", "decode_rows",
           "evaluate", "left_pad", "plot_pareto", "resolve_tasks", "run_task", "sampler_settings", "summarize",
           "without_timing"]
