"""Training: objectives (`losses`), LoRA (`lora`), recipes (`config`) and the sharded trainer."""

from jaxdllm.train.config import TrainConfig
from jaxdllm.train.lora import LoraConfig, init_lora, merge, num_lora_params
from jaxdllm.train.losses import OBJECTIVES, make_loss
from jaxdllm.errors import TrainingError
from jaxdllm.train.trainer import Trainer, make_optimizer

__all__ = ["LoraConfig", "OBJECTIVES", "TrainConfig", "Trainer", "TrainingError", "init_lora", "make_loss",
           "make_optimizer", "merge", "num_lora_params"]
