"""What every training objective shares: the `Objective` interface, the `Views` it may run, and
the logit bookkeeping (token shift, cross-entropy, accuracy) that must be the same everywhere.

An objective is a frozen dataclass whose fields are its settings (the recipe's `[objective]`
keys besides `kind`). Calling it runs one loss:

    objective(views, batch, key) -> (loss scalar, metrics dict of scalars)

`views.student(tokens, positions, mask)` is the model being trained (gradients flow); an
objective may run it several times (two masked views of one batch, a noisy and a clean stream).
`batch` is a dict of `[B, L]` arrays, `jaxdllm.data.BATCH_KEYS`.

Token shift: for `ModelConfig.shift_logits` models (Dream, Fast-dLLM v2) the logit at i-1
predicts token i. `aligned_logits` re-indexes the raw logits so that entry i predicts token i,
and `has_predictor` marks the tokens that have a predictor at all (not the first token of a
row or of a packed example). Every objective scores only tokens with a predictor.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp

from jaxdllm.attention import MaskSpec
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.transformer import align_logits
from jaxdllm.registry import Settings

Apply = Callable[[jax.Array, jax.Array, MaskSpec], jax.Array]


@dataclasses.dataclass(frozen=True)
class Views:
    """The calls an objective may make. Each maps `(tokens [B, L], positions [B, L], MaskSpec)` to
    raw float32 logits `[B, L, V]`.

    Attributes:
      student: the trained model; gradients flow through it.
      config: the model's `ModelConfig` (special ids, shift, attention mode).
      forward: the trained model's whole call, `forward(tokens, positions, mask, cache=None,
        **kwargs) -> ForwardOutput` (a cache, DiffusionGemma's `encode=` / `self_conditioning=`),
        for objectives that need more than the logits.
      init_cache: the trained model's `init_cache(batch_size, max_length)`.
      unembed: the trained model's LM head, `unembed(hidden [..., L, D]) -> logits [..., L, V]`.
      extra: the objective's own module (`Objective.extra_module`, e.g. Medusa heads), trained
        with the model or alone; None for objectives without one.
      step: int32 scalar, the optimizer step this loss is for (0 on the first update), for
        objectives with a curriculum (`assd`'s masking rate); None outside the trainer.
    """

    student: Apply
    config: ModelConfig
    forward: Callable | None = None
    init_cache: Callable | None = None
    unembed: Callable | None = None
    extra: Any = None
    step: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Objective(Settings):
    """Base class; subclasses set `name`, their settings as fields, and `__call__`.

    Class attributes:
      name: the recipe's `kind`.
      needs_mask_token: the model must have a `mask_token_id`.
      packing: whether examples may be packed several to a row.
      trajectory_selection: for objectives trained on Jacobi trajectories (`[data] source =
        "trajectories"`), how each row's noisy states are chosen
        (`jaxdllm.train.distill.trajectories.SELECTIONS`); None for every other objective.
    """

    name: ClassVar[str] = ""
    role: ClassVar[str] = "objective"
    needs_mask_token: ClassVar[bool] = False
    packing: ClassVar[bool] = True
    trajectory_selection: ClassVar[str | None] = None

    @classmethod
    def where(cls) -> str:
        return "[objective] "

    @property
    def stacked_views(self) -> int:
        """How many copies of the batch one step's forward stacks along its rows (certainty forcing's
        two masked views: 2). The memory plan (`jaxdllm.memory_plan.training_plan`) scales the
        activations and logits by it."""
        return 1

    def check(self, config: ModelConfig) -> None:
        """Raise `ConfigError` if this objective cannot train a model of `config` (before compiling)."""

    def extra_module(self, config: ModelConfig):
        """A module of the objective's own that trains beside the model (`Views.extra`; e.g. Medusa
        heads), or None (default)."""
        return None

    @property
    def freezes_backbone(self) -> bool:
        """Only `extra_module` trains; the model's own parameters stay as loaded."""
        return False

    def save_extra(self, module, directory, **facts) -> None:
        """Write the trained `extra_module` beside an exported model in `directory`."""

    def __call__(self, views: Views, batch: dict, key: jax.Array) -> tuple[jax.Array, dict]:
        raise NotImplementedError


def token_ce(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """`[B, L]` float32 cross-entropy of `logits [B, L, V]` at `targets [B, L]`."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def accuracy(logits: jax.Array, targets: jax.Array, where: jax.Array) -> jax.Array:
    """Fraction of `where` positions whose argmax is the target (0 when there are none)."""
    hits = (jnp.argmax(logits, -1) == targets) & where
    return hits.sum() / jnp.maximum(where.sum(), 1)


def padding_mask(batch: dict, kind: str, block_size: int | None = None) -> MaskSpec:
    """`kind` attention restricted to each packed example (segment ids; 0 = padding)."""
    seg = batch["segment_ids"]
    return MaskSpec(kind=kind, block_size=block_size, q_segment_ids=seg, kv_segment_ids=seg)


aligned_logits = align_logits  # entry i predicts token i; entry 0 of a shifted model predicts nothing


def has_predictor(segment_ids: jax.Array, config: ModelConfig) -> jax.Array:
    """`[B, L]` bool: token i has a logit predicting it. Unshifted: every token. Shifted: tokens
    whose previous position belongs to the same example."""
    if not config.shift_logits:
        return jnp.ones(segment_ids.shape, bool)
    same = segment_ids[:, 1:] == segment_ids[:, :-1]
    return jnp.concatenate([jnp.zeros_like(same[:, :1]), same], axis=1)


def masked_metrics(loss, logits, targets, masked) -> dict:
    """The metrics every masked objective logs."""
    return {"loss": loss, "masked_accuracy": accuracy(logits, targets, masked), "masked_tokens": masked.sum()}
