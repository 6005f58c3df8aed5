"""PyTorch eager port of published diffusion-LLM decoding policies (batch 1, plain Python loops).

This is the independent reference that jaxdllm's compiled sampler is tested against, and the
"PyTorch baseline" of `sampling/benchmarks/benchmark_sampler.py`. It follows the published samplers'
structure (semi-autoregressive blocks over the generation region, one full-canvas forward per
step) and is written from the published LLaDA, Fast-dLLM, dParallel and Learn2PD descriptions.

    out = generate(model_fn, prompt, gen_length=128, block_length=32, steps=128, mask_id=126336)
    out["tokens"]        # [1, Lp+G] long
    out["nfe"]           # model forward passes (a CFG step counts 2)
    out["commit_step"]   # [1, Lp+G] long: NFE counter at the forward that committed each token

With `cache="prefix"` or `"dual"` (Fast-dLLM's two approximate K/V caches) `generate` takes a
model with cached forwards (`KVModel`, e.g. `sampling.torch_reference.torch_llada.TorchLLaDA`) instead of a
logits function: a block's first step runs the whole canvas and keeps every layer's K/V, later
steps of the block feed the block and everything after it (prefix) or the block alone (dual)
against those stored, stale K/V. The preset `fast-dllm-dual` is

    generate(model, prompt, gen_length=256, block_length=32, steps=256, mask_id=126336,
             policy="threshold", threshold=0.9, cache="dual")

Policies: "low_confidence" (LLaDA), "random" (LLaDA), "prophet" (early commit on the LLaDA
schedule), "threshold" and "factor" (Fast-dLLM), "entropy" (dParallel), "local_leap",
"credit" (CreditDecoding). The first three run a fixed `steps // num_blocks` forwards per
block; the others decode each block until it has no mask left, at least one token per forward.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, runtime_checkable

import torch

SCHEDULE_POLICIES = ("low_confidence", "random", "prophet")
UNTIL_FULL_POLICIES = ("threshold", "factor", "entropy", "local_leap", "credit")
POLICIES = SCHEDULE_POLICIES + UNTIL_FULL_POLICIES
CACHES = ("none", "prefix", "dual")


# ----------------------------------------------------------------------------- model calls

def shift_logits_right(logits: torch.Tensor) -> torch.Tensor:
    """`[1, L, V]` -> `[1, L, V]` where row i is the old row i-1 (row 0 keeps its own).

    For token-shifted models (Dream, Fast-dLLM v2) the logit at i-1 predicts token i.
    """
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def forward_logits(model_fn: Callable, x: torch.Tensor, prompt_len: int, mask_id: int,
                   cfg_scale: float, shift: bool) -> tuple[torch.Tensor, int]:
    """Logits `[1, L, V]` float32 for canvas x `[1, L]`, and the number of forwards it took.

    With cfg_scale > 0 a second, unconditional forward sees the prompt replaced by mask_id,
    and the two are combined as `un + (cfg + 1) * (cond - un)`.
    """
    def call(ids):
        out = model_fn(ids).float()
        return shift_logits_right(out) if shift else out

    cond = call(x)
    if cfg_scale <= 0:
        return cond, 1
    un_x = x.clone()
    un_x[:, :prompt_len] = mask_id
    un = call(un_x)
    return un + (cfg_scale + 1) * (cond - un), 2


@runtime_checkable
class KVModel(Protocol):
    """A mask predictor with the two forwards of Fast-dLLM's caches (TorchLLaDA is one).

    full(ids `[B, L]` long) -> (logits `[B, L, V]`, kv): the whole canvas, and the K/V of every
        position of every layer. `kv` is opaque to the port: it is only handed back to `window`.
    window(ids `[B, w]` long, start, kv, logits_len=None) -> logits `[B, logits_len or w, V]`: canvas
        positions [start, start + w) only (RoPE at those positions); in every layer their queries
        attend to their own fresh K/V and to `kv` at every other position. `kv` is not modified.
    """

    def full(self, ids: torch.Tensor) -> tuple[torch.Tensor, Any]: ...

    def window(self, ids: torch.Tensor, start: int, kv: Any, logits_len: Optional[int] = None) -> torch.Tensor: ...


def cache_window(cache: str, lo: int, hi: int, length: int, shift: bool) -> tuple[int, int]:
    """Canvas positions [start, end) a cached (not first) step of block [lo, hi) feeds.

    prefix: the block and everything after it; dual: the block alone. Everything outside is read
    from the K/V stored at the block's first step. A token-shifted model also feeds the token
    before the block, whose logit predicts the block's first token.
    """
    start = lo - int(shift)
    return start, (length if cache == "prefix" else hi)


class CachedForward:
    """Fast-dLLM's cached forwards over one canvas `[B, L]`; holds the stored K/V between steps.

    `block_logits(x, lo, hi, first)` returns the logits `[B, hi - lo, V]` float32 of block [lo, hi):
    with `first` (a block's first step) from the whole canvas, storing every layer's K/V; else from
    the `cache_window` forward against the K/V stored at the block's first step. Stale K/V are the
    published approximation: they are refreshed only at the next block's first step. Either way
    one forward (1 NFE).
    """

    def __init__(self, model: KVModel, cache: str, shift: bool = False):
        if cache not in ("prefix", "dual"):
            raise ValueError(f"CachedForward runs cache 'prefix' or 'dual', not {cache!r}")
        if not isinstance(model, KVModel):
            raise TypeError(f"cache={cache!r} needs a model with full() and window() (KVModel), "
                            f"got {type(model).__name__}")
        self.model, self.cache, self.shift, self.kv = model, cache, shift, None

    def block_logits(self, x: torch.Tensor, lo: int, hi: int, first: bool) -> torch.Tensor:
        if first:
            logits, self.kv = self.model.full(x)
            logits = logits.float()
            return (shift_logits_right(logits) if self.shift else logits)[:, lo:hi]
        if self.kv is None:
            raise RuntimeError("a cached step before any full step: no stored K/V")
        start, end = cache_window(self.cache, lo, hi, x.shape[1], self.shift)
        # logits only for the block: the rows after it (prefix) decide nothing
        return self.model.window(x[:, start:end], start, self.kv, logits_len=hi - lo).float()


def sample_tokens(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """x0 `[..., ]` = argmax over the last axis of logits `[..., V]`, Gumbel-noised if T > 0.

    The Gumbel-max form `exp(l) / (-log u)^T` in float64 samples softmax(l / T) (published form).
    """
    if temperature <= 0:
        return logits.argmax(-1)
    l64 = logits.double()
    u = torch.rand(l64.shape, dtype=torch.float64, device=l64.device, generator=generator)
    return (l64.exp() / (-torch.log(u)) ** temperature).argmax(-1)


def token_confidence(logits: torch.Tensor, x0: torch.Tensor, suppress_ids=()) -> torch.Tensor:
    """conf `[L]` float64 = softmax(logits `[L, V]`)[x0] with the ids in suppress_ids at -inf.

    Suppressing EOS/EoT makes positions that predict them score 0, so they are committed last;
    x0 itself is not changed.
    """
    l64 = logits.double()
    if suppress_ids:
        l64 = l64.clone()
        l64[:, list(suppress_ids)] = -torch.inf
    return torch.softmax(l64, -1).gather(-1, x0[:, None]).squeeze(-1)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """H `[L]` float64 of softmax(logits `[L, V]`); log_softmax keeps p log p finite at p = 0."""
    logp = torch.log_softmax(logits.double(), -1)
    plogp = torch.where(torch.isfinite(logp), logp.exp() * logp, torch.zeros_like(logp))  # 0 log 0 = 0
    return -plogp.sum(-1)


# ----------------------------------------------------------------------------- commit rules
# Each rule takes per-position scores `[L]` and the candidate mask `[L]` (still-masked positions
# of the current block) and returns the bool mask `[L]` of positions to commit this step.

def _best(score: torch.Tensor, cand: torch.Tensor, largest: bool = True) -> torch.Tensor:
    """One-hot `[L]` bool at the best candidate by score (largest or smallest)."""
    fill = -torch.inf if largest else torch.inf
    idx = torch.where(cand, score, torch.full_like(score, fill))
    idx = idx.argmax() if largest else idx.argmin()
    out = torch.zeros_like(cand)
    out[idx] = True
    return out


def select_topk(conf: torch.Tensor, cand: torch.Tensor, k: int) -> torch.Tensor:
    """The k candidates with the highest conf (LLaDA low_confidence / random)."""
    out = torch.zeros_like(cand)
    if k > 0:
        masked = torch.where(cand, conf, torch.full_like(conf, -torch.inf))
        out[torch.topk(masked, k).indices] = True
    return out


def select_threshold(conf: torch.Tensor, cand: torch.Tensor, threshold: float) -> torch.Tensor:
    """Fast-dLLM threshold: the top-1 candidate plus every candidate with conf >= threshold."""
    return _best(conf, cand) | (cand & (conf >= threshold))


def select_factor(conf: torch.Tensor, cand: torch.Tensor, factor: float) -> torch.Tensor:
    """Fast-dLLM factor: longest prefix of ranks n (1-based) with c_n >= 1 - factor/(n+1), >= 1.

    The bound is applied at every rank, the last one included.
    """
    order = torch.argsort(torch.where(cand, conf, torch.full_like(conf, -torch.inf)), descending=True)
    order = order[: int(cand.sum())]
    ranks = torch.arange(1, len(order) + 1, dtype=torch.float64, device=conf.device)
    ok = conf[order] >= 1 - factor / (ranks + 1)
    # the prefix ends at the first rank that fails the bound
    n = max(1, int(ok.long().cumprod(0).sum()))
    out = torch.zeros_like(cand)
    out[order[:n]] = True
    return out


def select_entropy(h: torch.Tensor, cand: torch.Tensor, entropy_threshold: float) -> torch.Tensor:
    """dParallel: the lowest-entropy candidate plus every candidate with H <= entropy_threshold."""
    return _best(h, cand, largest=False) | (cand & (h <= entropy_threshold))


def select_local_leap(conf: torch.Tensor, cand: torch.Tensor, anchor: float, relaxed: float,
                      radius: int) -> torch.Tensor:
    """LocalLeap: candidates within `radius` of an anchor (conf >= anchor) need only `relaxed`.

    Everything else needs `anchor`; the top-1 candidate is always committed.
    """
    anchors = torch.nonzero(cand & (conf >= anchor)).flatten()
    pos = torch.arange(len(cand), device=cand.device)
    near = torch.zeros_like(cand)
    if len(anchors):
        near = ((pos[:, None] - anchors[None, :]).abs() <= radius).any(-1)
    passes = torch.where(near, conf >= relaxed, conf >= anchor)
    return _best(conf, cand) | (cand & passes)


def llada_schedule(masks: int, steps: int) -> list[int]:
    """Tokens to commit at each of `steps` steps for a block with `masks` masks: as even as
    possible, the first `masks % steps` steps taking one more."""
    base, rem = divmod(masks, steps)
    return [base + (1 if j < rem else 0) for j in range(steps)]


def prophet_threshold(progress: float, thresholds) -> float:
    """Gap threshold for a progress in [0, 1): strict early, lenient late."""
    if progress < 1 / 3:
        return thresholds[0]
    return thresholds[1] if progress < 2 / 3 else thresholds[2]


def top2_gap(logits: torch.Tensor) -> float:
    """Mean over positions of (top1 - top2) logit, logits `[L, V]`."""
    top = torch.topk(logits.double(), 2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).mean())


class CreditState:
    """CreditDecoding's per-block memory C `[block_length, V]` float64 of past top-1 evidence."""

    def __init__(self, block_length: int, vocab: int, gamma: float, lam: float, alpha: float, device):
        self.credit = torch.zeros(block_length, vocab, dtype=torch.float64, device=device)
        self.gamma, self.lam, self.alpha = gamma, lam, alpha

    def update(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw block logits z `[Lb, V]` -> (fused logits z' `[Lb, V]`, conf `[Lb]`) in float64.

        C decays by gamma, then each position's current top-1 token earns p1 ** alpha; the fused
        logits add lambda * log1p(C). conf = max of the raw and the fused top-1 probabilities.
        """
        z = z.double()
        p1, top = torch.softmax(z, -1).max(-1)
        self.credit.mul_(self.gamma)
        rows = torch.arange(len(top), device=z.device)
        self.credit[rows, top] += p1 ** self.alpha
        fused = z + self.lam * torch.log1p(self.credit)
        conf = torch.maximum(p1, torch.softmax(fused, -1).max(-1).values)
        return fused, conf


# ----------------------------------------------------------------------------- canvas

class Canvas:
    """The token canvas of one prompt: x `[L]`, commit_step `[L]` and the NFE counter."""

    def __init__(self, prompt: torch.Tensor, gen_length: int, mask_id: int):
        lp = prompt.shape[1]
        self.prompt_len, self.mask_id = lp, mask_id
        self.x = torch.cat([prompt[0].long(), torch.full((gen_length,), mask_id, dtype=torch.long,
                                                         device=prompt.device)])
        self.commit_step = torch.zeros_like(self.x)
        self.nfe = 0

    def masked(self, lo: int = None, hi: int = None) -> torch.Tensor:
        """Bool `[L]`: positions in [lo, hi) (default: the generation region) still masked."""
        lo = self.prompt_len if lo is None else lo
        hi = len(self.x) if hi is None else hi
        out = torch.zeros_like(self.x, dtype=torch.bool)
        out[lo:hi] = self.x[lo:hi] == self.mask_id
        return out

    def commit(self, sel: torch.Tensor, tokens: torch.Tensor, offset: int = 0) -> None:
        """Write tokens `[n]` (or a scalar) at the positions of bool sel `[n]`, stamped with NFE.

        sel and tokens cover canvas positions [offset, offset + n) (default: the whole canvas).
        """
        if offset or len(sel) != len(self.x):
            n = len(sel)
            full_sel = torch.zeros_like(self.x, dtype=torch.bool)
            full_sel[offset:offset + n] = sel
            full_tokens = self.x.clone()
            full_tokens[offset:offset + n] = tokens
            sel, tokens = full_sel, full_tokens
        self.x = torch.where(sel, tokens, self.x)
        self.commit_step = torch.where(sel, torch.full_like(self.x, self.nfe), self.commit_step)

    def eos_done(self, eos_id: int) -> bool:
        """True when a committed EOS at e has no mask before it in the generation region.

        Checking the first committed EOS suffices: any later one has at least as many
        positions before it.
        """
        gen = self.x[self.prompt_len:]
        hits = torch.nonzero(gen == eos_id).flatten()
        if not len(hits):
            return False
        return not bool((gen[: int(hits[0])] == self.mask_id).any())

    def result(self) -> dict:
        return dict(tokens=self.x[None].clone(), nfe=self.nfe, commit_step=self.commit_step[None].clone())


# ----------------------------------------------------------------------------- generate

@torch.no_grad()
def generate(model_fn, prompt, *, gen_length, block_length, steps, mask_id, policy="low_confidence",
             temperature=0.0, cfg_scale=0.0, threshold=0.9, factor=1.0, entropy_threshold=0.5,
             local_leap_anchor=0.9, local_leap_relaxed=0.75, local_leap_radius=4,
             credit_threshold=0.95, credit_gamma=0.65, credit_lambda=0.70, credit_alpha=0.5,
             prophet_thresholds=(7.5, 5.0, 2.5), eos_id=None, eot_id=None,
             confidence_eos_eot_inf=False, stop_at_eos=False, shift_logits=False, generator=None,
             cache="none") -> dict:
    """Decode `gen_length` tokens after `prompt` `[1, Lp]` with `policy`.

    `model_fn(x [1, L] long) -> logits [1, L, V]`; with `cache` "prefix" or "dual" it must be a
    `KVModel` instead (see `CachedForward`), and every policy but "prophet" (which reads the
    whole answer's logits) decides from the current block's logits only. Returns dict(tokens
    `[1, Lp+G]`, nfe int, commit_step `[1, Lp+G]`: 0 on the prompt, else the NFE count at the
    committing forward).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {POLICIES}")
    if prompt.dim() != 2 or prompt.shape[0] != 1:
        raise ValueError(f"prompt must be [1, Lp], got {tuple(prompt.shape)}")
    if block_length <= 0 or gen_length <= 0 or gen_length % block_length:
        raise ValueError(f"gen_length {gen_length} must be a positive multiple of block_length {block_length}")
    num_blocks = gen_length // block_length
    if policy in SCHEDULE_POLICIES and (steps <= 0 or steps % num_blocks):
        raise ValueError(f"steps {steps} must be a positive multiple of the number of blocks {num_blocks}")
    if stop_at_eos and eos_id is None:
        raise ValueError("stop_at_eos needs eos_id")
    suppress = tuple(i for i in (eos_id, eot_id) if i is not None) if confidence_eos_eot_inf else ()
    if confidence_eos_eot_inf and not suppress:
        raise ValueError("confidence_eos_eot_inf needs eos_id and/or eot_id")
    _check_cache(cache, policy, cfg_scale, shift_logits, prompt.shape[1])

    canvas = Canvas(prompt, gen_length, mask_id)
    lp = canvas.prompt_len
    steps_per_block = steps // num_blocks if policy in SCHEDULE_POLICIES else 0
    cached = None if cache == "none" else CachedForward(model_fn, cache, shift_logits)

    def step_logits(lo: int, hi: int, first: bool) -> tuple[torch.Tensor, int]:
        """One decoding step's logits `[n, V]` for canvas positions [offset, offset + n), and offset.

        Without a cache the whole canvas (n = L, offset 0); with one the block [lo, hi). Counts
        its forwards.
        """
        if cached is not None:
            canvas.nfe += 1
            return cached.block_logits(canvas.x[None], lo, hi, first)[0], lo
        logits, calls = forward_logits(model_fn, canvas.x[None], lp, mask_id, cfg_scale, shift_logits)
        canvas.nfe += calls
        return logits[0], 0

    def finished_by_eos() -> bool:
        """After a step's commits: on a completed answer, pad the rest with EOS and stop."""
        if not (stop_at_eos and canvas.eos_done(eos_id)):
            return False
        canvas.commit(canvas.masked(), torch.tensor(eos_id, device=canvas.x.device))
        return True

    for b in range(num_blocks):
        lo, hi = lp + b * block_length, lp + (b + 1) * block_length

        if policy in SCHEDULE_POLICIES:
            schedule = llada_schedule(int(canvas.masked(lo, hi).sum()), steps_per_block)
            for j, k in enumerate(schedule):
                logits, off = step_logits(lo, hi, first=j == 0)
                x0 = sample_tokens(logits, temperature, generator)
                if policy == "prophet":
                    # early commit: answer positions already agree with a wide logit margin
                    progress = (b * steps_per_block + j) / steps
                    if top2_gap(logits[lp:]) >= prophet_threshold(progress, prophet_thresholds):
                        canvas.commit(canvas.masked(), x0)
                        return canvas.result()
                if policy == "random":
                    conf = torch.rand(len(x0), dtype=torch.float64, device=x0.device, generator=generator)
                else:
                    conf = token_confidence(logits, x0, suppress)
                cand = canvas.masked(lo, hi)[off:off + len(x0)]
                canvas.commit(select_topk(conf, cand, k), x0, off)
                if finished_by_eos():
                    return canvas.result()
            continue

        credit = None  # reset per block; built at the first forward, which tells the vocab size
        first = True
        while bool(canvas.masked(lo, hi).any()):
            logits, off = step_logits(lo, hi, first)
            first = False
            # logits row r is canvas position off + r; the block is rows [a, z)
            a, z = lo - off, hi - off
            cand = canvas.masked(lo, hi)[off:off + len(logits)]
            if policy == "credit":
                if credit is None:
                    credit = CreditState(block_length, logits.shape[-1], credit_gamma, credit_lambda,
                                         credit_alpha, logits.device)
                fused, block_conf = credit.update(logits[a:z])
                x0 = canvas.x[off:off + len(logits)].clone()
                x0[a:z] = sample_tokens(fused, temperature, generator)
                conf = torch.zeros(len(x0), dtype=torch.float64, device=x0.device)
                conf[a:z] = block_conf
                sel = cand & (conf >= credit_threshold)
                if not bool(sel.any()):
                    sel = _best(conf, cand)
            else:
                x0 = sample_tokens(logits, temperature, generator)
                if policy == "entropy":
                    h = torch.full((len(x0),), torch.inf, dtype=torch.float64, device=x0.device)
                    h[a:z] = entropy(logits[a:z])  # only the block's candidates can win
                    sel = select_entropy(h, cand, entropy_threshold)
                else:
                    conf = token_confidence(logits, x0, suppress)
                    if policy == "threshold":
                        sel = select_threshold(conf, cand, threshold)
                    elif policy == "factor":
                        sel = select_factor(conf, cand, factor)
                    else:
                        sel = select_local_leap(conf, cand, local_leap_anchor, local_leap_relaxed,
                                                local_leap_radius)
            canvas.commit(sel, x0, off)
            if finished_by_eos():
                return canvas.result()

    return canvas.result()


def _check_cache(cache: str, policy: str, cfg_scale: float, shift_logits: bool, prompt_len: int) -> None:
    """ValueError for a cache name, or a combination with it, the cached forwards cannot run."""
    if cache not in CACHES:
        raise ValueError(f"unknown cache {cache!r}; choose from {CACHES}")
    if cache == "none":
        return
    if cfg_scale > 0:  # the unconditional canvas would need K/V of its own
        raise ValueError(f"cfg_scale > 0 needs cache='none', not cache={cache!r}")
    if policy == "prophet":  # its early commit reads the whole answer's logits; a cached step has the block's
        raise ValueError(f"policy 'prophet' needs cache='none', not cache={cache!r}")
    if shift_logits and cache == "dual":
        raise ValueError("shift_logits (token-shifted models) is not supported with cache='dual'")
    if shift_logits and prompt_len == 0:  # the window would start before the canvas
        raise ValueError(f"shift_logits with cache={cache!r} needs a non-empty prompt")


@torch.no_grad()
def generate_batch(model_fn, prompts, *, gen_length, block_length, steps, mask_id, policy="low_confidence",
                   threshold=0.9, entropy_threshold=0.5, cache="none") -> dict:
    """Batched form of the published loop (as LLaDA's and Fast-dLLM's own `generate` run a batch
    of equal-length prompts): one forward of the whole `[B, Lp+G]` canvas per step, per-row
    selection. Greedy, no CFG; policies "low_confidence", "threshold" and "entropy" (dParallel:
    the lowest-entropy masked position of the block plus every one with entropy <=
    `entropy_threshold`). For benchmarks.

    With `cache` "prefix" or "dual", `model_fn` is a `KVModel` and the steps run Fast-dLLM's cached
    forwards for the whole batch (`CachedForward`): a block's first step refreshes every row's
    K/V; the block ends when no row has a mask left in it, and a row only counts the forwards at
    which it still had one (as `generate` does for the row alone).

    Returns dict(tokens [B, Lp+G], nfe [B]).
    """
    if policy not in ("low_confidence", "threshold", "entropy"):
        raise ValueError("generate_batch supports policy 'low_confidence', 'threshold' or 'entropy'")
    _check_cache(cache, policy, 0.0, False, prompts.shape[1])
    cached = None if cache == "none" else CachedForward(model_fn, cache)
    b, lp = prompts.shape
    x = torch.cat([prompts, torch.full((b, gen_length), mask_id, dtype=prompts.dtype, device=prompts.device)],
                  dim=1)
    nb = gen_length // block_length
    nfe = torch.zeros(b, dtype=torch.long)
    for blk in range(nb):
        start, end = lp + blk * block_length, lp + (blk + 1) * block_length
        schedule = llada_schedule(block_length, steps // nb) if policy == "low_confidence" else None
        j = 0
        while (x[:, start:end] == mask_id).any() if schedule is None else j < len(schedule):
            if cached is None:
                logits = model_fn(x).float()[:, start:end]
            else:
                logits = cached.block_logits(x, start, end, first=j == 0)
            x0 = logits.argmax(-1)
            if policy == "entropy":
                h = entropy(logits)  # [B, block] float64
            else:
                conf = torch.softmax(logits.double(), -1).gather(-1, x0[..., None])[..., 0]
            for row in range(b):
                cand = x[row, start:end] == mask_id
                if not cand.any():
                    continue
                nfe[row] += 1
                if policy == "entropy":
                    pick = select_entropy(h[row], cand, entropy_threshold)
                elif schedule is not None:
                    pick = select_topk(conf[row], cand, schedule[j])
                else:
                    pick = select_threshold(conf[row], cand, threshold)
                x[row, start:end] = torch.where(pick, x0[row], x[row, start:end])
            j += 1
    return {"tokens": x, "nfe": nfe}


# ----------------------------------------------------------------------------- Dream

def dream_sample(logits: torch.Tensor, alg: str, temperature: float, top_p, top_k, generator):
    """Dream's token choice and confidence over logits `[N, V]`: (conf `[N]`, x0 `[N]`).

    maskgit_plus: p(x0); topk_margin: p1 - p2; entropy: sum p log p (= -H).
    """
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop = cum > top_p
        drop[..., 1:] = drop[..., :-1].clone()
        drop[..., 0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -torch.inf)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -torch.inf)
    probs = torch.softmax(logits.float(), -1)
    if temperature > 0:
        x0 = torch.multinomial(probs, 1, generator=generator)[:, 0]
        conf = probs.gather(-1, x0[:, None])[:, 0]
    else:
        conf, x0 = probs.max(-1)
    if alg == "topk_margin":
        top2 = torch.topk(probs, 2, -1).values
        conf = top2[:, 0] - top2[:, 1]
    elif alg == "entropy":
        conf = (probs * torch.log(probs + 1e-10)).sum(-1)
    return conf, x0


@torch.no_grad()
def generate_dream(model_fn, prompt, *, gen_length, steps, mask_id, alg="maskgit_plus", temperature=0.0,
                   top_p=None, top_k=None, alg_temp=None, eps=1e-3, generator=None) -> dict:
    """Dream's `diffusion_generate` for one prompt `[1, Lp]`: token-shifted logits, timesteps
    `linspace(1, eps, steps + 1)` (float32), `int(M * (1 - s / t))` tokens per step (all of the
    rest at the last step), chosen by confidence (top-k, or sampled from softmax(conf / alg_temp)).
    `origin` reveals each mask with probability 1 - s/t instead.

    Returns dict(tokens [1, Lp+G], nfe, commit_step [1, Lp+G]).
    """
    canvas = Canvas(prompt, gen_length, mask_id)
    timesteps = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        masked = canvas.masked()
        logits = shift_logits_right(model_fn(canvas.x[None]).float())[0]
        canvas.nfe += 1
        t, s = timesteps[i], timesteps[i + 1]
        idx = torch.nonzero(masked).flatten()
        if alg == "origin":
            p_transfer = float(1 - s / t) if i < steps - 1 else 1.0
            reveal = torch.rand(len(idx), generator=generator) < p_transfer
            _, x0 = dream_sample(logits[idx[reveal]], "maskgit_plus", temperature, top_p, top_k, generator)
            sel = torch.zeros_like(masked)
            sel[idx[reveal]] = True
            tokens = canvas.x.clone()
            tokens[idx[reveal]] = x0
            canvas.commit(sel, tokens)
            continue
        conf, x0 = dream_sample(logits[idx], alg, temperature, top_p, top_k, generator)
        num_mask = masked.sum().float()
        k = int(num_mask * (1 - s / t)) if i < steps - 1 else int(num_mask)
        if k <= 0:
            continue
        full = torch.full((len(canvas.x),), -torch.inf)
        full[idx] = conf.float()
        if alg_temp:
            pick = torch.multinomial(torch.softmax(full / alg_temp, -1), k, generator=generator)
        else:
            pick = torch.topk(full, k).indices
        sel = torch.zeros_like(masked)
        sel[pick] = True
        tokens = canvas.x.clone()
        tokens[idx] = x0
        canvas.commit(sel, tokens)
    return canvas.result()
