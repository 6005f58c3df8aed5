"""An any-order XLNet checkpoint (`checkpoints/tasks-xlnet-small`) queried under ASSD's orders, greedy,
without a sampler: what its conditionals get right on held-out task prompts (JSON).

    python -m sampling.benchmarks.xlnet_orders_eval --model checkpoints/tasks-xlnet-small \\
        --out checkpoints/tasks-xlnet-small/orders_eval.json

Each row is `[pad .. BOS prompt | G answer slots]` (left padding, blocked for every query, keeps the
prompt-to-answer distances of training). Three queries, each through `XLNetLM.two_stream` with the
permutation mask of sigma = [visible ascending | masked ascending] (`order_perm_mask`):

* `left_to_right`: every answer slot masked; one forward per slot, the first masked slot predicted
  (argmax) and written, the order fixed: the sequential sampler ASSD's drafts are verified against
  (G forwards).
* `one_forward`: every slot predicted at once from the prompt alone (every masked column blocked for
  every target): ASSD's draft of its first step with k = G (1 forward). The joint objective never
  trains these conditionals; they rely on generalisation.
* `infill`: the reference answer (and its EOS fill) written in, its middle third hidden, prefix and
  suffix visible; the middle filled left to right (one forward per hidden token). Scored by the task's
  checker on the whole filled answer.

Accuracy uses each task's checker (any valid answer counts for perm and pick3).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxdllm
from jaxdllm.data import get_task, make_split
from jaxdllm.models.families.xlnet import order_perm_mask

TASKS = ("copy", "reverse", "sort", "add", "perm", "pick3")


def layout(tokenizer, prompts: list[str], gen: int, bos: int, pad: int) -> tuple[np.ndarray, np.ndarray, int]:
    """`(canvas [B, W + gen], real [B, W + gen], W)`: each prompt as `BOS prompt`, right-aligned in W columns."""
    encoded = [[bos, *tokenizer.encode(p, add_special_tokens=False)] for p in prompts]
    width = max(len(e) for e in encoded)
    canvas = np.full((len(prompts), width + gen), pad, np.int32)
    real = np.zeros(canvas.shape, bool)
    for r, e in enumerate(encoded):
        canvas[r, width - len(e):width] = e
        real[r, width - len(e):] = True
    return canvas, real, width


def decode_answers(tokenizer, canvas: np.ndarray, start: int, eos: int) -> list[str]:
    """The text of each row's answer slots up to its first EOS."""
    out = []
    for row in canvas[:, start:]:
        ids = row.tolist()
        out.append(tokenizer.decode(ids[:ids.index(eos)] if eos in ids else ids).strip())
    return out


def evaluate(model, tokenizer, task_name: str, n: int, gen: int, seed: int) -> dict:
    """Accuracy of the three queries on `n` held-out prompts of one task."""
    c = model.config
    task = get_task(task_name)
    examples = make_split(task_name, n, seed, split="test")
    prompts = [e.prompt for e in examples]
    canvas, real, width = layout(tokenizer, prompts, gen, c.bos_token_id, c.pad_token_id)
    graphdef, state = nnx.split(model)

    @functools.partial(jax.jit, static_argnames="draft")
    def predict(state, canvas, masked, real, targets, draft=False):
        perm = order_perm_mask(masked, real)
        if draft:  # ASSD's draft: no target sees any masked column, only the visible ones
            perm = perm | masked[:, None, :]
        logits = nnx.merge(graphdef, state).two_stream(canvas, perm, targets)
        logits = logits.at[..., c.mask_token_id].set(-jnp.inf)  # the mask is never an answer
        return jnp.argmax(logits, -1).astype(jnp.int32)

    answer = np.zeros(canvas.shape, bool)
    answer[:, width:] = True
    columns = np.arange(canvas.shape[1])

    def fill(start_canvas, masked):
        """Greedy left to right over each row's masked columns, the order fixed; returns the canvas."""
        canvas = np.where(masked, c.mask_token_id, start_canvas).astype(np.int32)
        remaining = masked.copy()
        while remaining.any():
            target = np.where(remaining, columns, canvas.shape[1]).argmin(1)
            pick = np.asarray(predict(state, canvas, masked, real, target[:, None].astype(np.int32)))[:, 0]
            rows = remaining.any(1)
            canvas[rows, target[rows]] = pick[rows]
            remaining[rows, target[rows]] = False
        return canvas

    score = lambda answers: float(np.mean([task.check(p, a) for p, a in zip(prompts, answers)]))  # noqa: E731
    left = fill(canvas, answer)
    targets = np.broadcast_to(np.arange(width, width + gen, dtype=np.int32), (len(prompts), gen))
    canvas_once = np.where(answer, c.mask_token_id, canvas).astype(np.int32)
    once = canvas_once.copy()
    once[:, width:] = np.asarray(predict(state, canvas_once, answer, real, np.ascontiguousarray(targets),
                                            draft=True))

    # infilling: the reference answer and its EOS fill written in, the middle third of the answer hidden
    reference = canvas.copy()
    middle = np.zeros(canvas.shape, bool)
    for r, e in enumerate(examples):
        ids = tokenizer.encode(e.response, add_special_tokens=False)[:gen]
        reference[r, width:] = c.eos_token_id
        reference[r, width:width + len(ids)] = ids
        middle[r, width + len(ids) // 3:width + len(ids) - len(ids) // 3] = True
    infilled = fill(reference, middle)
    return {"n": n, "left_to_right": score(decode_answers(tokenizer, left, width, c.eos_token_id)),
            "one_forward": score(decode_answers(tokenizer, once, width, c.eos_token_id)),
            "infill": score(decode_answers(tokenizer, infilled, width, c.eos_token_id)),
            "infill_hidden_tokens": float(middle.sum(1).mean()),
            "samples": [{"prompt": p, "left_to_right": a} for p, a in
                        zip(prompts[:3], decode_answers(tokenizer, left[:3], width, c.eos_token_id))]}


def main(argv=None) -> dict:
    """Run the three queries on every task; write and return the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="checkpoints/tasks-xlnet-small")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--n", type=int, default=200, help="held-out prompts per task")
    parser.add_argument("--gen-length", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    model = jaxdllm.from_pretrained(args.model)
    tokenizer = jaxdllm.Tokenizer.from_pretrained(args.model)
    start = time.perf_counter()
    results = {name: evaluate(model, tokenizer, name, args.n, args.gen_length, args.seed)
               for name in args.tasks.split(",")}
    report = {"model": args.model, "gen_length": args.gen_length, "split": "test", "seed": args.seed,
              "seconds": time.perf_counter() - start, "tasks": results}
    for name, r in results.items():
        print(f"{name:8s} left-to-right {r['left_to_right']:.3f}  one forward {r['one_forward']:.3f}  "
              f"infill {r['infill']:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
