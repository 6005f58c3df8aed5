"""Diffusion caches by name. Each step of the diffusion loop asks its cache for the current
block's logits; the cache decides what the model reads and what K/V it keeps:

    cache.init(model, canvas, view, lay, config)            -> cache state (a pytree, or None)
    cache.forward(model, state, view, lay, config, span)    -> (logits, cache state, passes)
    cache.after_commit(model, state, view, lay, config, block_full) -> cache state

`span` is `"block"` (logits `[B, block_length, V]` of the current block) or `"answer"` (`[B, G,
V]`, for policies that read the whole answer). `passes` is the number of forwards a row takes
part in (classifier-free guidance runs two). Cache fills that decide nothing (a prompt prefill,
a finished block's rewrite) are not counted, so `nfe` is the same for every exact cache.

* `none`: the whole canvas each step (exact); the only one with CFG and answer-wide logits.
* `prefix` (Fast-dLLM): at a block's first step the whole canvas, keeping every K/V; later steps
  feed the block and everything after it (one static shape per block index). Approximate, as
  published: prefix K/V are not recomputed as later tokens change.
* `dual` (Fast-dLLM): the same refresh; later steps feed only the block (prefix and suffix K/V
  stay as cached).
* `block` (Fast-dLLM v2, block-causal models): exact. The prompt's K/V are prefilled once; each
  step feeds the window of model blocks holding the decoding block; a finished window's K/V are
  rewritten from its final tokens.
* `set_block` (Set Block Decoding, causal models): exact. The block's first step re-encodes the k
  tokens before it causally, fused with the block; later steps feed the block.

A new cache is one `Cache` subclass plus one `register_cache` call; the loop names none of them.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from jaxdllm.attention import MaskSpec
from jaxdllm.decoding import branching
from jaxdllm.errors import ConfigError
from jaxdllm.models.transformer import ForwardOutput
from jaxdllm.registry import Registry, Settings


@dataclasses.dataclass(frozen=True)
class Cache(Settings):
    """Base class: subclasses set `name`, declare settings as fields, and define the three calls.

    Class attributes:
      attentions: the model attention modes it serves.
      supports_cfg: it can run classifier-free guidance (a second, unconditional canvas).
      answer_logits: it can return logits for the whole answer (`span="answer"`).
      keeps_kv: it holds K/V between steps (canvases with their own exact cache refuse it).
      exact: its logits equal the whole canvas's forward (`none`, `block`; Fast-dLLM's are approximate).
    """

    name: ClassVar[str] = ""
    role: ClassVar[str] = "cache"
    attentions: ClassVar[tuple[str, ...]] = ("bidirectional", "block_causal")
    supports_cfg: ClassVar[bool] = False
    answer_logits: ClassVar[bool] = False
    keeps_kv: ClassVar[bool] = True
    exact: ClassVar[bool] = False

    def check(self, config) -> None:
        """Checks that need only the `SamplerConfig` (at construction)."""
        if config.cfg_scale > 0 and not self.supports_cfg:
            raise ConfigError(f"cfg_scale > 0 is supported with cache='none' only, not cache={self.name!r}")

    def check_model(self, model_config, config) -> None:
        """Checks against the model (before compiling)."""
        if model_config.attention not in self.attentions:
            raise ConfigError(f"cache={self.name!r} does not serve {model_config.attention} models "
                              f"(it serves {', '.join(self.attentions)})")

    def step_window(self, lay, config) -> int | None:
        """Tokens a step feeds when they are one fixed window of model blocks after a cached prefix
        (the block cache); None when a step reads the whole canvas or a span that changes per block."""
        return None

    def init(self, model, canvas, view, lay, config):
        """The cache state for `canvas [B, T]` (MASK answer) with `view` (seg, positions `[B, T]`)."""
        return None

    def forward(self, model, state, view, lay, config, span: str):
        """`(logits [B, block_length or G, V] f32, cache state, passes)` for `state.block`."""
        raise NotImplementedError

    def after_commit(self, model, state, view, lay, config, block_full):
        """The cache state after a step's commits (`state.block` already advanced if `block_full`)."""
        return state.cache


