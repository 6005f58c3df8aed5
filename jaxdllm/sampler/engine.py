"""The compiled sampler: one `jax.jit` holding one `jax.lax.while_loop`, one forward per iteration.

Every row of the batch decodes the same block at a time (blocks advance once no row has a
mask left in the current one), but rows commit, count forwards (NFE) and stop independently,
so each row's result equals decoding that row alone. Policy (`policies.py`), block schedule
and cache are separate pieces of the step; the loop only carries `SamplerState`.

Prompts are left-padded to a multiple of `SamplerConfig.prompt_bucket` with segment id 0 and
logical RoPE positions, so padding changes neither the mask nor the positions a row sees, and
a new prompt in the same bucket reuses the compiled loop.

Block-causal models (block diffusion, `ModelConfig.attention == "block_causal"`): the model's
blocks are physical canvas positions, so the prompt is padded to a multiple of the model's
`block_size` too and the generation starts on a block boundary. A row's blocks are then counted
back from the end of its prompt (its first prompt block partial), whatever the padding, so a row
decodes the same in any batch. (Fast-dLLM v2's own loop counts blocks from the prompt start and
shares the prompt's last partial block with the first generated tokens; one block schedule for a
left-padded batch cannot do that.) `cache="none"` runs the whole canvas under the block-causal
mask each step; `cache="block"` is the exact KV cache of finished blocks (see `_forward`).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from jaxdllm.attention import MaskSpec
from jaxdllm.models.cache import KVCache
from jaxdllm.errors import ConfigError
from jaxdllm.models.transformer import Transformer
from jaxdllm.sampler import policies
from jaxdllm.sampler.config import SamplerConfig


@struct.dataclass
class SamplerState:
    """The while-loop carry.

    Attributes:
      canvas: `[B, T]` tokens (prompt, then the generation region, MASK where undecided).
      commit_step: `[B, T]` the row's NFE count at the forward that committed each token
        (0 for the prompt).
      nfe: `[B]` decoding forward passes that row took part in (a CFG step counts 2). The
        cache fills of `cache="block"` (prompt prefill, finished-window writes) commit nothing
        and are not counted, so `nfe` and `commit_step` equal those of `cache="none"`.
      done: `[B]` rows that are finished.
      step, block, block_step: loop iteration, current block, iterations within the block.
      key: PRNG key; cache: `KVCache` or None; policy_state: per-policy carry.
      trajectory: `[B, max_trajectory, T]` canvas after each step (-1 where not reached).
    """

    canvas: jax.Array
    commit_step: jax.Array
    nfe: jax.Array
    done: jax.Array
    step: jax.Array
    block: jax.Array
    block_step: jax.Array
    key: jax.Array
    cache: KVCache | None
    policy_state: jax.Array
    trajectory: jax.Array


class GenerateResult(NamedTuple):
    """Host (numpy) results of one generation."""

    tokens: np.ndarray        # [B, Lp + G]
    nfe: np.ndarray           # [B]
    commit_step: np.ndarray   # [B, Lp + G]
    trajectory: np.ndarray | None  # [B, max_trajectory, Lp + G] or None
    steps: int                # loop iterations (forwards of the whole batch)


class _Layout(NamedTuple):
    """Static facts of one compiled generation."""

    prompt_len: int   # bucketed prompt length
    total: int        # prompt_len + gen_length
    mask_id: int
    shift: int        # 1 for token-shifted models
    eos_eot: tuple[int, ...]
    eos_id: int | None
    attention: str = "bidirectional"  # the model's mask kind: bidirectional or block_causal
    block_size: int | None = None     # the model's block size (block_causal)
    window: int = 0                   # cache="block": tokens fed per step, max(block_length, block_size)


def validate(model: Transformer, prompt_len: int, config: SamplerConfig) -> None:
    """Errors a user can act on, raised before anything compiles."""
    mc = model.config
    if mc.mask_token_id is None:
        raise ConfigError("the model config has no mask_token_id; set it (ModelConfig.mask_token_id) "
                          "to decode with a diffusion sampler")
    if mc.attention not in ("bidirectional", "block_causal"):
        raise ConfigError(f"this sampler decodes diffusion models (bidirectional or block_causal attention); "
                          f"the model's attention is {mc.attention!r}")
    if mc.attention == "bidirectional" and config.cache == "block":
        raise ConfigError("cache='block' caches the finished blocks of a block-causal model; this model is "
                          "bidirectional: use cache='none', 'prefix' or 'dual'")
    if mc.attention == "block_causal" and config.cache in ("prefix", "dual"):
        raise ConfigError(f"cache={config.cache!r} is Fast-dLLM's approximate cache for bidirectional models; "
                          "a block-causal model decodes exactly with cache='block' (or 'none')")
    if config.cache == "block":
        bl, bs, G = config.block_length, mc.block_size, config.gen_length
        if bl % bs and bs % bl:
            raise ConfigError(f"cache='block' needs block_length ({bl}) to be a multiple or a divisor of the "
                              f"model's block_size ({bs})")
        if G % bs:
            raise ConfigError(f"cache='block' needs gen_length ({G}) to be a multiple of the model's "
                              f"block_size ({bs})")
    if prompt_len + config.gen_length > mc.max_position:
        raise ConfigError(f"prompt ({prompt_len} tokens after bucketing) + gen_length ({config.gen_length}) "
                          f"exceeds the model's max_position ({mc.max_position})")
    if config.stop_at_eos and mc.eos_token_id is None:
        raise ConfigError("stop_at_eos needs the model config's eos_token_id")
    if config.policy == "prophet" and config.cache != "none":
        raise ConfigError("policy='prophet' reads the whole answer's logits; use cache='none'")


def _forward(model: Transformer, state: SamplerState, seg, positions, lay: _Layout, config: SamplerConfig):
    """One model pass for the current block. Returns (block logits `[B, bl, V]`, answer logits
    `[B, G, V]` or None, cache, forward passes per active row)."""
    bl, G, Lp, T, shift = config.block_length, config.gen_length, lay.prompt_len, lay.total, lay.shift
    block_start = Lp + state.block * bl
    spec = MaskSpec(kind=lay.attention, block_size=lay.block_size, q_segment_ids=seg, kv_segment_ids=seg)

    if config.cache == "none":
        canvas = state.canvas
        if config.cfg_scale > 0:  # unconditional copy: the prompt replaced by MASK
            uncond = jnp.where(jnp.arange(T) < Lp, lay.mask_id, canvas)
            canvas = jnp.concatenate([canvas, uncond])
            spec = spec.replace(q_segment_ids=jnp.concatenate([seg, seg]),
                                kv_segment_ids=jnp.concatenate([seg, seg]))
            positions = jnp.concatenate([positions, positions])
        if config.policy == "prophet":
            logits = model(canvas, positions, spec, logits_slice=(Lp - shift, G))
        else:
            logits = model(canvas, positions, spec, logits_slice=(block_start - shift, bl))
        if config.cfg_scale > 0:
            cond, un = jnp.split(logits, 2)
            logits = un + (config.cfg_scale + 1.0) * (cond - un)
        if config.policy == "prophet":
            block_logits = jax.lax.dynamic_slice_in_dim(logits, state.block * bl, bl, axis=1)
            return block_logits, logits, None, 2 if config.cfg_scale > 0 else 1
        return logits, None, None, 2 if config.cfg_scale > 0 else 1

    if config.cache == "block":
        # Exact: under block-causal attention the K/V of a finished block depend only on the
        # finished tokens at and before it, and the cache holds them (prompt prefill in `_init`,
        # each finished window rewritten from its final tokens in `_write_finished_window`).
        # A step feeds only the current window: the model block(s) holding the decoding block,
        # W = max(block_length, block_size) tokens; with W > block_length (Fast-dLLM v2
        # sub-blocks) the later sub-blocks' masks are in view, as in the full-canvas forward.
        # Token-shifted models also feed the token before the window, whose logit predicts the
        # window's first token; it rewrites its own slot with the same K/V (its keys are final).
        W = lay.window
        window_start = Lp + (state.block * bl) // W * W
        start = window_start - shift
        ids = jax.lax.dynamic_slice_in_dim(state.canvas, start, W + shift, axis=1)
        pos = jax.lax.dynamic_slice_in_dim(positions, start, W + shift, axis=1)
        q_seg = jax.lax.dynamic_slice_in_dim(seg, start, W + shift, axis=1)
        spec = MaskSpec(kind="block_causal", block_size=lay.block_size, q_offset=start, q_segment_ids=q_seg)
        # The window's slots keep this step's (not yet final) K/V: no later block can see them,
        # they are overwritten by the next step and by the finishing write, and keeping them lets
        # XLA update the carried cache in place instead of copying it every step.
        logits, cache = model(ids, pos, spec, state.cache, logits_slice=(block_start - window_start, bl))
        return logits, None, cache, 1

    refresh = state.block_step == 0
    if config.cache_refresh_every_step:
        refresh = jnp.bool_(True)

    def full(cache):
        return model(state.canvas, positions, spec, cache, logits_slice=(block_start - shift, bl))

    if config.cache == "dual":
        def cached(cache):  # only the block (and, shifted, the token before it); the rest is cached
            start = block_start - shift
            ids = jax.lax.dynamic_slice_in_dim(state.canvas, start, bl + shift, axis=1)
            pos = jax.lax.dynamic_slice_in_dim(positions, start, bl + shift, axis=1)
            q_seg = jax.lax.dynamic_slice_in_dim(seg, start, bl + shift, axis=1)
            return model(ids, pos, MaskSpec(kind="bidirectional", q_offset=start, q_segment_ids=q_seg),
                         cache, logits_slice=(0, bl))
    else:  # prefix: the block and everything after it, as a fixed window of G (+ shift) tokens
        def cached(cache):
            width = G + shift
            start = block_start - shift
            pad = jnp.full((state.canvas.shape[0], G), lay.mask_id, state.canvas.dtype)
            ids = jax.lax.dynamic_slice_in_dim(jnp.concatenate([state.canvas, pad], 1), start, width, axis=1)
            pos_ext = jnp.concatenate([positions, positions[:, -1:] + 1 + jnp.arange(G)], 1)
            pos = jax.lax.dynamic_slice_in_dim(pos_ext, start, width, axis=1)
            seg_ext = jnp.concatenate([seg, jnp.zeros_like(pad)], 1)  # window tail past T: invisible
            q_seg = jax.lax.dynamic_slice_in_dim(seg_ext, start, width, axis=1)
            return model(ids, pos, MaskSpec(kind="bidirectional", q_offset=start, q_segment_ids=q_seg),
                         cache, logits_slice=(0, bl))

    logits, cache = jax.lax.cond(refresh, full, cached, state.cache)
    return logits, None, cache, 1


def _step(model: Transformer, state: SamplerState, seg, positions, lay: _Layout,
          config: SamplerConfig, learned_filter=None) -> SamplerState:
    """One loop iteration: forward, commit, bookkeeping."""
    bl, Lp, G = config.block_length, lay.prompt_len, config.gen_length
    block_start = Lp + state.block * bl
    logits, answer_logits, cache, passes = _forward(model, state, seg, positions, lay, config)
    # MASK is never a prediction: a committed position must not stay masked (the published
    # while-block-has-masks loops would never end, the fixed schedules would emit MASK).
    logits = logits.at[..., lay.mask_id].set(-jnp.inf)
    if answer_logits is not None:
        answer_logits = answer_logits.at[..., lay.mask_id].set(-jnp.inf)

    block_tokens = jax.lax.dynamic_slice_in_dim(state.canvas, block_start, bl, axis=1)
    candidates = (block_tokens == lay.mask_id) & ~state.done[:, None]
    active = candidates.any(axis=1)
    nfe = state.nfe + passes * active.astype(jnp.int32)
    ctx = policies.StepContext(config, state.block_step, jax.random.fold_in(state.key, state.step),
                               state.policy_state, lay.eos_eot, learned_filter, lay.eos_id)
    decision = policies.POLICY_FNS[config.policy](logits, candidates, ctx)

    new_block = jnp.where(decision.commit, decision.tokens, block_tokens)
    canvas = jax.lax.dynamic_update_slice_in_dim(state.canvas, new_block, block_start, axis=1)
    old_steps = jax.lax.dynamic_slice_in_dim(state.commit_step, block_start, bl, axis=1)
    commit_step = jax.lax.dynamic_update_slice_in_dim(
        state.commit_step, jnp.where(decision.commit, nfe[:, None], old_steps), block_start, axis=1)
    done = state.done
    gen = jnp.arange(lay.total) >= Lp

    if decision.eos_cut is not None:  # Learn2PD EoTP: an accepted EOS truncates the answer there
        cut = jnp.where(decision.eos_cut >= 0, block_start + decision.eos_cut, lay.total)
        after = gen[None] & (jnp.arange(lay.total)[None] > cut[:, None])
        canvas = jnp.where(after, lay.eos_id, canvas)
        commit_step = jnp.where(after, nfe[:, None], commit_step)

    if config.policy == "prophet":  # early commit: fill every mask of the answer with its argmax
        gap = policies.prophet_gap(answer_logits)
        early = active & (gap >= policies.prophet_threshold(config, state.block * config.steps_per_block
                                                                 + state.block_step))
        fill = jnp.argmax(answer_logits, axis=-1).astype(canvas.dtype)
        fill = jnp.concatenate([jnp.zeros((canvas.shape[0], Lp), canvas.dtype), fill], 1)
        to_fill = early[:, None] & gen[None] & (canvas == lay.mask_id)
        canvas = jnp.where(to_fill, fill, canvas)
        commit_step = jnp.where(to_fill, nfe[:, None], commit_step)
        done = done | early

    if config.stop_at_eos:  # done once EOS is committed with nothing undecided before it
        is_eos = gen[None] & (canvas == lay.eos_id)
        first_eos = jnp.where(is_eos.any(1), jnp.argmax(is_eos, axis=1), lay.total)
        undecided_before = (gen[None] & (canvas == lay.mask_id)
                            & (jnp.arange(lay.total)[None] < first_eos[:, None])).any(1)
        stop = is_eos.any(1) & ~undecided_before & ~done
        to_fill = stop[:, None] & (canvas == lay.mask_id)
        canvas = jnp.where(to_fill, lay.eos_id, canvas)
        commit_step = jnp.where(to_fill, nfe[:, None], commit_step)
        done = done | stop

    remaining = jax.lax.dynamic_slice_in_dim(canvas, block_start, bl, axis=1) == lay.mask_id
    block_full = ~(remaining & ~done[:, None]).any()
    block = state.block + block_full.astype(jnp.int32)
    done = done | (block >= config.num_blocks)
    if config.cache == "block":
        cache = _write_finished_window(model, cache, canvas, seg, positions, lay, config, block, block_full)
    trajectory = state.trajectory
    if config.max_trajectory:
        slot = jnp.minimum(state.step, config.max_trajectory - 1)
        kept = jax.lax.dynamic_index_in_dim(trajectory, slot, axis=1, keepdims=False)
        row = jnp.where(state.step < config.max_trajectory, canvas, kept)  # past the end: no-op
        trajectory = jax.lax.dynamic_update_index_in_dim(trajectory, row, slot, axis=1)
    return state.replace(
        canvas=canvas, commit_step=commit_step, nfe=nfe, done=done, step=state.step + 1,
        block=block, block_step=jnp.where(block_full, 0, state.block_step + 1), cache=cache,
        policy_state=decision.policy_state, trajectory=trajectory)


def _write_finished_window(model: Transformer, cache: KVCache, canvas, seg, positions, lay: _Layout,
                           config: SamplerConfig, block, block_full) -> KVCache:
    """`cache="block"`: once the last decoding block of a window is full, rewrite the window's
    K/V from its final tokens (the last step's K/V came from the canvas before that step's
    commits). One forward of W tokens, not in `nfe` (it commits nothing). Skipped after the
    last window: nothing reads it."""
    W, bl = lay.window, config.block_length
    finished = block_full & ((block * bl) % W == 0) & (block < config.num_blocks)
    start = lay.prompt_len + block * bl - W

    def write(cache):
        ids = jax.lax.dynamic_slice_in_dim(canvas, start, W, axis=1)
        pos = jax.lax.dynamic_slice_in_dim(positions, start, W, axis=1)
        q_seg = jax.lax.dynamic_slice_in_dim(seg, start, W, axis=1)
        spec = MaskSpec(kind="block_causal", block_size=lay.block_size, q_offset=start, q_segment_ids=q_seg)
        return model(ids, pos, spec, cache, logits_slice=(W - 1, 1))[1]

    return jax.lax.cond(finished, write, lambda c: c, cache)


def _init(model: Transformer, prompt, seg, positions, key, lay: _Layout, config: SamplerConfig) -> SamplerState:
    """The initial carry; `seg`, `positions`: `[B, T]` segment ids and RoPE positions of the canvas."""
    b = prompt.shape[0]
    G, T, bl, Lp = config.gen_length, lay.total, config.block_length, lay.prompt_len
    canvas = jnp.concatenate([prompt, jnp.full((b, G), lay.mask_id, prompt.dtype)], 1)
    cache = None
    if config.cache == "block":  # prefill: the prompt's K/V, once (not a decoding step: not in nfe)
        cache = KVCache.init(model.config, b, T)
        if Lp:
            spec = MaskSpec(kind="block_causal", block_size=lay.block_size, q_segment_ids=seg[:, :Lp])
            cache = model(prompt, positions[:, :Lp], spec, cache, logits_slice=(Lp - 1, 1))[1]
    elif config.cache != "none":
        # prefix windows reach G slots past the canvas; they stay empty (segment 0)
        cache = KVCache.init(model.config, b, T + (G if config.cache == "prefix" else 0))
    policy_state = (jnp.zeros((b, bl, model.config.vocab_size), jnp.float32)
                    if config.policy == "credit" else jnp.zeros((), jnp.float32))
    return SamplerState(
        canvas=canvas, commit_step=jnp.zeros((b, T), jnp.int32), nfe=jnp.zeros((b,), jnp.int32),
        done=jnp.zeros((b,), bool), step=jnp.int32(0), block=jnp.int32(0), block_step=jnp.int32(0),
        key=key, cache=cache, policy_state=policy_state,
        trajectory=jnp.full((b, config.max_trajectory, T), -1, jnp.int32))


def _segments_and_positions(seg_prompt, G):
    seg = jnp.concatenate([seg_prompt, jnp.ones((seg_prompt.shape[0], G), jnp.int32)], 1)
    positions = jnp.maximum(jnp.cumsum(seg, axis=1) - 1, 0)
    return seg, positions


def _merge_filter(filter_def, filter_state):
    return None if filter_def is None else nnx.merge(filter_def, filter_state)


@functools.partial(jax.jit, static_argnames=("graphdef", "lay", "config", "filter_def"))
def _generate_compiled(graphdef, params, prompt, seg_prompt, key, filter_state=None, *, lay: _Layout,
                       config: SamplerConfig, filter_def=None):
    model = nnx.merge(graphdef, params)
    learned_filter = _merge_filter(filter_def, filter_state)
    seg, positions = _segments_and_positions(seg_prompt, config.gen_length)
    state = _init(model, prompt, seg, positions, key, lay, config)
    # Every iteration commits at least one token of every active row, so G + blocks
    # iterations always suffice; the bound only guards against a policy bug.
    limit = config.gen_length + config.num_blocks
    state = jax.lax.while_loop(lambda s: ~jnp.all(s.done) & (s.step < limit),
                               lambda s: _step(model, s, seg, positions, lay, config, learned_filter), state)
    return state


def _prepare(model: Transformer, input_ids, attention_mask, config: SamplerConfig):
    # Prompts are host data: pad them with numpy so no eager device op (and no compile) runs.
    ids = np.asarray(input_ids, np.int32)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, prompt_len], got shape {ids.shape}")
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, np.int32)
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask shape {mask.shape} != input_ids shape {ids.shape}")
    lp = ids.shape[1]
    mc = model.config
    # block-causal: the generation must start on a model block boundary (see the module docstring)
    bucket = (math.lcm(config.prompt_bucket, mc.block_size) if mc.attention == "block_causal"
              else config.prompt_bucket)
    extra = -lp % bucket
    validate(model, lp + extra, config)
    pad_id = mc.pad_token_id if mc.pad_token_id is not None else 0
    ids = np.pad(ids, ((0, 0), (extra, 0)), constant_values=pad_id)
    mask = np.pad(mask, ((0, 0), (extra, 0)))
    eos_eot = tuple(t for t in (mc.eos_token_id, mc.eot_token_id) if t is not None)
    lay = _Layout(prompt_len=lp + extra, total=lp + extra + config.gen_length, mask_id=mc.mask_token_id,
                  shift=int(mc.shift_logits), eos_eot=eos_eot, eos_id=mc.eos_token_id,
                  attention=mc.attention, block_size=mc.block_size,
                  window=max(config.block_length, mc.block_size) if config.cache == "block" else 0)
    return ids, mask, lay, extra


def _result(state: SamplerState, extra: int, config: SamplerConfig) -> GenerateResult:
    """Fetch the outputs in one transfer and drop the bucket padding on the host (slicing on
    the device would compile a kernel per prompt length)."""
    canvas, commit_step, nfe, trajectory, steps = jax.device_get(
        (state.canvas, state.commit_step, state.nfe, state.trajectory, state.step))
    return GenerateResult(
        tokens=canvas[:, extra:], nfe=nfe, commit_step=commit_step[:, extra:],
        trajectory=trajectory[:, :, extra:] if config.max_trajectory else None, steps=int(steps))


def _split_filter(learned_filter, config: SamplerConfig):
    if (learned_filter is None) != (config.policy != "learn2pd"):
        raise ConfigError("policy='learn2pd' needs learned_filter=<module>, and only it takes one")
    return (None, None) if learned_filter is None else nnx.split(learned_filter)


def generate(model: Transformer, input_ids, config: SamplerConfig, attention_mask=None, *,
             key: jax.Array | None = None, learned_filter: nnx.Module | None = None) -> GenerateResult:
    """Decode `gen_length` tokens after each prompt in one compiled call.

    Args:
      model: a diffusion `Transformer` with a `mask_token_id`: bidirectional (LLaDA, Dream) or
        block-causal (block diffusion, Fast-dLLM v2; `cache="none"` or the exact `"block"`).
      input_ids: `[B, Lp]` prompts, left-padded where lengths differ.
      config: a `SamplerConfig` (see `SamplerConfig.preset`).
      attention_mask: `[B, Lp]` 1 for prompt tokens, 0 for left padding; default all ones.
      key: PRNG key for temperature sampling and random remasking (default `PRNGKey(0)`).
      learned_filter: for `policy="learn2pd"`, a module mapping `[B, block_length]` top-1
        probabilities to accept logits of the same shape.

    Returns:
      `GenerateResult(tokens [B, Lp+G], nfe [B], commit_step [B, Lp+G], trajectory, steps)`.
    """
    filter_def, filter_state = _split_filter(learned_filter, config)
    ids, mask, lay, extra = _prepare(model, input_ids, attention_mask, config)
    graphdef, params = nnx.split(model)
    key = jax.random.PRNGKey(0) if key is None else key
    state = _generate_compiled(graphdef, params, ids, mask, key, filter_state, lay=lay, config=config,
                               filter_def=filter_def)
    return _result(state, extra, config)


@functools.partial(jax.jit, static_argnames=("graphdef", "lay", "config"))
def _init_compiled(graphdef, params, prompt, seg_prompt, key, *, lay, config):
    seg, positions = _segments_and_positions(seg_prompt, config.gen_length)
    return _init(nnx.merge(graphdef, params), prompt, seg, positions, key, lay, config)


@functools.partial(jax.jit, static_argnames=("graphdef", "lay", "config", "filter_def"))
def _step_compiled(graphdef, params, state, seg_prompt, filter_state=None, *, lay, config, filter_def=None):
    seg, positions = _segments_and_positions(seg_prompt, config.gen_length)
    return _step(nnx.merge(graphdef, params), state, seg, positions, lay, config,
                 _merge_filter(filter_def, filter_state))


def generate_stepwise(model: Transformer, input_ids, config: SamplerConfig, attention_mask=None, *,
                      key: jax.Array | None = None, learned_filter: nnx.Module | None = None) -> GenerateResult:
    """The same decoding as `generate`, driven by a Python loop that calls a jitted step and
    reads `done` back each iteration (one dispatch and one host sync per step). For benchmarks."""
    filter_def, filter_state = _split_filter(learned_filter, config)
    ids, mask, lay, extra = _prepare(model, input_ids, attention_mask, config)
    graphdef, params = nnx.split(model)
    key = jax.random.PRNGKey(0) if key is None else key
    state = _init_compiled(graphdef, params, ids, mask, key, lay=lay, config=config)
    limit = config.gen_length + config.num_blocks
    while not bool(jnp.all(state.done)) and int(state.step) < limit:
        state = _step_compiled(graphdef, params, state, mask, filter_state, lay=lay, config=config,
                               filter_def=filter_def)
    return _result(state, extra, config)
