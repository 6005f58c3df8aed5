"""Any-subset speculative decoding (ASSD) against sequential decoding of the same any-order model, on the
same held-out prompts, in one process (JSON + PNG).

The model is the shipped any-order XLNet (`checkpoints/tasks-xlnet-small`). Two layouts per task group
(`suite`: the card tasks copy, reverse, sort, perm, pick3; `long`: copy, reverse and sort of 10-16 digits):

* `generate`: the prompt, then the answer decoded left to right (the published order: visible first,
  then the masked positions in column order); tokens counted up to and including EOS.
* `infill`: the prompt with the reference response written in and its middle half hidden
  (`prefix <mask>... suffix <eos>`, a quarter of the response visible on each side, rounded down); the
  masked middle is decoded left to right, the row stops once it is filled; tokens counted: the hidden
  positions (up to and including an EOS filled among them, which ends the row).

Samplers (all on the ASSD canvas; `drafts=1` is sequential decoding under the same order, one forward per
token): `seq` (drafts 1, T 1), `assd` (the preset: 5 drafts, T 1), `seq-greedy` (drafts 1, T 0),
`assd-greedy` (5 drafts, T 0). ASSD at T 1 samples the sequential sampler's distribution and at T 0
gives its tokens (`exact_vs_sequential`: the share of rows whose tokens equal `seq-greedy`'s). For each:
accuracy (the task's checker on the answer, or on the filled response), tokens per forward, tokens/s
at batch 1 (one prompt per task) and batch 8 (calls of 8), compiled beforehand.

    python -m sampling.benchmarks.benchmark_assd --out sampling/results/assd_cpu
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import jaxdllm
from jaxdllm.data import get_task, make_mixture
from jaxdllm.decoding import SamplerConfig
from jaxdllm.eval.runner import left_pad
from jaxdllm.extras import exit_if_missing
from jaxdllm.tokenizer import Tokenizer, decode_response
from sampling.benchmarks.report import write_report
from sampling.benchmarks.timing import timed

MODEL = "checkpoints/tasks-xlnet-small"
GROUPS = {"suite": ("copy", "reverse", "sort", "perm", "pick3"), "long": ("copy_long", "reverse_long", "sort_long")}
GEN_LENGTH = {"generate": 32, "infill": 4}  # an infill's answer columns become EOS once its middle is filled
SAMPLERS = {"seq": dict(drafts=1, temperature=1.0), "assd": dict(drafts=5, temperature=1.0),
            "seq-greedy": dict(drafts=1, temperature=0.0), "assd-greedy": dict(drafts=5, temperature=0.0)}
MASK_TEXT, EOS_TEXT = "<mask>", "<eos>"


def infill_prompt(prompt: str, response: str) -> tuple[str, int, int]:
    """`(text, start, hidden)`: the prompt and response with the response's middle half as `<mask>`s;
    `start` is the hidden span's offset in the response, `hidden` its length."""
    keep = len(response) // 4
    hidden = len(response) - 2 * keep
    text = prompt + response[:keep] + MASK_TEXT * hidden + response[len(response) - keep:] + EOS_TEXT
    return text, keep, hidden


def layouts(examples, tokenizer):
    """`{layout: (encoded prompts, scorer)}`; a scorer maps (row, tokens [T], prompt width) to
    (correct, decoded tokens)."""
    eos = tokenizer.special_tokens.get("eos_token")
    eos_id = tokenizer.token_to_id(eos)
    gen = [tokenizer.encode(e.prompt) for e in examples]
    fills = [infill_prompt(e.prompt, e.response) for e in examples]
    inf = [tokenizer.encode(text) for text, _, _ in fills]

    def score_generate(i, tokens, width):
        answer = decode_response(tokenizer, tokens[width:], eos_id)
        ids = tokens[width:].tolist()
        return bool(get_task(examples[i].task).check(examples[i].prompt, answer)), \
            (ids.index(eos_id) + 1 if eos_id in ids else len(ids))

    def score_infill(i, tokens, width):
        e, (_, start, hidden) = examples[i], fills[i]
        row = tokens[:width].tolist()
        body = row[width - len(inf[i]):]                       # the row without its left padding
        prompt_len = len(tokenizer.encode(e.prompt))
        filled = body[prompt_len:prompt_len + len(e.response)]
        middle = filled[start:start + hidden]
        # an EOS filled inside the middle ends the row: the positions after it were not decoded
        decoded = middle.index(eos_id) + 1 if eos_id in middle else hidden
        return bool(get_task(e.task).check(e.prompt, tokenizer.decode(filled))), decoded

    return {"generate": (gen, score_generate), "infill": (inf, score_infill)}


