"""The trainer's construction, one step per function, so a notebook can run them one by one:

    mesh = make_training_mesh(config.mesh)
    tokenizer = load_tokenizer(config)
    model = init_model(config, tokenizer, mesh)             # a preset, or `init_from` a checkpoint
    split = split_for_training(model, config.lora, mesh, seed=config.train.seed)
    tx, schedule = make_optimizer(config.optim, config.train.steps)
    opt_state, opt_shardings = init_optimizer(tx, split.trainable, mesh)
    objective = make_objective(config.objective.kind, config.objective.settings, model.config)
    batches = make_batches(config, tokenizer, objective, model_config=model.config)
    manager = checkpoint_manager(workdir, config.checkpoint)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import jax
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxdllm import sharding as shd
from jaxdllm.data import BatchConfig, BatchIterator, build_char_tokenizer
from jaxdllm.errors import ConfigError
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.lora import add_lora, merge_lora
from jaxdllm.models.transformer import Transformer
from jaxdllm.shipped import checkpoint_dir
from jaxdllm.tokenizer import Tokenizer, special_token_ids
from jaxdllm.train.config import TrainConfig
from jaxdllm.train.data_sources import data_source
from jaxdllm.train.expert_balance import trains_by_gradient
from jaxdllm.train.lora import LoraConfig

_LORA_SEED_SALT = 0x1042A  # the adapters' init key: fold_in(key(seed), salt)


def make_training_mesh(section) -> Mesh:
    """The recipe's `(data, fsdp, tensor)` mesh; `data = -1` takes every remaining device."""
    fixed = section.fsdp * section.tensor
    data = section.data if section.data > 0 else jax.device_count() // fixed
    if data < 1 or data * fixed != jax.device_count():
        raise ConfigError(f"[mesh] data={section.data} x fsdp={section.fsdp} x tensor={section.tensor} needs "
                          f"{max(data, 1) * fixed} devices, but this job has {jax.device_count()}: make the product "
                          "equal the device count (data = -1 takes every device fsdp and tensor leave)")
    return shd.make_mesh(data=data, fsdp=section.fsdp, tensor=section.tensor)


def load_tokenizer(config: TrainConfig) -> Tokenizer:
    """The checkpoint's own tokenizer for `init_from`, the `[model] tokenizer` folder's, else the tiny
    models' character tokenizer."""
    if config.model.init_from:
        return Tokenizer.from_pretrained(config.model.init_from, what="[model] init_from")
    if config.model.tokenizer:
        return Tokenizer.from_pretrained(config.model.tokenizer, what="[model] tokenizer")
    return build_char_tokenizer()


def build_model_config(config: TrainConfig, tokenizer: Tokenizer) -> ModelConfig:
    """`preset` + the tokenizer's vocabulary and special ids + the recipe's config overrides (how
    the model runs is `config.run_options()`)."""
    if config.model.init_from:
        raise ConfigError("build_model_config is for presets; init_from models carry their config")
    overrides = config.model.config_overrides
    ids = special_token_ids(tokenizer)
    return ModelConfig.preset(config.model.preset, vocab_size=tokenizer.vocab_size, **{**ids, **overrides})


def init_model(config: TrainConfig, tokenizer: Tokenizer, mesh: Mesh) -> Transformer:
    """A new model from the recipe's preset, or the `init_from` checkpoint (HF or orbax), on `mesh`."""
    c = config
    if c.model.init_from:
        from jaxdllm.checkpoint import from_pretrained, load_state
        src = checkpoint_dir(c.model.init_from)  # a folder, or a shipped checkpoint's name
        if (src / "jaxdllm_config.json").is_file():
            return load_state(src, mesh=mesh)
        return from_pretrained(src, options=c.run_options(), mesh=mesh, **c.model.config_overrides)
    model = Transformer(build_model_config(c, tokenizer), c.run_options(), rngs=nnx.Rngs(c.train.seed))
    return shd.shard_model(model, mesh)


def _pure(state: nnx.State) -> dict:
    return nnx.to_pure_dict(state)


def _filled(template: nnx.State, values: dict) -> nnx.State:
    state = jax.tree.map(lambda x: x, template)
    nnx.replace_by_pure_dict(state, values)
    return state


