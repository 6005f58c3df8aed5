"""Checkpoint import/export: Hugging Face safetensors layouts and orbax state; `Checkpoint`, one
folder read once (its config.json and side files) and handed to every loader."""

from jaxdllm.checkpoint.folder import Checkpoint
from jaxdllm.checkpoint.hf_config import config_from_hf, config_to_hf
from jaxdllm.checkpoint.hf_io import from_pretrained, save_pretrained, verify_checkpoint
from jaxdllm.checkpoint.orbax_io import load_state, save_state
from jaxdllm.errors import CheckpointError

__all__ = ["Checkpoint", "CheckpointError", "config_from_hf", "config_to_hf", "from_pretrained", "load_state",
           "save_pretrained", "save_state", "verify_checkpoint"]
