"""Held-out accuracy on the `parts` task of a model decoding greedily, one token per forward, under
Multiverse Attention (`jaxdllm.attention.multiverse`): each step recomputes the mask and the published
position ids from the tokens so far, so a Multiverse model decodes its own format sequentially exactly as
it was trained, and on tag-free text the same decoder is plain causal greedy decoding.

    python -m sampling.benchmarks.multiverse_parts_eval checkpoints/tasks-qwen2-small-multiverse \
        runs/parts-sequential/model --prompts 200 --out sampling/results/multiverse_parts_cpu.json

In the Multiverse format the decoder writes the tokens a fork/merge decoder supplies (and the `multiverse`
objective does not score): each path's number after `<Path>` (`<Path>{i}:`), as the published engine does
when it forks a child per outline, and the token after each `</Path>`: `<Path>` while the block has
outlines left, else `<Conclusion>` (the merge). Every other token is the model's.

Held-out prompts are drawn with their own seed and exclude every prompt of the training curriculum
(`curriculum(task, examples_per_task, seed)`). Reported per model: accuracy (`PartsTask.check`: every
part's steps and the combination), the final-answer accuracy, which format it wrote, and the mean
response length and Multiverse chain length; `part_accuracy` (the fraction of parts whose steps are right)
and how often the combination is the first digits of the model's own part results (the longest chain: outside the paths + the longest path).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdllm.attention.multiverse import multiverse_attention
from jaxdllm.checkpoint import from_pretrained
from jaxdllm.data.multiverse_tags import TAG_IDS, strip_tags
from jaxdllm.data.parts_task import PartsTask, curriculum
from jaxdllm.tokenizer import Tokenizer


def greedy_decode(model, prompts: list[list[int]], gen: int, eos: int, pad: int,
                  path_prefix: tuple[np.ndarray, int] | None = None) -> np.ndarray:
    """`[B, gen]` greedy tokens after each prompt (PAD after EOS), one full forward per token.

    `path_prefix = (digit ids [10], colon id)`: after `<Path>`, the decoder writes the path's number and
    `:` itself (`<Path>{i}:`, i = paths so far in the block), as the published engine starts each forked
    child with `"<Path>\n{i}:"`; after `</Path>` it writes `<Path>` while the block has fewer paths than
    `<Outline>`s, else `<Conclusion>` (the merge). Under Multiverse Attention a path never sees its
    siblings, so neither its own number nor whether it was the last is the model's to predict."""
    lens = np.array([len(p) for p in prompts])
    width = int(lens.max()) + gen
    canvas = np.full((len(prompts), width), pad, np.int32)
    for r, p in enumerate(prompts):
        canvas[r, :len(p)] = p
    graphdef, state = nnx.split(model)
    tags = tuple(TAG_IDS.values())

    digits, colon = (np.zeros(10, np.int32), -1) if path_prefix is None else path_prefix
    digits = jnp.asarray(digits, jnp.int32)

    @jax.jit
    def run(canvas, cur):
        def step(_, carry):
            canvas, cur, done, pending, closed, npath, nout = carry
            mask, positions = multiverse_attention(canvas, tags)
            logits = nnx.merge(graphdef, state)(canvas, positions, mask).logits
            nxt = jnp.argmax(jnp.take_along_axis(logits, (cur - 1)[:, None, None], 1)[:, 0], -1).astype(jnp.int32)
            after_path = jnp.where(npath < nout, TAG_IDS["<Path>"], TAG_IDS["<Conclusion>"])
            nxt = jnp.where(pending == 2, digits[jnp.clip(npath, 0, 9)], jnp.where(pending == 1, colon, nxt))
            nxt = jnp.where(closed, after_path, nxt)
            nxt = jnp.where(done, pad, nxt)
            forced = pending > 0
            opened = nxt == TAG_IDS["<Parallel>"]
            npath = jnp.where(opened, 0, npath)
            nout = jnp.where(opened, 0, nout) + (nxt == TAG_IDS["<Outline>"]).astype(jnp.int32)
            opens = ~forced & (nxt == TAG_IDS["<Path>"]) & (path_prefix is not None)
            npath = npath + opens.astype(jnp.int32)
            pending = jnp.where(opens, 2, jnp.maximum(pending - 1, 0))
            closed = (nxt == TAG_IDS["</Path>"]) & (path_prefix is not None)
            canvas = jax.vmap(lambda row, i, t: row.at[i].set(t))(canvas, cur, nxt)
            return canvas, cur + 1, done | (nxt == eos), pending, closed, npath, nout
        zeros, no = jnp.zeros(cur.shape, jnp.int32), jnp.zeros(cur.shape, bool)
        canvas = jax.lax.fori_loop(0, gen, step, (canvas, cur, no, zeros, no, zeros, zeros))[0]
        return canvas

    out = np.asarray(run(jnp.asarray(canvas), jnp.asarray(lens, jnp.int32)))
    return np.stack([out[r, lens[r]:lens[r] + gen] for r in range(len(prompts))])


