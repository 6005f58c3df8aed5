"""Training objectives by name: `objective(views, batch, key) -> (loss, metrics)` (see `base.py`).

A new objective is one module defining an `Objective` subclass plus one line in the registration
loop below (or a `register_objective` call from user code); the trainer names none of them.
"""

from __future__ import annotations

from jaxdllm.errors import ConfigError
from jaxdllm.models.config import ModelConfig
from jaxdllm.registry import Registry
from jaxdllm.train.objectives.assd import AssdJoint
from jaxdllm.train.objectives.base import Objective, Views, aligned_logits, has_predictor, token_ce
from jaxdllm.train.objectives.block_diffusion import BlockDiffusion
from jaxdllm.train.objectives.causal_lm import CausalLM
from jaxdllm.train.objectives.certainty_forcing import CertaintyForcing
from jaxdllm.train.objectives.jacobi_forcing import Cllm, JacobiForcing
from jaxdllm.train.objectives.mdlm import Mdlm
from jaxdllm.train.objectives.mdm import MdmPretrain, MdmSft
from jaxdllm.train.objectives.medusa import MedusaObjective
from jaxdllm.train.objectives.multiverse import MultiverseSft
from jaxdllm.train.objectives.sdar import SdarConversion
from jaxdllm.train.objectives.set_block import SetBlockDecoding
from jaxdllm.train.objectives.uniform_block_diffusion import UniformBlockDiffusion
from jaxdllm.train.objectives.wedlm import WeDLMConversion

OBJECTIVES: Registry[Objective] = Registry("[objective] kind")
register_objective = OBJECTIVES.register  # makes `cls` selectable as [objective] kind = cls.name
objective_class = OBJECTIVES.lookup

for _cls in (MdmPretrain, MdmSft, BlockDiffusion, CausalLM, CertaintyForcing, JacobiForcing, Cllm, UniformBlockDiffusion,
             MedusaObjective, SdarConversion, SetBlockDecoding, WeDLMConversion, MultiverseSft):
    register_objective(_cls)
register_objective(AssdJoint)
register_objective(Mdlm)


def settings_of(kind: str) -> tuple[str, ...]:
    """The `[objective]` keys (besides `kind`) objective `kind` takes."""
    return objective_class(kind).settings()


def make_objective(kind: str, settings: dict | None = None, model_config: ModelConfig | None = None) -> Objective:
    """The objective `kind` with `settings`; checked against `model_config` when given.

    Unknown settings and settings of another objective raise `ConfigError` naming the valid ones.
    """
    cls = objective_class(kind)
    settings = dict(settings or {})
    unknown = sorted(set(settings) - set(settings_of(kind)))
    if unknown:
        raise ConfigError(f"[objective] kind = {kind!r} takes no key(s) {unknown}; its keys: "
                          f"{sorted(settings_of(kind))}")
    objective = cls(**settings)
    if model_config is not None:
        if cls.needs_mask_token and model_config.mask_token_id is None:
            raise ConfigError(f"objective {kind!r} needs the model's mask_token_id")
        objective.check(model_config)
    return objective


__all__ = ["OBJECTIVES", "Objective", "Views", "aligned_logits", "has_predictor", "make_objective",
           "objective_class", "register_objective", "settings_of", "token_ce"]