def block_start(state, lay, config):
    return lay.decode_start + state.block * config.block_length


def logits_span(state, lay, config, span: str) -> tuple:
    """`(start, length)` in canvas positions of the logits a step needs (shifted models: one earlier)."""
    if span == "answer":
        return lay.decode_start - lay.shift, lay.decode_width
    return block_start(state, lay, config) - lay.shift, config.block_length


@dataclasses.dataclass(frozen=True)
class NoCache(Cache):
    name = "none"
    keeps_kv = False
    exact = True
    supports_cfg = True
    answer_logits = True

    def forward(self, model, state, view, lay, config, span):
        canvas, positions, seg = state.canvas, view.positions, view.seg
        if config.cfg_scale > 0:  # the unconditional copy: the prompt replaced by MASK
            uncond = jnp.where((jnp.arange(lay.total) < lay.prompt_len) & ~view.answer, lay.mask_id, canvas)
            canvas = jnp.concatenate([canvas, uncond])
            positions, seg = jnp.concatenate([positions, positions]), jnp.concatenate([seg, seg])
        logits = model(canvas, positions, lay.mask(seg, seg),
                       logits_slice=logits_span(state, lay, config, span)).logits
        if config.cfg_scale > 0:
            cond, uncond = jnp.split(logits, 2)
            return uncond + (config.cfg_scale + 1.0) * (cond - uncond), None, 2
        return logits, None, 1


