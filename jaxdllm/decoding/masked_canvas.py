"""The masked canvas (diffusion decoding): the answer starts as MASK and is decided block by block.

Every row decodes the same block at a time (blocks advance once no row has an undecided position
left in the current one), but rows commit, count forwards (NFE) and stop independently, so each
row's result equals decoding that row alone. Each step: the cache gives the block's logits, the
policy picks what to commit, and the shared state updates do the bookkeeping.

Block-causal models (`ModelConfig.attention == "block_causal"`) decode in their published layout
(`jaxdllm.decoding.layout`): a row's blocks sit at absolute positions from the start of its
sequence, decoding starts in the block that holds the end of its prompt (the prompt tokens there
are never changed), and a row decodes to the end of the block that holds its last generated
position (up to a block more than `gen_length`, dropped from the result, as the published loops
do). With `stop_at_eos="block"` a row stops once the block holding its EOS is finished (the
published LLaDA2 loops); with `stop_at_eos=True`, as soon as its EOS and everything before it are
decided.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxdllm.decoding.canvas import Canvas, Footprint
from jaxdllm.decoding.layout import answer_columns, block_lead, block_unit, slice_window
from jaxdllm.decoding.policies import Policy, StepContext
from jaxdllm.decoding.state import (DecodeState, commit_window, fill_answer, stop_after_eos_block,
                                    stop_at_eos)
from jaxdllm.errors import ConfigError


class MaskedCanvas(Canvas):
    """The MASK canvas (LLaDA, Dream, block diffusion)."""

    name = "masked_canvas"
    policy_base = Policy
    unmasks = True
    block_layout = True  # block-causal models decode in the published block layout (`layout.py`)

    def check_config(self, config) -> None:
        if config.policy.answer_logits and not config.cache.answer_logits:
            raise ConfigError(f"policy={config.policy.name!r} reads the whole answer's logits; use cache='none'")

    def check_model(self, model_config, config) -> None:
        if model_config.mask_token_id is None:
            raise ConfigError("the model config has no mask_token_id; set it (ModelConfig.mask_token_id) "
                              "to decode with a diffusion sampler")
        if model_config.attention not in ("bidirectional", "block_causal") + config.cache.attentions:
            raise ConfigError(f"policy={config.policy.name!r} decodes diffusion models (bidirectional or "
                              f"block_causal attention); the model's attention is {model_config.attention!r} "
                              "(causal models decode with policy='jacobi', or, trained for Set Block Decoding, "
                              "with cache='set_block')")
        config.cache.check_model(model_config, config)
        # A block-causal model decodes any gen_length (to the end of the block that holds the last
        # answer position, as the published loops); a bidirectional one decodes whole blocks.
        if model_config.attention != "block_causal" and config.gen_length % config.block_length:
            divisors = [d for d in range(1, config.gen_length + 1) if config.gen_length % d == 0]
            raise ConfigError(f"gen_length ({config.gen_length}) must be a multiple of block_length "
                              f"({config.block_length}): pass block_length= one of {divisors[-6:]}")

    def max_steps(self, config, lay=None) -> int:
        """A bound on the loop's steps (without `lay`: for any prompt, a block-causal canvas's
        extra block included)."""
        # Every step commits at least one token of every active row, so one step per decoded column
        # and per block always suffices (plus what a policy that holds blocks open adds); the
        # bound only guards against a policy bug. The lead block is at most gen_length wide.
        width = 2 * config.gen_length if lay is None else lay.decode_width
        return width + width // config.block_length * (1 + config.policy.extra_steps_per_block())

    def canvas_columns(self, model_config, config, prompt_len: int) -> int:
        """Columns of the canvas for prompts of `prompt_len` tokens: a block-causal model's prompt in whole
        blocks, the block that holds its tail, then the answer."""
        unit = block_unit(model_config, config)
        lead = block_lead(model_config, config)
        return prompt_len // unit * unit + lead + answer_columns(config.gen_length, lead)

    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """The whole canvas in the widest forward; K/V of every column where the cache keeps them; the
        logits and probabilities of one block."""
        total = self.canvas_columns(model_config, config, prompt_len)
        return Footprint(canvas=total, kv_slots=total if config.cache.keeps_kv else 0, widest=total, attended=total,
                         logits=config.block_length)

    def comparison_presets(self, preset: str, gen_length: int, defaults: dict) -> dict:
        """One token per step (`llada`) against Fast-dLLM's threshold, each over one block of the answer."""
        g = gen_length
        return {"llada": ("llada", dict(gen_length=g, block_length=g, steps=g)),
                "threshold": ("fast-dllm-parallel", dict(gen_length=g, block_length=g))}

    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None) -> DecodeState:
        """The carry for `prompt [B, Lp]` followed by G MASK (the answer: `view.answer`); rows with
        `valid [B]` False start done."""
        b, G = prompt.shape[0], lay.total - prompt.shape[1]  # gen_length (in whole blocks: block layout)
        canvas = jnp.concatenate([prompt, jnp.full((b, G), lay.mask_id, prompt.dtype)], 1)
        undecided = view.answer
        return DecodeState.start(
            canvas, undecided, done=~valid, key=key, cache=config.cache.init(model, canvas, view, lay, config),
            policy_state=config.policy.init_state(b, config.block_length, model.config.vocab_size),
            max_trajectory=config.max_trajectory)

    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        """One forward of the current block, the policy's commit, and the bookkeeping."""
        policy, bl, first = config.policy, config.block_length, lay.decode_start
        start = first + state.block * bl
        span = "answer" if policy.answer_logits else "block"
        logits, cache, passes = config.cache.forward(model, state, view, lay, config, span)
        # MASK is never a prediction: a committed position must not stay masked (the published
        # while-block-has-masks loops would never end, the fixed schedules would emit MASK).
        logits = logits.at[..., lay.mask_id].set(-jnp.inf)
        answer_logits = None
        if span == "answer":
            answer_logits, logits = logits, jax.lax.dynamic_slice_in_dim(logits, state.block * bl, bl, axis=1)

        candidates = slice_window(state.undecided, start, bl) & ~state.done[:, None]
        working = candidates.any(1)
        holding = policy.holding(state.policy_state)
        if holding is not None:  # rows still re-deciding a block with no mask left also pay for this forward
            working = working | (holding & ~state.done)
        nfe = state.nfe + passes * working.astype(jnp.int32)
        ctx = StepContext(config=config, block=state.block, block_step=state.block_step,
                          key=jax.random.fold_in(state.key, state.step), state=state.policy_state,
                          eos_eot_ids=lay.eos_eot, eos_id=lay.eos_id, policy_params=policy_params,
                          answer_logits=answer_logits, undecided=state.undecided[:, first:],
                          block_tokens=slice_window(state.canvas, start, bl), decoding=~state.done,
                          answer=slice_window(view.answer, start, bl))
        decision = policy.commit(logits, candidates, ctx)

        state = commit_window(state.replace(nfe=nfe, cache=cache, policy_state=decision.state),
                              start, decision.commit, decision.tokens, nfe)
        if decision.fill is not None:
            state = fill_answer(state, decision.fill & view.answer[:, first:], decision.fill_tokens, first, nfe)
        if decision.stop is not None:
            state = state.replace(done=state.done | decision.stop)
        if config.stop_at_eos is True:
            state = stop_at_eos(state, lay.eos_id, view.answer)

        holding = policy.holding(decision.state)
        finished = ~state.undecided.any(1)  # e.g. an end-of-text cut decided it all
        if holding is not None:
            finished = finished & ~holding
        state = state.replace(done=state.done | finished)
        block_full = ~(slice_window(state.undecided, start, bl) & ~state.done[:, None]).any()
        if holding is not None:
            block_full = block_full & ~(holding & ~state.done).any()
        if config.stop_at_eos == "block":
            state = stop_after_eos_block(state, lay.eos_id, view.answer, start + bl, block_full)
        block = state.block + block_full.astype(jnp.int32)
        state = state.replace(done=state.done | (block >= lay.num_blocks(bl)), block=block,
                              block_step=jnp.where(block_full, 0, state.block_step + 1))
        state = state.replace(cache=config.cache.after_commit(model, state, view, lay, config, block_full))
        return state