TRAIN_INSTANCES = 4800  # `[data] examples_per_task` of training/multiverse_parts_cpu.toml and its baseline


def held_out_prompts(task: PartsTask, count: int, train_instances: int, train_seed: int, seed: int) -> list[str]:
    seen = {e.prompt for e in curriculum(task, train_instances, train_seed)}
    rng = np.random.default_rng([seed, 99])
    out = []
    while len(out) < count:
        p = task.draw_prompt(rng)
        if p not in seen and p not in out:
            out.append(p)
    return out


def evaluate(path: str, prompts: list[str], task: PartsTask, gen: int, batch: int) -> dict:
    model = from_pretrained(path, attention_impl="xla")
    tok = Tokenizer.from_pretrained(path)
    eos, pad, bos = model.config.eos_token_id, model.config.pad_token_id, model.config.bos_token_id
    prefix = None
    if tok.token_to_id("<Path>") is not None:
        prefix = (np.array([tok.token_to_id(str(d)) for d in range(10)], np.int32), tok.token_to_id(":"))
    start = time.perf_counter()
    texts = []
    for i in range(0, len(prompts), batch):
        chunk = [[bos] + tok.encode(p, add_special_tokens=False) for p in prompts[i:i + batch]]
        for row in greedy_decode(model, chunk, gen, eos, pad, prefix):
            ids = [int(t) for t in row]
            ids = ids[:ids.index(eos)] if eos in ids else ids
            texts.append(tok.decode(ids, skip_special_tokens=True))
    seconds = time.perf_counter() - start
    fmt = ["multiverse" if "<Parallel>" in t else "sequential" if "<" not in t else "other" for t in texts]
    correct = [task.check(p, t) for p, t in zip(prompts, texts)]
    final = [task.final_answer(p, t) == task.answer(p) for p, t in zip(prompts, texts)]
    parts_right, parts_total = 0, 0
    for p, t in zip(prompts, texts):
        want = task.part_steps(p)
        got = (re.findall(r"<Path>\d+:(.*?)</Path>", t) if "<Path>" in t else t.split("=")[0].split(";"))
        parts_right += sum(a == b for a, b in zip(got, want))
        parts_total += len(want)
    combination = [task.final_answer(p, t) == "".join(x.split(":")[-1][:1] for x in (
        re.findall(r"<Path>\d+:(.*?)</Path>", t) if "<Path>" in t else t.split("=")[0].split(";")[:-1]))
        for p, t in zip(prompts, texts)]
    n_tok = lambda t: len(strip_tags(t)) + (t.count("<") if "<" in t else 0) + 1
    mv = [t for t, f in zip(texts, fmt) if f == "multiverse"]
    return {"model": path, "prompts": len(prompts), "accuracy": float(np.mean(correct)),
            "final_answer_accuracy": float(np.mean(final)),
            "part_accuracy": parts_right / parts_total,
            "combination_consistent_with_own_parts": float(np.mean(combination)),
            "formats": {f: fmt.count(f) for f in sorted(set(fmt))},
            "mean_response_tokens": float(np.mean([n_tok(t) for t in texts])),
            "mean_multiverse_chain_tokens": float(np.mean([task.multiverse_chain_length(t) for t in mv])) if mv else None,
            "decode_seconds": round(seconds, 1), "examples": [{"prompt": p, "response": t, "correct": c}
                                                               for p, t, c in list(zip(prompts, texts, correct))[:5]]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--train-instances", type=int, default=TRAIN_INSTANCES)
    parser.add_argument("--train-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gen", type=int, default=136)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    task = PartsTask()
    prompts = held_out_prompts(task, args.prompts, args.train_instances, args.train_seed, args.seed)
    results = [evaluate(m, prompts, task, args.gen, args.batch) for m in args.models]
    decoder = ("greedy, one token per forward, Multiverse mask and positions; <Path>{i}: numbers, and <Path> or "
               "<Conclusion> after </Path>, written by the decoder (tag tokenizers only)")
    report = {"task": "parts", "decoder": decoder,
              "held_out_seed": args.seed, "results": results}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
