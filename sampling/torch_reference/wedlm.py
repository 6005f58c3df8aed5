"""WeDLM's streaming decoding as a plain PyTorch loop, one prompt at a time, with no cache.

Written from the procedure of Tencent/WeDLM's engine (`wedlm/engine/wedlm_decoder.py`, `sampler.py`;
`conversions-sdar-sbd-wedlm.md` §3a). The model is a transformers causal LM (`Qwen2ForCausalLM` /
`Qwen3ForCausalLM`, eager attention). Every forward recomputes the whole sequence from scratch, so
the result also checks that a prefix cache of the committed tokens is exact:

    sequence = prompt ; committed answer tokens ; the window in topological order
    positions = 0 .. P + c - 1 for the prefix, then each window token's own slot position
    mask     = plain causal over that physical order

State: `window` (tokens) and `is_mask` (flags), `c` committed answer tokens. Each step:

1. Refill: `n` = leading filled slots; n masks are appended (the window never runs past
   `gen_length`: the answer has no slot there).
2. Reorder: filled slots first, then masks, each in slot order. Forward.
3. Commit ("prune"): the n leading filled slots join the committed text; a committed EOS ends the
   row; so does `gen_length` committed tokens.
4. Fill (if not ended): for the masks left (slot order), H = entropy of the raw logits (nats),
   d = slot - first mask's slot, H~ = H + pos_penalty * d; fill every mask with H~ < threshold,
   else the argmin (the first on ties); token = argmax over the vocabulary without the MASK id.

`forwards` counts every forward, the last one included (it only commits). jaxdllm's loop ends
when the answer is decided, one forward earlier: `nfe == forwards - 1`.

    out = generate(model, [prompt_a, prompt_b], mask_id=..., eos_id=..., gen_length=24, window=8)
    out.tokens[i]     # the committed answer (up to and including EOS)
    out.forwards[i]
    out.fill_forward[i]   # per committed token, the forward that filled it (jaxdllm's `commit_step`)
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch


class Result(NamedTuple):
    tokens: list[list[int]]
    forwards: list[int]
    fill_forward: list[list[int]]  # per committed token, the forward (1-based) whose logits chose it


def _logits(model, ids: list[int], positions: list[int]) -> torch.Tensor:
    """`[L, V]` float32 logits of `ids` at `positions` under a plain causal mask (physical order)."""
    n = len(ids)
    visible = torch.ones(n, n, dtype=torch.bool).tril()
    mask = torch.zeros(n, n, dtype=model.dtype).masked_fill(~visible, torch.finfo(model.dtype).min)[None, None]
    out = model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([positions]), attention_mask=mask)
    return out.logits[0].float()


@torch.no_grad()
def generate_one(model, prompt: Sequence[int], *, mask_id: int, eos_id: int | None, gen_length: int,
                 window: int = 16, threshold: float = 0.4, pos_penalty: float = 0.02
                 ) -> tuple[list[int], int, list[int]]:
    """`(committed answer tokens, forwards, the forward that filled each)` for one prompt (greedy)."""
    prompt = [int(t) for t in prompt]
    P = len(prompt)
    committed: list[int] = []
    committed_at: list[int] = []
    tokens = [mask_id] * min(window, gen_length)
    filled_at = [0] * len(tokens)
    is_mask = [True] * len(tokens)
    forwards = 0
    while True:
        lead = is_mask.index(True) if True in is_mask else len(tokens)
        room = gen_length - len(committed) - len(tokens)
        extra = min(lead, room)
        tokens += [mask_id] * extra
        is_mask += [True] * extra
        filled_at += [0] * extra
        order = [i for i in range(len(tokens)) if not is_mask[i]] + [i for i in range(len(tokens)) if is_mask[i]]
        start = P + len(committed)
        ids = prompt + committed + [tokens[i] for i in order]
        positions = list(range(start)) + [start + i for i in order]
        logits = _logits(model, ids, positions)[start:]
        forwards += 1
        filled_count = sum(1 for m in is_mask if not m)
        mask_rows = logits[filled_count:]                       # the masks' rows, in slot order

        ended = False
        for t, at in zip(tokens[:lead], filled_at[:lead]):
            committed.append(t)
            committed_at.append(at)
            if (eos_id is not None and t == eos_id) or len(committed) >= gen_length:
                ended = True
                break
        if ended:
            return committed, forwards, committed_at
        tokens, is_mask, filled_at = tokens[lead:], is_mask[lead:], filled_at[lead:]
        slots = [i for i, m in enumerate(is_mask) if m]
        if not slots:
            continue
        probs = torch.softmax(mask_rows, dim=-1)
        entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
        adjusted = entropy + pos_penalty * torch.tensor([s - slots[0] for s in slots], dtype=torch.float32)
        chosen = (adjusted < threshold).nonzero()[:, 0].tolist() or [int(torch.argmin(adjusted))]
        picks = mask_rows.clone()
        picks[:, mask_id] = -torch.inf
        best = picks.argmax(-1)
        for k in chosen:
            tokens[slots[k]] = int(best[k])
            is_mask[slots[k]] = False
            filled_at[slots[k]] = forwards


def generate(model, prompts: Sequence[Sequence[int]], **settings) -> Result:
    """`generate_one` for each prompt on its own (a ragged batch: rows are independent)."""
    rows = [generate_one(model, prompt, **settings) for prompt in prompts]
    return Result(*(list(column) for column in zip(*rows)))
