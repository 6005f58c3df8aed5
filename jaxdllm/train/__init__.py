"""Training: objectives (`objectives/`), LoRA (`lora`), recipes (`config`) and the sharded trainer."""

from jaxdllm.train.config import TrainConfig
from jaxdllm.train.lora import LoraConfig, init_lora, merge, num_lora_params
from jaxdllm.train.objectives import OBJECTIVES, Objective, Views, make_objective, register_objective
from jaxdllm.errors import TrainingError
from jaxdllm.train.trainer import Trainer, make_optimizer

__all__ = ["LoraConfig", "OBJECTIVES", "TrainConfig", "Trainer", "TrainingError", "Objective", "Views", "init_lora", "make_objective", "register_objective",
           "make_optimizer", "merge", "num_lora_params"]
