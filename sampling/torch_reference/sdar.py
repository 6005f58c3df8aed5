"""SDAR's published block-diffusion decoding as a plain PyTorch loop, one prompt at a time.

Written from the procedure of JetAstra/SDAR's `generate.py` (`block_diffusion_generate`) and, for
the entropy-bounded rule, Labman42/JetEngine's scheduler (the `entropy_bounded` branch of
`generate.py` does not run: it reads an unset variable and sums entropies over the block). SDAR's
weights are Qwen3's, so the model is a transformers `Qwen3ForCausalLM` (eager attention) fed
explicit 4-D masks and positions over a `DynamicCache`:

1. The sequence is the prompt followed by MASK up to the end of the block of `block_length` B that
   holds position `len(prompt) + gen_length - 1`; blocks sit at absolute positions from 0.
2. Prefill: the prompt's whole blocks (`len(prompt) // B` of them), block-causal (each token sees
   its own block and the ones before it), their K/V kept.
3. Each decoded block (the first one holds the prompt's tail, which is never changed): while it has
   a MASK, one forward of its B tokens at their global positions, attending to the whole cache and
   the whole block (no causal mask); its K/V are not kept (SDAR's `store_kv=False`). Each slot reads
   its own logit (no shift). Once no MASK is left, one more forward of the block keeps its K/V
   (the "store" forward, `store_kv=True`).
4. After each block: a row whose answer holds EOS stops (the published stopping criterion); the
   rest of its answer stays MASK.

Tokens are greedy: the argmax of the logits, its confidence `softmax(logits)[argmax]` and the
entropies from `softmax(logits)` (temperature 1, no top-k / top-p: the published sampling with the
multinomial draw replaced by the argmax, as LMDeploy's greedy unmasking scores its tokens).
Transfer rules, with `n = num_transfer_tokens[step]` (`B // steps`, one more for the first
`B % steps` steps):

* `low_confidence_dynamic`: if at least n masked slots have confidence > `threshold`, all of them;
  else the n most confident masked slots.
* `low_confidence_static`: the n most confident masked slots.
* `entropy_bounded` (JetEngine): the masked slots sorted by entropy (nats) ascending,
  `k = #(cumsum < eb_threshold)`, at least 1.

A row's result equals running the published generate on that prompt alone (it is batch 1).

    out = generate(model, [prompt_a, prompt_b], mask_id=..., eos_id=..., gen_length=64)
    out.tokens[i]               # gen_length ints (MASK after a stop)
    out.denoising_forwards[i]   # forwards that decided tokens
    out.store_forwards[i]       # forwards that only stored a finished block's K/V (one per block)
"""

from __future__ import annotations

import inspect
from typing import NamedTuple, Sequence

import torch

REMASKING = ("low_confidence_dynamic", "low_confidence_static", "entropy_bounded")
EPS = 1e-12  # JetEngine's clamp inside the entropy


class Result(NamedTuple):
    tokens: list[list[int]]
    denoising_forwards: list[int]
    store_forwards: list[int]
    prefill_forwards: list[int]


def num_transfer_tokens(block_length: int, steps: int) -> list[int]:
    """Tokens to transfer at each step of a block: `block_length // steps`, one more for the first
    `block_length % steps` steps."""
    base, extra = divmod(block_length, steps)
    return [base + (i < extra) for i in range(steps)]


