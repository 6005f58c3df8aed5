"""The GenMol canvas: the MASK tokens of a given canvas, decoded by GenMol's confidence sampler
(`policies/genmol.py`), with molecular context guidance.

GenMol poses every task as a canvas: each row is `[CLS] prompt_tokens [MASK]*n_row [SEP]`, right-padded
with PAD, n differing per row (`genmol_canvas` builds it; `sample_lengths` draws the n's as published);
the attention mask is `x != PAD`. The masked canvas cannot take such rows (its answer is `gen_length` MASK
after the prompt, the same for every row), so this canvas decodes **every MASK token of the prompt input**:

    ids, mask = genmol_canvas(prompts, num_masks, bos=1, eos=2, pad=3, mask=4)
    out = genmol_generate(Sampler(model), ids, mask, SamplerConfig.preset("genmol-motif"), key=key)
    out.tokens                                  # [B, L], the canvas with its MASKs decided

* A row whose prompt holds MASK tokens is a given canvas: those positions are decoded; the loop's
  `gen_length` answer columns after it are padding, never read or decoded (the presets set gen_length
  1, the least the loop takes; `genmol_generate` drops that column). A row without MASK is a plain prompt
  followed by `gen_length` MASK, decoded the same way (GenMol's rule as a general diffusion sampler).
* The prompt input is left-padded to the prompt bucket by the sampler; positions count real tokens
  only, so the model sees each row exactly as GenMol's right-padded canvas (PAD never attended,
  positions 0..len-1).
* Each step is one forward of the whole canvas (two with guidance, stacked into one call of 2B rows);
  the policy commits `tokens_per_step` MASK positions per row; a row is done when it has no MASK left
  and the loop ends when every row is. `nfe` counts forwards (2 per step with guidance).
* S (the noise's annealing length) is data: `Genmol.start` counts the MASKs of the starting canvas.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxdllm.decoding.canvas import Canvas, Footprint
from jaxdllm.decoding.policies.base import StepContext
from jaxdllm.decoding.policies.genmol import MASK_LOGIT_SHIFT, Genmol
from jaxdllm.decoding.state import DecodeState, commit_window
from jaxdllm.errors import ConfigError, InputError

PROMPT_COLUMNS = 512  # `max_steps` without a layout: a bound on a given canvas's columns


def genmol_canvas(prompts_ids: list[list[int]], num_masks: list[int], *, bos: int, eos: int, pad: int,
                  mask: int) -> tuple[np.ndarray, np.ndarray]:
    """GenMol's canvas (the published `_insert_mask`): row r is `[bos] prompts_ids[r] [mask]*num_masks[r]
    [eos]`, right-padded with `pad` to the longest row.

    Args:
      prompts_ids: B prompts, the token ids between BOS and EOS (a SAFE fragment and its trailing '.';
        [] for de novo). A prompt that already starts with `bos` / ends with `eos` (a tokenizer's
        encoding) is not wrapped again.
      num_masks: B counts of MASK tokens, one per row (`sample_lengths`).
      bos, eos, pad, mask: the special ids (GenMol's: [CLS] 1, [SEP] 2, [PAD] 3, [MASK] 4).

    Returns:
      `(ids [B, L] int32, attention_mask [B, L] int32)`, L the longest row; the mask is `ids != pad`.
    """
    if len(prompts_ids) != len(num_masks):
        raise InputError(f"{len(prompts_ids)} prompts but {len(num_masks)} mask counts")
    rows = []
    for prompt, n in zip(prompts_ids, num_masks):
        if n < 0:
            raise InputError(f"num_masks must be >= 0, got {n}")
        body = list(prompt)
        if body[:1] == [bos]:
            body = body[1:]
        if body[-1:] == [eos]:
            body = body[:-1]
        if pad in body or mask in body:
            raise InputError("a prompt holds the pad or mask id; pass the fragment's tokens only")
        rows.append([bos, *body, *([mask] * int(n)), eos])
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad, np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    return ids, (ids != pad).astype(np.int32)


def sample_lengths(length_pool, prompt_len: int, min_add_len: int, rng: np.random.Generator, num: int | None = None):
    """MASK counts as the published `_insert_mask`: max(choice(length_pool) - prompt_len, min_add_len).

    `length_pool`: the pool of molecule lengths (GenMol's `data/len.pk`); `prompt_len`: the prompt's
    length with BOS and EOS (as published: `len(x)` of the tokenized fragment); `min_add_len`: the task's
    (`policies.genmol.TASK_MIN_ADD_LEN`); `rng`: a `numpy.random.Generator`. Returns one int, or a list of
    `num` when given."""
    pool = np.asarray(length_pool)
    draws = rng.choice(pool, size=1 if num is None else num)
    counts = [max(int(d) - int(prompt_len), int(min_add_len)) for d in draws]
    return counts[0] if num is None else counts


def genmol_generate(sampler, input_ids, attention_mask, config, *, key=None):
    """Decode GenMol canvases (`genmol_canvas`) with `config` (a genmol preset) in the one compiled loop.

    `sampler`: a `jaxdllm.Sampler` of a bidirectional model (`Sampler(model)`, split once); `input_ids`,
    `attention_mask`: `[B, L]`. Returns the sampler's `GenerateResult` with the unused answer column
    dropped: `tokens [B, L]` the decoded canvases, `nfe [B]` each row's forwards, `commit_step [B, L]` the
    forward count that decided each token (0 for the given ones)."""
    out = sampler(input_ids, config, attention_mask, key=key)
    keep = slice(0, np.shape(input_ids)[1])
    return out._replace(tokens=out.tokens[:, keep], commit_step=out.commit_step[:, keep],
                        trajectory=None if out.trajectory is None else out.trajectory[..., keep],
                        initial=None if out.initial is None else out.initial[:, keep], prompt_len=keep.stop)


@struct.dataclass
class GenmolCarry:
    """The canvas's part of the loop carry (`DecodeState.cache`): `seg [B, T]` (0 on padding, on a given
    canvas's unused answer columns and past it), `positions [B, T]` (real tokens counted)."""

    seg: jax.Array
    positions: jax.Array


class GenmolCanvas(Canvas):
    """The MASK tokens of a given canvas (GenMol)."""

    name = "genmol_canvas"
    policy_base = Genmol
    diffusion_blocks = False
    unmasks = True

    def check_config(self, config) -> None:
        if config.cache.keeps_kv or not config.cache.exact or config.cfg_scale or config.stop_at_eos:
            raise ConfigError(f"policy {config.policy.name!r} reads the whole canvas each step and decodes every "
                              "MASK: leave cache='none', cfg_scale=0 and stop_at_eos=False")

    def check_model(self, model_config, config) -> None:
        if model_config.mask_token_id is None:
            raise ConfigError("the model config has no mask_token_id; set it (ModelConfig.mask_token_id) "
                              f"to decode with policy {config.policy.name!r}")
        if model_config.attention != "bidirectional":
            raise ConfigError(f"policy {config.policy.name!r} decodes bidirectional masked-diffusion models "
                              f"(GenMol's BERT); the model's attention is {model_config.attention!r}")

    def max_steps(self, config, lay=None) -> int:
        """Every step commits at least one MASK of each active row: the canvas's columns suffice."""
        return lay.total if lay is not None else PROMPT_COLUMNS + config.gen_length

    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """The whole canvas in each forward (twice with guidance); the float32 logits of every column, their
        log-softmax, the tempered copy and its token draws."""
        total = prompt_len + config.gen_length
        passes = config.policy.passes
        return Footprint(canvas=total, kv_slots=0, widest=passes * total, attended=total, logits=passes * total,
                         logit_copies=4)

    def comparison_presets(self, preset: str, gen_length: int, defaults: dict) -> dict:
        return {preset: (preset, {**defaults, "gen_length": gen_length})}

    @staticmethod
    def _specials(model) -> tuple[int, ...]:
        c = model.config
        return tuple(t for t in (c.bos_token_id, c.eos_token_id, c.pad_token_id, c.mask_token_id) if t is not None)

    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None) -> DecodeState:
        """The carry for `prompt [B, Lp]`: its MASK tokens (a given canvas) or, for a row without, `gen_length`
        MASK after it; rows with `valid [B]` False start done."""
        b, lp = prompt.shape
        g = lay.total - lp
        pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        real = view.seg[:, :lp] > 0
        given = (prompt == lay.mask_id) & real
        is_given = given.any(1)
        answer = jnp.broadcast_to(jnp.where(is_given, pad, lay.mask_id)[:, None], (b, g)).astype(prompt.dtype)
        canvas = jnp.concatenate([prompt, answer], 1)
        undecided = jnp.concatenate([given, jnp.broadcast_to(~is_given[:, None], (b, g))], 1) & valid[:, None]
        seg = view.seg * jnp.concatenate([jnp.ones((b, lp), bool), jnp.broadcast_to(~is_given[:, None], (b, g))], 1)
        positions = jnp.maximum(jnp.cumsum(seg, axis=1) - 1, 0)
        done = ~valid | ~undecided.any(1)
        return DecodeState.start(canvas, undecided, done=done, key=key, cache=GenmolCarry(seg, positions),
                                 policy_state=config.policy.start(undecided), max_trajectory=config.max_trajectory)

    def logits(self, model, state: DecodeState, lay, config, key):
        """`(logits [B, T, V], passes, poor [B, T] or None)`: the step's logits (guided: w * logits(x) +
        (1 - w) * logits(x_poor), x_poor the canvas with the `poor` positions set to MASK), MASK logit
        lowered by 1e6."""
        policy, carry, x = config.policy, state.cache, state.canvas
        seg, positions = carry.seg, carry.positions
        poor = None
        if policy.guidance_gamma > 0:
            context = (seg > 0) & ~jnp.isin(x, jnp.asarray(self._specials(model), x.dtype))
            poor = policy.poor_positions(context, jax.random.fold_in(key, 2))
            x = jnp.concatenate([x, jnp.where(poor, lay.mask_id, x)])
            seg, positions = jnp.concatenate([seg, seg]), jnp.concatenate([positions, positions])
        logits = model(x, positions, lay.mask(seg, seg)).logits
        if poor is not None:
            logits = policy.guide(*jnp.split(logits, 2))
        return logits.at[..., lay.mask_id].add(MASK_LOGIT_SHIFT), policy.passes, poor

    def step(self, model, state: DecodeState, view, lay, config, policy_params=None) -> DecodeState:
        """The forward(s) of the whole canvas, the policy's commit of each row's MASK positions, and the rows
        that have none left finished."""
        key = jax.random.fold_in(state.key, state.step)
        logits, passes, _ = self.logits(model, state, lay, config, key)
        candidates = state.undecided & ~state.done[:, None]
        nfe = state.nfe + passes * candidates.any(1).astype(jnp.int32)
        ctx = StepContext(config=config, block=state.block, block_step=state.step, key=key,
                          state=state.policy_state, eos_eot_ids=lay.eos_eot, eos_id=lay.eos_id,
                          undecided=state.undecided, block_tokens=state.canvas, decoding=~state.done,
                          answer=candidates)
        decision = config.policy.commit(logits, candidates, ctx)
        state = commit_window(state.replace(nfe=nfe, policy_state=decision.state), 0,
                              decision.commit & candidates, decision.tokens, nfe)
        return state.replace(done=state.done | ~state.undecided.any(1), block_step=state.step + 1)
