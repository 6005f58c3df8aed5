"""Programs lowered for hardware this machine does not have, without weights.

`jax.export` lowers a jitted function for another platform: on a CPU, the whole decoding loop or a
training step lowers for a TPU with its Mosaic splash kernels, at 7-8B shapes, over a mesh of
fake CPU devices. `abstract_model` gives a model whose parameters are shapes and shardings only
(`nnx.eval_shape`), `Sampler(abstract_model(...)).export(...)` lowers the loop, and
`program_facts` reads what the lowered module holds (kernels, host callbacks).
"""

from __future__ import annotations

import re

import jax
import numpy as np
from flax import nnx

from jaxdllm import sharding as shd
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.run_options import RunOptions
from jaxdllm.models.transformer import Transformer


def abstract_model(config: ModelConfig, mesh=None, rules=shd.DEFAULT_RULES,
                   options: RunOptions | None = None) -> Transformer:
    """A `Transformer` of `config` run with `options` whose parameters are `jax.ShapeDtypeStruct`s,
    placed by the sharding rules on `mesh` (none: one device). Nothing is allocated, so a 8B model
    costs no memory."""
    model = nnx.eval_shape(lambda: Transformer(config, options, rngs=nnx.Rngs(0)))
    if mesh is None:
        return model
    graphdef, state = nnx.split(model)
    shardings = shd.state_shardings(state, mesh, rules)

    def placed(var, sharding):
        value = var.get_value()
        return var.replace(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding))

    state = jax.tree.map(placed, state, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.merge(graphdef, state)


# Custom-call targets of the kernels and of host callbacks in StableHLO text.
_MOSAIC = "tpu_custom_call"
_TRITON = "__gpu$xla.gpu.triton"
_CALLBACKS = ("xla_python_cpu_callback", "xla_python_gpu_callback", "xla_ffi_python_cpu_callback",
              "xla_ffi_python_gpu_callback", "xla_ffi_partial_python_cpu_callback", "tpu_host_callback",
              "host_callback")


def program_facts(exported) -> dict:
    """What a `jax.export.Exported` holds: `{"platforms", "mosaic_kernels", "triton_kernels",
    "host_callbacks", "ragged_dots", "while_loops", "bytes"}` (counts of custom calls, XLA's ragged-dot
    composites (a mixture of experts' grouped matmuls) and loops in its StableHLO). Reading the text is
    seconds for a real-size model: read it once."""
    text = exported.mlir_module()
    targets = re.findall(r'call_target_name = "([^"]+)"', text) + re.findall(r"stablehlo.custom_call @([\w$.]+)", text)
    return {"platforms": list(exported.platforms),
            "mosaic_kernels": sum(t == _MOSAIC for t in targets),
            "triton_kernels": sum(t == _TRITON for t in targets),
            "host_callbacks": sum(t in _CALLBACKS for t in targets),
            "ragged_dots": text.count('stablehlo.composite "chlo.ragged_dot"'),
            "while_loops": text.count("stablehlo.while"),
            "bytes": len(text)}


def _train_step_call(recipe, model_config: ModelConfig, mesh, rows: int, seq_len: int):
    """`(mesh, jitted step, abstract args)` of one training step of `recipe`."""
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxdllm.data import BATCH_KEYS
    from jaxdllm.train import setup
    from jaxdllm.train.objectives import make_objective
    from jaxdllm.sharding import batch_sharding
    from jaxdllm.train.step import make_train_step

    mesh = shd.auto_mesh(mesh)
    with jax.set_mesh(mesh):
        model = abstract_model(model_config, options=recipe.run_options())  # as the trainer builds it
        split = setup.split_for_training(model, recipe.lora, mesh, seed=recipe.train.seed)
        tx, _ = setup.make_optimizer(recipe.optim, recipe.train.steps)
        opt_state, opt_shardings = setup.init_optimizer(tx, split.trainable, mesh)
    objective = make_objective(recipe.objective.kind, recipe.objective.settings, model_config)
    step = make_train_step(split, objective, tx, opt_shardings, mesh, grad_accum=recipe.optim.grad_accum,
                           skip_nan=recipe.train.on_nan == "skip")
    batch = {k: jax.ShapeDtypeStruct((rows, seq_len), np.int32, sharding=batch_sharding(mesh)) for k in BATCH_KEYS}
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=NamedSharding(mesh, PartitionSpec()))
    return mesh, step, (split.trainable, split.frozen, opt_state, batch, key)


def export_train_step(recipe, model_config: ModelConfig, mesh, *, rows: int, seq_len: int, platform: str = "tpu"):
    """Lower one optimizer step of `recipe` (a `jaxdllm.train.TrainConfig`: its objective,
    optimizer, LoRA and accumulation) for a `model_config` model on `mesh`, for `platform`,
    without weights.

    Args:
      recipe: the training recipe (its `[model]` section is replaced by `model_config`).
      model_config: the model to train (e.g. `ModelConfig.preset("llada-8b")`).
      mesh: a `(data, fsdp, tensor)` mesh (fake CPU devices will do).
      rows, seq_len: the global batch `[rows, seq_len]` (rows a multiple of data x fsdp x grad_accum).
      platform: "tpu", "cuda" or "cpu".

    Returns:
      A `jax.export.Exported` of `step(trainable, frozen, opt_state, batch, key)`.
    """
    from jaxdllm.attention.platform import exporter, lowering_for

    mesh, step, args = _train_step_call(recipe, model_config, mesh, rows, seq_len)
    with jax.set_mesh(mesh), lowering_for(platform):
        return exporter(step, platform)(*args)


def lower_train_step(recipe, model_config: ModelConfig, mesh, *, rows: int, seq_len: int):
    """The same step lowered for this machine (`jax.stages.Lowered`; `.compile().memory_analysis()`)."""
    mesh, step, args = _train_step_call(recipe, model_config, mesh, rows, seq_len)
    with jax.set_mesh(mesh):
        return step.lower(*args)
