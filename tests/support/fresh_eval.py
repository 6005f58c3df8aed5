"""Held-out task evaluations of shipped checkpoints in a fresh process, as a user runs them.

The card tests decode hundreds of prompts at up to 64 forwards each: their time is the forwards
themselves, which XLA's default CPU optimisations run in about two thirds of the time the test
processes' quick-compile flags (tests/conftest.py) take. `evaluate_in_a_fresh_process` runs
`jaxdllm.train.task_accuracy.evaluate_task` for each row in one child with the command line's
environment (tests/support/cli.py: CPU, one device, no test XLA_FLAGS) and returns its results.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from support.cli import cli_env

_CHILD = textwrap.dedent("""
    import json, sys
    from jaxdllm import Tokenizer, from_pretrained, sampler_defaults
    from jaxdllm.train.task_accuracy import evaluate_task
    results, models = [], {}
    for row in json.loads(sys.stdin.read()):
        load = {"dtype": row["dtype"]} if row.get("dtype") else {}
        key = (row["model"], row.get("dtype"))
        if key not in models:
            models[key] = from_pretrained(row["model"], **load), Tokenizer.from_pretrained(row["model"])
        model, tok = models[key]
        config = sampler_defaults(row["model"], row.get("preset"), **row.get("overrides", {}))
        results.append(evaluate_task(model, tok, row["task"], config, n=row["n"]))
    print(json.dumps(results))
""")


def evaluate_in_a_fresh_process(rows: list[dict]) -> list[dict]:
    """`evaluate_task(from_pretrained(model[, dtype]), its tokenizer, task, sampler_defaults(model,
    preset, **overrides), n=n)` for each row `{"model", "task", "n"[, "dtype", "preset", "overrides"]}`
    (each checkpoint loaded once), in one child process; the results in row order."""
    rows = [{**row, "model": str(row["model"])} for row in rows]
    done = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(rows), capture_output=True, text=True,
                          env=cli_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