@dataclasses.dataclass
class SplitModel:
    """A model split for training: what the optimiser updates and what stays frozen.

    Without LoRA every parameter is trainable and `frozen` is empty; with LoRA the trainable
    part is the adapters (`nnx.LoRAParam`) and the base parameters are frozen. Both are pure
    dicts of arrays, with their shardings (adapters follow their kernels' logical axes).
    """

    graphdef: Any
    trainable_template: nnx.State
    frozen_template: nnx.State
    trainable: dict
    frozen: dict
    trainable_shardings: dict
    frozen_shardings: dict
    plain_graphdef: Any          # the model without adapters (export, `params_model`)
    plain_template: nnx.State
    extra: bool = False          # an objective's own module rides along as `model.objective_module`

    def model(self, trainable: dict, frozen: dict) -> Transformer:
        """The model over these parameters (usable inside `jit`), adapters applied in the forward."""
        parts = [_filled(self.trainable_template, trainable)]
        if frozen:
            parts.append(_filled(self.frozen_template, frozen))
        return nnx.merge(self.graphdef, *parts)

    def params_model(self, params: dict) -> Transformer:
        """A plain model (no adapters) over a full parameter dict."""
        return nnx.merge(self.plain_graphdef, _filled(self.plain_template, params))

    def merged_params(self, trainable: dict, frozen: dict) -> dict:
        """The full parameters with any adapters folded into their kernels (what export writes)."""
        model = self.model(trainable, frozen)
        return _pure(nnx.state(merge_lora(model), nnx.Param))

    def backbone_params(self, trainable: dict, frozen: dict) -> dict:
        """The model's own parameters (no objective module), from a split without LoRA."""
        full = {**frozen, **trainable}
        full.pop(OBJECTIVE_MODULE, None)
        return full

    def extra_module(self, trainable: dict, frozen: dict) -> nnx.Module | None:
        """The objective's own module over these parameters (None when it has none)."""
        return getattr(self.model(trainable, frozen), OBJECTIVE_MODULE) if self.extra else None


OBJECTIVE_MODULE = "objective_module"


def split_for_training(model: Transformer, lora: LoraConfig, mesh: Mesh, *, seed: int = 0,
                       extra: nnx.Module | None = None, freeze_backbone: bool = False) -> SplitModel:
    """Attach LoRA adapters when enabled, split the model and place both parts on `mesh`.

    `extra`: an objective's own module (e.g. Medusa heads), attached as `model.objective_module`
    and trained with the model, or alone on a frozen model with `freeze_backbone`."""
    abstract = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
    plain_graphdef, plain_state = nnx.split(model)
    plain_template = abstract(plain_state)
    if extra is not None:
        if lora.enabled:
            raise ConfigError("an objective with its own module (e.g. 'medusa') trains without [lora]; "
                              "remove the [lora] section")
        setattr(model, OBJECTIVE_MODULE, extra)
    if extra is not None and freeze_backbone:
        graphdef, trainable, frozen = nnx.split(model, nnx.PathContains(OBJECTIVE_MODULE), ...)
    elif lora.enabled:
        add_lora(model, lora.rank, lora.alpha, lora.targets,
                 key=jax.random.fold_in(jax.random.key(seed), _LORA_SEED_SALT))
        graphdef, trainable, frozen = nnx.split(model, nnx.LoRAParam, nnx.Param)
    else:
        graphdef, trainable = nnx.split(model)
        frozen = nnx.State({})
    shardings = lambda state: _pure(shd.state_shardings(state, mesh))
    t_shard, f_shard = shardings(trainable), shardings(frozen)
    return SplitModel(graphdef=graphdef, trainable_template=abstract(trainable), frozen_template=abstract(frozen),
                      trainable=_placed(_pure(trainable), t_shard), frozen=_placed(_pure(frozen), f_shard),
                      trainable_shardings=t_shard, frozen_shardings=f_shard, plain_graphdef=plain_graphdef,
                      plain_template=plain_template, extra=extra is not None)