def measure(model, tokenizer, group: str, tasks, n_prompts: int, repeats: int) -> list[dict]:
    examples = make_mixture(tasks, n_prompts, 1234, split="test")
    pad = model.config.pad_token_id or 0
    singles = [next(i for i, e in enumerate(examples) if e.task == t) for t in tasks]
    out = []
    for layout, (encoded, score) in layouts(examples, tokenizer).items():
        ids, mask = left_pad(encoded, pad)
        width = ids.shape[1]
        results = {}
        for name, settings in SAMPLERS.items():
            config = SamplerConfig.preset("assd", gen_length=GEN_LENGTH[layout], **settings)
            run = lambda lo, hi: jaxdllm.generate(model, ids[lo:hi], config, attention_mask=mask[lo:hi])  # noqa: E731
            res = run(0, len(ids))
            tokens = np.asarray(res.tokens)
            scored = [score(i, tokens[i], width) for i in range(len(ids))]
            correct = [c for c, _ in scored]
            decoded = [n for _, n in scored]
            nfe = np.asarray(res.nfe)
            chunks = [(lo, lo + 8) for lo in range(0, len(ids) - 7, 8)]
            batch_s = timed(lambda: [run(lo, hi) for lo, hi in chunks], repeats=repeats).min_s
            single_s = timed(lambda: [run(i, i + 1) for i in singles], repeats=repeats).min_s
            per_task = {}
            for task in tasks:
                rows = [i for i, e in enumerate(examples) if e.task == task]
                per_task[task] = dict(accuracy=float(np.mean([correct[i] for i in rows])),
                                      tokens_per_forward=sum(decoded[i] for i in rows) / float(nfe[rows].sum()))
            results[name] = tokens
            out.append(dict(
                sampler=name, layout=layout, tasks=group, rows=len(ids), preset=repr(config),
                accuracy=float(np.mean(correct)), tokens_per_forward=sum(decoded) / float(nfe.sum()),
                max_forwards_over_tokens=float(max(n / max(d, 1) for n, d in zip(nfe.tolist(), decoded))),
                per_task=per_task, batch1_tok_s=sum(decoded[i] for i in singles) / single_s,
                batch8_tok_s=sum(decoded[i] for lo, hi in chunks for i in range(lo, hi)) / batch_s))
            if name == "assd-greedy":
                same = (results["assd-greedy"] == results["seq-greedy"]).all(1)
                out[-1]["exact_vs_sequential"] = float(same.mean())
            print({k: v for k, v in out[-1].items() if k not in ("per_task", "preset")}, flush=True)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    rows = result["rows"]
    panels = [(g, lay) for g in GROUPS for lay in GEN_LENGTH]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    width = 0.8 / len(SAMPLERS)
    for s, name in enumerate(SAMPLERS):
        pick = [next(r for r in rows if r["sampler"] == name and r["tasks"] == g and r["layout"] == lay)
                for g, lay in panels]
        x = np.arange(len(panels)) + s * width
        axes[0].bar(x, [r["tokens_per_forward"] for r in pick], width, label=name)
        axes[1].bar(x, [r["accuracy"] for r in pick], width, label=name)
    for ax, title in zip(axes, ("tokens per forward", "accuracy")):
        ax.set_xticks(np.arange(len(panels)) + 0.4 - width / 2, [f"{g} {lay}" for g, lay in panels], fontsize=9)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"ASSD on tasks-xlnet-small (5 drafts) against sequential decoding, {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    exit_if_missing(("matplotlib",), "bench", "python -m sampling.benchmarks.benchmark_assd")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--n-prompts", type=int, default=50, help="held-out prompts per task")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default="sampling/results/assd_cpu")
    args = p.parse_args(argv)
    t0, load_before = time.perf_counter(), os.getloadavg()
    model = jaxdllm.from_pretrained(args.model)
    tokenizer = Tokenizer.from_pretrained(args.model)
    rows = []
    for group, tasks in GROUPS.items():
        rows += measure(model, tokenizer, group, tasks, args.n_prompts, args.repeats)
    result = {"model": Path(args.model).name, "n_prompts_per_task": args.n_prompts, "rows": rows,
              "wall_s": time.perf_counter() - t0, "load_average_before": load_before,
              "load_average_after": os.getloadavg()}
    write_report(args.out, result, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