def _additive(visible: torch.Tensor, dtype) -> torch.Tensor:
    """`[1, 1, Q, K]` float mask: 0 where `visible [Q, K]`, the dtype's minimum elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)[None, None]


def _forward(model, ids: torch.Tensor, start: int, visible: torch.Tensor, cache) -> torch.Tensor:
    """Logits `[L, V]` of `ids [L]` at positions `start..start+L-1` with `visible [L, start + L]`."""
    positions = torch.arange(start, start + len(ids))[None]
    # transformers >= 5.2x names the cache argument `cache`, earlier versions `past_key_values`
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=ids[None], position_ids=positions, attention_mask=_additive(visible, model.dtype),
                use_cache=True, **{name: cache})
    return out.logits[0]


def _transfer(logits: torch.Tensor, masked: torch.Tensor, n: int, remasking: str, threshold: float,
              eb_threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`(tokens [B], transfer [B] bool)` of one step."""
    probs = torch.softmax(logits.float(), dim=-1)
    x0_p, x0 = probs.max(dim=-1)
    if remasking == "entropy_bounded":
        p = probs[masked].clamp_min(EPS)
        entropies = -(p * p.log()).sum(-1)
        ent_sorted, order = torch.sort(entropies, stable=True)
        k = int((torch.cumsum(ent_sorted, 0) < eb_threshold).sum())
        transfer = torch.zeros_like(masked)
        transfer[masked.nonzero()[:, 0][order[:max(k, 1)]]] = True
        return x0, transfer
    if n > int(masked.sum()):
        # the published top-k runs over every slot (decided ones at -inf) and would re-decide one
        raise ValueError(f"{n} tokens to transfer but {int(masked.sum())} masked slots: the published loop would "
                         "overwrite a decided token; use steps == block_length")
    confidence = torch.where(masked, x0_p, -torch.inf)
    high = confidence > threshold
    if remasking == "low_confidence_dynamic" and int(high.sum()) >= n:
        return x0, high
    transfer = torch.zeros_like(masked)
    transfer[torch.topk(confidence, n).indices] = True
    return x0, transfer


@torch.no_grad()
def generate_one(model, prompt: Sequence[int], *, mask_id: int, eos_id: int | None, gen_length: int,
                 block_length: int = 4, steps: int = 4, remasking: str = "low_confidence_dynamic",
                 threshold: float = 0.9, eb_threshold: float = 0.35) -> tuple[list[int], int, int, int]:
    """`(answer tokens, denoising forwards, store forwards, prefill forwards)` for one prompt."""
    from transformers.cache_utils import DynamicCache

    if remasking not in REMASKING:
        raise ValueError(f"remasking must be one of {REMASKING}, got {remasking!r}")
    B, P = block_length, len(prompt)
    num_blocks = -(-(P + gen_length) // B)
    x = torch.full((num_blocks * B,), mask_id, dtype=torch.long)
    x[:P] = torch.as_tensor(list(prompt), dtype=torch.long)
    blk = torch.arange(num_blocks * B) // B
    cache = DynamicCache()
    prefill_blocks = P // B
    prefill = 0
    if prefill_blocks:
        end = prefill_blocks * B
        _forward(model, x[:end], 0, blk[:end, None] >= blk[None, :end], cache)
        prefill = 1
    schedule = num_transfer_tokens(B, steps)
    denoising = store = 0
    for b in range(prefill_blocks, num_blocks):
        start = b * B
        cur = x[start:start + B].clone()
        everything = torch.ones(B, start + B, dtype=torch.bool)  # the cache and the whole block
        for step in range(steps + 1):
            masked = cur == mask_id
            if not masked.any():
                _forward(model, cur, start, everything, cache)  # store the finished block's K/V
                store += 1
                break
            if step == steps:
                raise ValueError(f"block {b} still has masks after {steps} steps")
            logits = _forward(model, cur, start, everything, cache)
            cache.crop(-B)  # store_kv=False: drop the block's K/V again (the cache keeps the blocks before it)
            denoising += 1
            tokens, transfer = _transfer(logits, masked, schedule[step], remasking, threshold, eb_threshold)
            cur[transfer] = tokens[transfer]
        x[start:start + B] = cur
        if eos_id is not None and bool((x[P:] == eos_id).any()):
            break
    return x[P:P + gen_length].tolist(), denoising, store, prefill


def generate(model, prompts: Sequence[Sequence[int]], **settings) -> Result:
    """`generate_one` for each prompt on its own (a ragged batch: rows are independent)."""
    rows = [generate_one(model, prompt, **settings) for prompt in prompts]
    return Result(*(list(column) for column in zip(*rows)))
