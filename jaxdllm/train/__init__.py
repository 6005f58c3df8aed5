"""Training: objectives (`objectives/`) and data sources (`data_sources`), both registries;
recipes (`config`), construction (`setup`), the compiled step (`step`) and the sharded trainer
(`trainer`); LoRA settings in `lora`."""

from jaxdllm.errors import TrainingError
from jaxdllm.train.config import TrainConfig
from jaxdllm.train.data_sources import DATA_SOURCES, DataSource, register_data_source
from jaxdllm.train.lora import LoraConfig, num_lora_params
from jaxdllm.train.objectives import OBJECTIVES, Objective, Views, make_objective, register_objective
from jaxdllm.train.setup import SplitModel, make_optimizer, split_for_training
from jaxdllm.train.step import make_train_step
from jaxdllm.train.trainer import Trainer

__all__ = ["DATA_SOURCES", "DataSource", "LoraConfig", "OBJECTIVES", "Objective", "SplitModel", "TrainConfig", "Trainer", "TrainingError", "Views",
           "make_objective", "make_optimizer", "make_train_step", "num_lora_params", "register_data_source", "register_objective",
           "split_for_training"]
