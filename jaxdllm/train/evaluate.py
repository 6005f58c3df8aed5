"""Task-suite evaluation: decode held-out prompts with `jaxdllm.generate`, check each answer.

`evaluate_tasks(model, tokenizer, tasks, sampler_config)` returns per task the accuracy (the
task's own checker: any valid answer counts for many-answer tasks), the mean NFE per example
and the mean number of generated answer tokens per forward.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from jaxdllm.data import get_task, make_split
from jaxdllm.decoding import SamplerConfig, generate
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


def evaluate_task(model: Transformer, tokenizer: Tokenizer, task: str, config: SamplerConfig, *,
                  n: int = 200, seed: int = 1234, batch_size: int = 100) -> dict:
    """Accuracy and NFE of one task on `n` held-out (`split="test"`) examples."""
    examples = make_split(task, n, seed, split="test")
    checker = get_task(task)
    eos = model.config.eos_token_id
    correct, nfe, answer_tokens, samples = 0, [], [], []
    start = time.perf_counter()
    for lo in range(0, len(examples), batch_size):
        chunk = examples[lo:lo + batch_size]
        ids, mask = left_pad([tokenizer.encode(e.prompt) for e in chunk], model.config.pad_token_id or 0)
        result = generate(model, ids, config, attention_mask=mask)
        for example, row, row_nfe in zip(chunk, result.tokens[:, ids.shape[1]:], result.nfe):
            response = decode_response(tokenizer, row, eos)
            ok = checker.check(example.prompt, response)
            correct += ok
            nfe.append(int(row_nfe))
            answer_tokens.append(answer_length(row, eos))
            if len(samples) < 3:
                samples.append({"prompt": example.prompt, "response": response, "correct": bool(ok)})
    return {"task": task, "many_answers": checker.many_answers, "n": len(examples),
            "accuracy": correct / len(examples), "mean_nfe": float(np.mean(nfe)),
            "answer_tokens_per_forward": float(np.sum(answer_tokens) / max(np.sum(nfe), 1)),
            "seconds": time.perf_counter() - start, "samples": samples}


def evaluate_tasks(model: Transformer, tokenizer: Tokenizer, tasks, config: SamplerConfig, **kw) -> list[dict]:
    """`evaluate_task` for every task name in `tasks`."""
    return [evaluate_task(model, tokenizer, task, config, **kw) for task in tasks]


def main(argv=None) -> int:
    """`python -m jaxdllm.train.evaluate ...`: the same as `jaxdllm eval ...`."""
    from jaxdllm.cli import main as cli_main

    return cli_main(["eval", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