def make_optimizer(optim, total_steps: int) -> tuple[optax.GradientTransformation, Callable[[int], Any]]:
    """`(tx, schedule)`: AdamW with warmup and a constant / cosine / linear schedule, after
    global-norm clipping; with `ema_decay`, a moving average of the parameters rides in the state
    (`jaxdllm.train.ema`)."""
    decay_steps = max(total_steps - optim.warmup_steps, 1)
    final = optim.lr * optim.final_lr_fraction
    schedule = {"constant": optax.constant_schedule(optim.lr),
                "cosine": optax.cosine_decay_schedule(optim.lr, decay_steps, alpha=optim.final_lr_fraction),
                "linear": optax.linear_schedule(optim.lr, final, decay_steps)}[optim.schedule]
    if optim.warmup_steps:
        schedule = optax.join_schedules(
            [optax.linear_schedule(0.0, optim.lr, optim.warmup_steps), schedule], [optim.warmup_steps])
    chain = [optax.clip_by_global_norm(optim.clip)] if optim.clip else []
    chain.append(optax.adamw(schedule, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay,
                             mask=trains_by_gradient))  # MoE routers' expert_bias: balanced, never decayed
    if optim.ema_decay:
        from jaxdllm.train.ema import parameter_ema

        chain.append(parameter_ema(optim.ema_decay))  # last: it averages the parameters after the update
    return optax.chain(*chain), schedule


def _placed(values: dict, shardings: dict) -> dict:
    """`values` put on their shardings; abstract values (`jax.ShapeDtypeStruct`, a model made
    by `jaxdllm.lowering.abstract_model`) only carry them."""
    def one(x, sharding):
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        return jax.device_put(x, sharding)
    return jax.tree.map(one, values, shardings)


def init_optimizer(tx: optax.GradientTransformation, trainable: dict, mesh: Mesh):
    """`(opt_state, shardings)`: moments follow their parameters; scalars (step counts) are
    replicated on the mesh. Abstract `trainable` gives an abstract state."""
    replicated = NamedSharding(mesh, PartitionSpec())
    init = jax.jit(tx.init)
    shardings = jax.tree.map(lambda s: s if isinstance(s, NamedSharding) and s.mesh == mesh else replicated,
                             init.lower(trainable).compile().output_shardings)
    if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(trainable)):
        return _placed(jax.eval_shape(tx.init, trainable), shardings), shardings
    return jax.device_put(init(trainable), shardings), shardings


def batch_config_for(config: TrainConfig, model_config=None, mesh: Mesh | None = None) -> BatchConfig:
    """The batching of a recipe; this process keeps its slice of every global batch: the rows its
    devices hold on `mesh` (`sharding.process_rows`; without a mesh, the `process_index`-th of
    `process_count` equal slices). For a block-causal `model_config`, packed examples start on
    block boundaries (rows of one example start at column 0 anyway): the blocks of training rows
    sit where decoding puts them."""
    source = data_source(config.data.source)
    packed_layout = source.packed_layout or source.pad_rows  # rows already laid out, or PAD after EOS: no EOS fill
    block_causal = model_config is not None and model_config.attention == "block_causal"
    num_shards, shard_index = jax.process_count(), jax.process_index()
    if mesh is not None:
        start, stop = shd.process_rows(mesh, config.data.batch_size)
        num_shards, shard_index = config.data.batch_size // (stop - start), start // (stop - start)
    return BatchConfig(seq_len=config.data.seq_len, batch_size=config.data.batch_size, seed=config.data.seed,
                       pack=config.data.pack, fill_with_eos=not (config.data.pack or packed_layout),
                       align=model_config.block_size if block_causal else 1,
                       on_too_long=config.data.on_too_long,
                       add_bos=not config.data.chat_template,  # the template carries its own BOS
                       num_shards=num_shards, shard_index=shard_index)


def make_batches(config: TrainConfig, tokenizer: Tokenizer, objective, state: dict | None = None,
                 model_config=None, mesh: Mesh | None = None) -> BatchIterator:
    """The recipe's batch iterator, from its `[data] source` (`jaxdllm.train.data_sources`); in a
    multi-process job it yields this process's rows of each global batch on `mesh`."""
    return data_source(config.data.source)().batches(config, tokenizer, objective,
                                                     batch_config_for(config, model_config, mesh), state)


def checkpoint_manager(workdir: Path | None, section) -> ocp.CheckpointManager | None:
    """An orbax manager under `workdir/checkpoints` keeping `section.keep` steps (None: no workdir)."""
    if workdir is None:
        return None
    return ocp.CheckpointManager(workdir / "checkpoints",
                                 options=ocp.CheckpointManagerOptions(max_to_keep=section.keep, create=True),
                                 item_names=("state", "meta"))
