"""PyTorch eager port of FreeDave (Free Draft-and-Verification, `algorithms.md` §10) for one prompt:
the published full-attention decoding loop without a cache, written from the published algorithm
(`generation/core.py` of cychomatica/FreeDave: `block_decode_with_full_attention_FreeDave`,
`token_transfer` with `draft_steps`, `draft_verification_vectorized`), as an independent reference
for `jaxdllm`'s compiled `freedave` policy.

    out = generate(model_fn, prompt, gen_length=64, block_length=32, drafts=4, mask_id=126336)
    out["tokens"]   # [1, Lp+G] long: LLaDA's one-token-per-step greedy output
    out["nfe"]      # model forwards (a forward of the K drafts counts one)

Per block, as published: one forward of the whole canvas gives the block's first seed (greedy tokens
and their confidences). Then, while the block has masks: with one mask left, draft 1 (the
reference's own step from the seed) is committed without a forward; otherwise d = min(K, masks)
drafts are built from the seed (draft k: the reference's step plus the k - 1 next most confident
masked positions), one batched forward (d rows) gives every draft's logits, target(i) is the
reference's step from draft i's logits, and the published chain picks the draft: from best = 0,
repeatedly the largest j > best whose draft agrees with target(best) (every position:
`exact_match`; the draft's decided positions: `subset`, what the published loop passes), until no
j agrees. The accepted draft is committed and its greedy tokens and confidences seed the next step.

The reference is LLaDA's low-confidence rule at one token per step, or, with `threshold`, Fast-dLLM's
rule (the top-1 masked position plus every one with confidence >= threshold; the published
confidence-aware drafts: that step, then one more position per further draft).

Differences from the published code, kept on purpose:
- Ranking: the published code ranks with `torch.topk`, whose order among equal confidences is left to
  the backend; here ties go to the lower position (a stable sort), the rule of jaxdllm's samplers.
- Token-shifted models (`shift_logits`): the published loop commits each block's first position from
  the block-start forward whatever its confidence (its rule for AR-adapted models); here the block's
  positions are ranked like any others, as the low-confidence reference ranks them.
- Confidence is softmax(logits)[token] in float64 (the ports' convention, `torch_port.token_confidence`).
"""

from __future__ import annotations

from typing import Callable

import torch

from sampling.torch_reference.torch_port import Canvas, shift_logits_right, token_confidence


def greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(tokens [N, L] long, confidence [N, L] float64)` of logits `[N, L, V]`: argmax and its probability."""
    tokens = logits.argmax(-1)
    conf = torch.stack([token_confidence(row, tok) for row, tok in zip(logits, tokens)])
    return tokens, conf


def ranked(conf: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """Positions of the candidates `cand [L]` by descending `conf [L]`, ties to the lower position."""
    order = torch.sort(torch.where(cand, -conf, torch.full_like(conf, torch.inf)), stable=True).indices
    return order[: int(cand.sum())]


def reference_step(window: torch.Tensor, tokens: torch.Tensor, conf: torch.Tensor, mask_id: int,
                   threshold: float | None) -> torch.Tensor:
    """The reference's step on a block `window [L]` from greedy `tokens [L]` and `conf [L]`: the top-1
    masked position (low confidence), or also every masked one with conf >= threshold."""
    cand = window == mask_id
    out = window.clone()
    order = ranked(conf, cand)
    if not len(order):
        return out
    pick = torch.zeros_like(cand)
    pick[order[0]] = True
    if threshold is not None:
        pick |= cand & (conf >= threshold)
    out[pick] = tokens[pick]
    return out


def build_drafts(window: torch.Tensor, tokens: torch.Tensor, conf: torch.Tensor, count: int, mask_id: int,
                 threshold: float | None) -> torch.Tensor:
    """`count` drafts `[count, L]` of the block `window [L]` from the seed (`tokens`, `conf` `[L]`):
    draft k (index k - 1) is the reference's step plus the k - 1 next masked positions by confidence."""
    first = reference_step(window, tokens, conf, mask_id, threshold)
    order = ranked(conf, first == mask_id)
    drafts = [first]
    for k in range(1, count):
        d = first.clone()
        d[order[:k]] = tokens[order[:k]]
        drafts.append(d)
    return torch.stack(drafts)


def published_chain(drafts: torch.Tensor, targets: torch.Tensor, mask_id: int, match_rule: str) -> int:
    """The published verification: from best = 0, the largest j > best whose draft agrees with
    target(best), repeated until none does. `drafts`, `targets`: `[K, L]`."""
    best = 0
    while True:
        nxt = best
        for j in range(best + 1, len(drafts)):
            d, t = drafts[j], targets[best]
            if match_rule == "exact_match":
                agree = bool((d == t).all())
            elif match_rule == "subset":
                decided = d != mask_id
                agree = bool((d[decided] == t[decided]).all())
            else:
                raise ValueError(f"unknown match_rule {match_rule!r}")
            if agree or bool((d == mask_id).all()):  # published: an all-mask draft always agrees
                nxt = j
        if nxt == best:
            return best
        best = nxt


@torch.no_grad()
def generate(model_fn: Callable[[torch.Tensor], torch.Tensor], prompt: torch.Tensor, *, gen_length: int,
             block_length: int, mask_id: int, drafts: int = 4, threshold: float | None = None,
             match_rule: str = "exact_match", shift_logits: bool = False) -> dict:
    """FreeDave on `prompt [1, Lp]` with the whole-canvas forward `model_fn(x [N, L]) -> logits [N, L, V]`.

    Returns dict(tokens `[1, Lp+G]` long, nfe int).
    """
    if prompt.dim() != 2 or prompt.shape[0] != 1:
        raise ValueError(f"prompt must be [1, Lp], got {tuple(prompt.shape)}")
    if gen_length % block_length or drafts < 1:
        raise ValueError(f"gen_length {gen_length} must be a multiple of block_length {block_length}; drafts >= 1")
    canvas = Canvas(prompt, gen_length, mask_id)
    lp = canvas.prompt_len

    def forward(x: torch.Tensor) -> torch.Tensor:
        logits = model_fn(x).float()
        canvas.nfe += 1
        return shift_logits_right(logits) if shift_logits else logits

    for b in range(gen_length // block_length):
        lo, hi = lp + b * block_length, lp + (b + 1) * block_length
        tokens, conf = greedy(forward(canvas.x[None])[:, lo:hi])
        tokens, conf = tokens[0], conf[0]
        while bool((canvas.x[lo:hi] == mask_id).any()):
            window = canvas.x[lo:hi]
            masks = int((window == mask_id).sum())
            count = min(drafts, masks)
            cands = build_drafts(window, tokens, conf, count, mask_id, threshold)
            if masks == 1:  # the last position: the reference's step from the seed, no forward (as published)
                canvas.x[lo:hi] = cands[0]
                break
            x = canvas.x[None].repeat(count, 1)
            x[:, lo:hi] = cands
            d_tokens, d_conf = greedy(forward(x)[:, lo:hi])
            targets = torch.stack([reference_step(cands[i], d_tokens[i], d_conf[i], mask_id, threshold)
                                   for i in range(count)])
            best = published_chain(cands, targets, mask_id, match_rule)
            canvas.x[lo:hi] = cands[best]
            tokens, conf = d_tokens[best], d_conf[best]
    return dict(tokens=canvas.x[None].clone(), nfe=canvas.nfe)
