"""What a canvas is: the abstract base every canvas derives from, its registry, and the footprint a
canvas reports to the memory plan.

A canvas is how the answer starts and how one step of the compiled loop changes it (MASK decided
block by block, a draft verified by a causal model, uniform noise denoised, ...). The loop calls a
canvas only through `init`, `step` and `max_steps`; everything else a caller needs to know about a
canvas, it asks the canvas (`footprint`, `resized_block_length`, `comparison_presets`, `block_layout`),
so no caller compares canvas names. A policy names its canvas (`Policy.canvas`) and must derive from
the canvas's `policy_base`.

A new canvas is one module with a `Canvas` subclass and one `register_canvas` line
(`jaxdllm/decoding/canvases.py`); registration refuses a class that leaves a hook abstract.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

from jaxdllm.errors import ConfigError
from jaxdllm.registry import Registry


@dataclasses.dataclass(frozen=True)
class CompanionFootprint:
    """A second model's share of one row of the loop (a drafter, a verifier), in positions.

    Attributes:
      role: what the companion does ("drafter", "verifier"): the key of `sampling_plan(companions=)`.
      kv_slots: K/V slots its cache keeps per row.
      widest: tokens of its widest forward.
      logits: positions of its widest forward's float32 logits.
    """

    role: str
    kv_slots: int
    widest: int
    logits: int


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What the compiled loop of one canvas holds per row, in positions; `jaxdllm.memory_plan`
    turns it into bytes for a model, a mesh and a dtype.

    Attributes:
      canvas: columns of the canvas (the padded prompt, a block-causal lead block, the answer).
      kv_slots: K/V slots of the model's cache kept across steps (0: nothing kept).
      widest: tokens of the model's widest forward.
      attended: keys that widest forward attends to (its `[widest, attended]` scores).
      logits: positions whose float32 logits a step keeps.
      logit_copies: float32 `[logits, V]` buffers a step keeps (logits, probabilities, ...).
      companions: the second models the canvas or its policy runs.
      gathered: K/V slots one layer of the widest forward gathers (rows reading views of shared pages copy
        each view's keys and values, `jaxdllm.attention.shared_view`); 0 for a cache read in place.
    """

    canvas: int
    kv_slots: int
    widest: int
    attended: int
    logits: int
    logit_copies: int = 2
    companions: tuple[CompanionFootprint, ...] = ()
    gathered: int = 0


class Canvas(abc.ABC):
    """Base class of the canvases. Canvases hold no state: two instances of one class are equal,
    so an instance is a static argument of the compiled loop.

    Class attributes:
      name: the canvas's one name (its module is `<name>.py`, its class the CamelCase of it).
      policy_base: the class a policy of this canvas derives from (what the loop calls on it).
      block_layout: block-causal models decode in the published block layout (`layout.py`).
      diffusion_blocks: the canvas decodes in diffusion blocks of `SamplerConfig.block_length`. False:
        it has none, and a `block_length` other than the loop's default is an error (a setting
        means one thing; e.g. Jacobi's draft window is the policy's `window`).
      unmasks: the answer starts as MASK and each step unmasks positions, so a recorded trajectory is
        a sequence of partly masked canvases (what Learn2PD's oracle replays).
    """

    name: ClassVar[str] = ""
    policy_base: ClassVar[type] = object
    block_layout: ClassVar[bool] = False
    diffusion_blocks: ClassVar[bool] = True
    unmasks: ClassVar[bool] = False

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))

    def __repr__(self):
        return f"{type(self).__name__}()"

    # -- what the loop calls -----------------------------------------------------------------
    @abc.abstractmethod
    def check_config(self, config) -> None:
        """Raise `ConfigError` if `config` (a `SamplerConfig`) cannot decode on this canvas."""

    @abc.abstractmethod
    def check_model(self, model_config, config) -> None:
        """Raise `ConfigError` if the model (its `ModelConfig`) cannot decode on this canvas."""

    @abc.abstractmethod
    def max_steps(self, config, lay=None) -> int:
        """A bound on the loop's steps (the `while_loop`'s guard against a policy bug)."""

    @abc.abstractmethod
    def init(self, model, prompt, view, key, lay, config, valid, policy_params=None):
        """The loop's carry (`DecodeState`) for `prompt [B, Lp]`; rows with `valid [B]` False start done."""

    @abc.abstractmethod
    def step(self, model, state, view, lay, config, policy_params=None):
        """One iteration of the loop: the forward(s), the policy's decision and the canvas's own
        bookkeeping (the loop then records the trajectory and counts the step)."""

    @abc.abstractmethod
    def footprint(self, model_config, config, prompt_len: int) -> Footprint:
        """What the compiled loop holds per row for prompts of `prompt_len` tokens (after padding)."""

    # -- what callers ask --------------------------------------------------------------------
    def check_policy(self, policy) -> None:
        """Raise `ConfigError` unless `policy` provides what this canvas calls."""
        if not isinstance(policy, self.policy_base):
            raise ConfigError(f"policy {policy.name!r} decodes on canvas {self.name!r}, whose policies derive from "
                              f"{self.policy_base.__name__}; {type(policy).__name__} does not")

    def resized_block_length(self, block_length: int, gen_length: int, new_gen_length: int) -> int:
        """The block length of a preset published at `gen_length` with `block_length`, for a canvas of
        `new_gen_length`: one block stays one block; otherwise the largest divisor of the new length
        that is at most the published block. A canvas without `diffusion_blocks` keeps the loop's
        default (a policy's own window is resized by the policy: `Policy.resized_settings`)."""
        if not self.diffusion_blocks:
            return block_length
        if block_length >= gen_length:
            return new_gen_length
        return max(d for d in range(1, min(block_length, new_gen_length) + 1) if new_gen_length % d == 0)

    def comparison_presets(self, preset: str, gen_length: int, defaults: dict) -> dict:
        """`{label: (preset name, settings)}`: the samplers a model card compares for this canvas's models at
        `gen_length`, given the checkpoint's default `preset` (whose policy decodes on this canvas) and
        its sampler defaults (`jaxdllm eval` with no `--preset`)."""
        raise ConfigError(f"canvas {self.name!r} has no default comparison: pass --preset")


class CanvasRegistry(Registry):
    """The registry of canvases: `register` checks the class against `Canvas` before adding it."""

    def register(self, cls):
        if not (isinstance(cls, type) and issubclass(cls, Canvas)):
            raise ConfigError(f"{getattr(cls, '__name__', cls)!r} is not a Canvas subclass "
                              "(jaxdllm.decoding.canvas.Canvas)")
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            raise ConfigError(f"canvas {cls.__name__} does not define {', '.join(missing)}: a canvas implements "
                              "every hook of jaxdllm.decoding.canvas.Canvas")
        return super().register(cls)
