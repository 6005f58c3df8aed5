"""Checkpoint tensors -> `Transformer` parameters: the table of a config's family (each family
holds its own: `jaxdllm.models.families`), where a tensor lands in a scanned or expert-stacked
parameter, and which tensors hold no parameter.
"""

from __future__ import annotations

from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families import family_of
from jaxdllm.models.families.tensors import TensorMapping


def tensor_table(config: ModelConfig) -> list[TensorMapping]:
    """Every tensor a checkpoint of `config` holds, in file order (a fused tensor once per part),
    from the table of the config's family."""
    return family_of(config).tensor_table(config)


def param_location(mapping: TensorMapping, scan_layers: bool) -> tuple[tuple, tuple[int, ...]]:
    """`(parameter path, index)` of a tensor: the tensor is slice `index` of the parameter's leading
    axes, `()` for a whole parameter. With `scan_layers` (the model's run option) a layer's tensor
    is slice `(layer,)` of one stacked parameter (path without the layer); a routed expert's tensor
    adds `(expert,)`."""
    path, index = mapping.path, ()
    if scan_layers and path[0] == "layers":
        path, index = ("layers",) + path[2:], (path[1],)
    if mapping.expert is not None:
        index += (mapping.expert,)
    return path, index


def is_ignorable(name: str, config: ModelConfig) -> bool:
    """Tensors some checkpoints carry that hold no parameter: RoPE buffers, a tied LM head, and those
    the config's family ignores (`Family.ignores_tensor`)."""
    if name.endswith("rotary_emb.inv_freq"):
        return True
    if family_of(config).ignores_tensor(name):
        return True
    return config.tie_embeddings and name in ("lm_head.weight", "model.transformer.ff_out.weight")