@dataclasses.dataclass(frozen=True)
class _Refreshed(Cache):
    """Fast-dLLM's caches: the whole canvas at a block's first step (or every step, for tests)."""

    refresh_every_step: bool = False
    attentions = ("bidirectional",)

    def check_model(self, model_config, config):
        if model_config.attention == "block_causal":
            raise ConfigError(f"cache={self.name!r} is Fast-dLLM's approximate cache for bidirectional models; "
                              "a block-causal model decodes exactly with cache='block' (or 'none')")
        super().check_model(model_config, config)

    def slots(self, lay, config) -> int:
        return lay.total

    def init(self, model, canvas, view, lay, config):
        return model.init_cache(canvas.shape[0], self.slots(lay, config))

    def forward(self, model, state, view, lay, config, span):
        def full(cache):
            return model(state.canvas, view.positions, lay.mask(view.seg), cache,
                         logits_slice=logits_span(state, lay, config, span))

        refresh = jnp.bool_(True) if self.refresh_every_step else state.block_step == 0
        out = branching.cond(refresh, full, lambda c: self.cached(model, state, view, lay, config, c), state.cache)
        return out.logits, out.cache, 1

    def cached(self, model, state, view, lay, config, cache) -> ForwardOutput:
        """A later step's forward from `cache`: the model's output with logits for the decoding block."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class PrefixCache(_Refreshed):
    """Later steps feed the block and everything after it, as published: `G - b * block_length`
    (+ shift) tokens in block `b`. Shapes stay static with one branch per block index, selected by
    `lax.switch` inside the one compiled loop (so a generation compiles `num_blocks` cached
    forwards, and a step never feeds more than the published cache does).

    Cost of the switch: XLA does not update one buffer in place from several branches, so the
    compiled loop copies the whole K/V cache in the taken branch and again in the loop body (two
    copies per cached step in XLA's CPU program; `python -m sampling.benchmarks.profile_sampler --preset
    fast-dllm-prefix` counts them on any device). At 8B and 320 slots that is about 0.7 GB moved
    per row and step, small beside the weight read at batch 1 and not at large batches, while
    the shorter windows feed fewer tokens than a fixed G-token window (GPU timings in
    `sampling/results/`). The dual and block caches copy nothing per step
    (`tests/benchmarks/test_profile_sampler.py`)."""

    name = "prefix"

    @staticmethod
    def window(lay, config, block: int) -> tuple[int, int]:
        """`(start, width)` in canvas positions of what a cached step of block `block` feeds."""
        offset = block * config.block_length
        return lay.decode_start + offset - lay.shift, lay.decode_width - offset + lay.shift

    def cached(self, model, state, view, lay, config, cache):
        def branch(block):
            start, width = self.window(lay, config, block)

            def run(cache):
                ids, pos, q_seg = view.window(state.canvas, start, width)
                return model(ids, pos, lay.mask(q_seg, q_offset=start, kind="bidirectional"), cache,
                             logits_slice=(0, config.block_length))
            return run

        blocks = lay.num_blocks(config.block_length)
        branches = [branch(b) for b in range(blocks)]
        return branching.switch(jnp.minimum(state.block, blocks - 1), branches, cache)


@dataclasses.dataclass(frozen=True)
class DualCache(_Refreshed):
    """Later steps feed only the block (and, shifted, the token before it)."""

    name = "dual"

    def cached(self, model, state, view, lay, config, cache):
        start = block_start(state, lay, config) - lay.shift
        ids, pos, q_seg = view.window(state.canvas, start, config.block_length + lay.shift)
        return model(ids, pos, lay.mask(q_seg, q_offset=start, kind="bidirectional"), cache,
                     logits_slice=(0, config.block_length))


@dataclasses.dataclass(frozen=True)
class BlockCache(Cache):
    """Exact K/V of finished blocks for block-causal models.

    Under block-causal attention the K/V of a finished block depend only on the finished tokens
    at and before it. A step feeds only the current window: the model block(s) holding the
    decoding block, W = max(block_length, block_size) tokens; with W > block_length (Fast-dLLM v2
    sub-blocks) the later sub-blocks' masks are in view, as in the full-canvas forward.
    Token-shifted models also feed the token before the window, whose logit predicts the window's
    first token; it rewrites its own slot with the same K/V (its keys are final).
    """

    name = "block"
    attentions = ("block_causal",)
    exact = True

    def check_model(self, model_config, config):
        if model_config.attention == "bidirectional":
            raise ConfigError("cache='block' caches the finished blocks of a block-causal model; this model is "
                              "bidirectional: use cache='none', 'prefix' or 'dual'")
        super().check_model(model_config, config)
        bl, bs = config.block_length, model_config.block_size
        if bl % bs and bs % bl:
            raise ConfigError(f"cache='block' needs block_length ({bl}) to be a multiple or a divisor of the "
                              f"model's block_size ({bs})")

    @staticmethod
    def window(lay, config) -> int:
        """Tokens fed per step: the model block(s) holding the decoding block."""
        return max(config.block_length, lay.block_size)

    def step_window(self, lay, config) -> int:
        return self.window(lay, config)

    def init(self, model, canvas, view, lay, config, extra_slots: int = 0):
        """The K/V of the prompt's whole blocks before the first decoded block, once (not a
        decoding step: not in `nfe`). The prompt tails that share the first decoded block are fed
        with it, each step, as the published loops feed them. The cache has `lay.total` slots plus
        `extra_slots` (FreeDave's tree of drafts writes K windows past the current one)."""
        Lp = lay.decode_start
        cache = model.init_cache(canvas.shape[0], lay.total + extra_slots)
        if Lp:
            cache = model(canvas[:, :Lp], view.positions[:, :Lp], lay.mask(view.seg[:, :Lp]), cache,
                          logits_slice=(Lp - 1, 1)).cache
        return cache

    def forward(self, model, state, view, lay, config, span):
        W = self.window(lay, config)
        window_start = lay.decode_start + (state.block * config.block_length) // W * W
        start = window_start - lay.shift
        ids, pos, q_seg = view.window(state.canvas, start, W + lay.shift)
        # The window's slots keep this step's (not yet final) K/V: no later block can see them,
        # they are overwritten by the next step and by the finishing write, and keeping them lets
        # XLA update the carried cache in place instead of copying it every step.
        out = model(ids, pos, lay.mask(q_seg, q_offset=start), state.cache,
                    logits_slice=(block_start(state, lay, config) - window_start, config.block_length))
        return out.logits, out.cache, 1

    def after_commit(self, model, state, view, lay, config, block_full):
        """Once the last decoding block of a window is full, rewrite the window's K/V from its final
        tokens (the last step's K/V came from the canvas before that step's commits). One forward
        of W tokens, not in `nfe`. Skipped after the last window: nothing reads it."""
        W, bl = self.window(lay, config), config.block_length
        finished = block_full & ((state.block * bl) % W == 0) & (state.block < lay.num_blocks(bl))
        start = lay.decode_start + state.block * bl - W

        def write(cache):
            ids, pos, q_seg = view.window(state.canvas, start, W)
            return model(ids, pos, lay.mask(q_seg, q_offset=start), cache, logits_slice=(W - 1, 1)).cache

        return branching.cond(finished, write, lambda c: c, state.cache)


@dataclasses.dataclass(frozen=True)
class SetBlockCache(Cache):
    """Set Block Decoding (Gat, Ben-Hamu et al. 2025, Algorithm 3 and Fig. 10) over a causal model's
    exact K/V cache: the masked canvas decodes blocks of k = `block_length` MASK after the prompt.

    The cache only ever holds causally computed K/V. The prompt is prefilled causally, once (not in
    `nfe`; the whole bucketed prompt, so the prefill keeps the attention kernels' tile-aligned
    shapes). A block's first step feeds 2k tokens: the k tokens before it (the block just decided, or
    the prompt's last k, whose K/V it rewrites with the same values), causal, which writes their final
    K/V, fused with the block itself, whose tokens see every earlier token and each other; later steps
    feed the block alone over the cache. Every decided token's K/V are thus written from its final value, exactly
    once, in a counted forward: no separate commit forward, and next-token decoding of the same
    model (`jacobi`) is unchanged. Attention is the `tree` mask with one node of k tokens at the
    block: the keys before it causal, the node both ways.
    """

    name = "set_block"
    attentions = ("causal",)
    exact = True

    def init(self, model, canvas, view, lay, config):
        k, Lp = config.block_length, lay.decode_start
        if Lp < k:
            raise ConfigError(f"cache='set_block' re-encodes the {k} tokens before each block: prompts must be padded "
                              f"to at least block_length; pass prompt_bucket >= {k}")
        cache = model.init_cache(canvas.shape[0], lay.total)
        return model(canvas[:, :Lp], view.positions[:, :Lp], lay.mask(view.seg[:, :Lp]), cache,
                     logits_slice=(Lp - 1, 1)).cache

    def forward(self, model, state, view, lay, config, span):
        k = config.block_length
        start = block_start(state, lay, config)

        def feed(before: int):  # `before` tokens ahead of the block (causal), then the block
            def run(cache):
                ids, pos, q_seg = view.window(state.canvas, start - before, before + k)
                mask = MaskSpec(kind="tree", tree=(-1,), block_size=k, prefix_len=start, q_offset=start - before,
                                q_segment_ids=q_seg)
                return model(ids, pos, mask, cache, logits_slice=(before, k))
            return run

        # a block's first step also re-encodes the k tokens before it (their final K/V); later steps feed the block
        out = branching.cond(state.block_step == 0, feed(k), feed(0), state.cache)
        return out.logits, out.cache, 1


CACHES: Registry[Cache] = Registry("cache")
register_cache = CACHES.register  # makes `cls` selectable as SamplerConfig(cache=cls.name)
cache_class = CACHES.lookup

for _cls in (NoCache, PrefixCache, DualCache, BlockCache, SetBlockCache):
    register_cache(_cls)

