"""Training recipe: a TOML file of sections, read into validated dataclasses.

```toml
[model]        # preset = "tiny-llada" (+ any ModelConfig field to override) or init_from = "DIR"
[model.experts]  # a preset's expert settings to change (ExpertConfig fields; num_experts = 0: dense)
[data]         # source = "tasks" | "jsonl" | "gsm8k" | "teacher" | "trajectories", seq_len, batch_size, ...
[objective]    # kind = "mdm_sft" | "mdm_pretrain" | "block_diffusion" | "causal_lm" | "certainty_forcing"
               #        | "jacobi_forcing" | "cllm", + its settings
[distill]      # `jaxdllm distill generate` / `trajectories`: teacher, prompts, sampler, out
[learn2pd]     # `jaxdllm distill learn2pd`: Learn2PD's filter from the trajectories (hidden, steps, out)
[optim]        # lr, schedule, warmup_steps, weight_decay, b1, b2, clip, grad_accum
[train]        # steps, seed, compute_dtype, on_nan
[lora]         # rank (0 = off), alpha, targets
[checkpoint]   # dir, every, keep
[log]          # every, jsonl
[mesh]         # data, fsdp, tensor (data = -1: all remaining devices)
```
Unknown keys and bad values fail at load time with the section and key named.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path
from typing import Any

from jaxdllm.data import get_task
from jaxdllm.errors import ConfigError
from jaxdllm.models.config import PRESETS, ModelConfig, checkpoint_fields
from jaxdllm.models.run_options import DTYPES, RunOptions, split_options
from jaxdllm.validation import check_fields, check_overrides, require_positive_int
from jaxdllm.train.lora import LoraConfig
from jaxdllm.train.data_sources import data_source
from jaxdllm.train.objectives import make_objective, objective_class


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _check_sampler_keys(options: dict, where: str, extra: str = "") -> None:
    """Every key of `options` is a `SamplerConfig` option (`extra`: other keys the table allows)."""
    from jaxdllm.decoding import SamplerConfig

    unknown = sorted(set(options) - set(SamplerConfig.option_names()))
    _check(not unknown, f"{where} has unknown key(s) {unknown}; options: {extra}{list(SamplerConfig.option_names())}")


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """`preset` plus overrides (a new model), or `init_from` (an HF or orbax checkpoint dir)."""

    preset: str | None = None
    init_from: str | None = None
    tokenizer: str | None = None       # with preset: a folder holding tokenizer.json (default: the character tokenizer)
    overrides: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_fields(self, "[model] ")
        _check((self.preset is None) != (self.init_from is None),
               "[model] needs exactly one of preset = \"NAME\" or init_from = \"DIR\"")
        _check(self.tokenizer is None or self.init_from is None,
               "[model] tokenizer goes with preset: an init_from checkpoint brings its own tokenizer")
        _check(self.preset is None or self.preset in PRESETS,
               f"[model] preset {self.preset!r} is unknown; known presets: {sorted(PRESETS)}")
        # A checkpoint fixes its own shapes; a preset takes any field (vocab and ids come from the tokenizer).
        # Keys that say how the model runs (`RunOptions`) go with either.
        fields, options = split_options(self.overrides)
        # the preset's config class (a family's own may have more fields)
        config_class = type(PRESETS[self.preset]) if self.preset else ModelConfig
        fixed = checkpoint_fields(config_class) if self.init_from else {"source_config"}
        for name, settings in config_class.settings_tables.items():
            if isinstance(fields.get(name), dict) and name not in fixed:
                # a [model.NAME] table (e.g. [model.experts]): changes the preset's settings (`ModelConfig.replace`)
                check_overrides(settings, fields[name], f"[model.{name}]")
                fields = {k: v for k, v in fields.items() if k != name}
        try:
            check_overrides(config_class, fields, "[model]", exclude=tuple(fixed))
        except ConfigError as e:
            raise ConfigError(f"{e}; or a run option: {list(RunOptions.fields())}") from None
        check_overrides(RunOptions, options, "[model]")

    @property
    def config_overrides(self) -> dict:
        """The overrides that change the `ModelConfig` (what the model is)."""
        return split_options(self.overrides)[0]




@dataclasses.dataclass(frozen=True)
class DataSection:
    """Where examples come from and how they are batched (`jaxdllm.data.BatchConfig` fields)."""

    source: str = "tasks"
    tasks: tuple[str, ...] = ("copy", "reverse", "sort", "add", "perm", "pick3")
    examples_per_task: int = 20000
    path: str | None = None            # jsonl file, the GSM8K directory, or the teacher's answers (default [distill] out)
    keep: str = "correct"              # source = "teacher" / "trajectories": "correct" answers only, or "all"
    window: int = 16                   # source = "trajectories", jacobi_forcing: noise levels of the progressive schedule
    shift_schedule: bool = True        # ... each trajectory starts the schedule at its own random level
    on_too_long: str = "error"         # an example longer than seq_len: "error" or "skip" (counted, warned)
    split: str = "train"
    on_error: str = "raise"            # malformed jsonl lines: "raise" or "skip"
    seq_len: int = 32
    batch_size: int = 64
    pack: bool = False
    seed: int = 0
    chat_template: bool = False        # wrap prompts in the tokenizer's chat template (instruct models)

    def __post_init__(self):
        check_fields(self, "[data] ")
        source = data_source(self.source)  # an unknown source lists the registered ones
        _check(self.keep in ("correct", "all"), f"[data] keep must be 'correct' or 'all', got {self.keep!r}")
        _check(self.on_too_long in ("error", "skip"),
               f"[data] on_too_long must be 'error' or 'skip', got {self.on_too_long!r}")
        _check(self.on_error in ("raise", "skip"), f"[data] on_error must be 'raise' or 'skip', got {self.on_error!r}")
        for name in ("examples_per_task", "seq_len", "batch_size"):
            require_positive_int(getattr(self, name), f"[data] {name}")
        _check(isinstance(self.window, int) and self.window >= 2, f"[data] window must be an integer >= 2, got {self.window!r}")
        source().check(self)


@dataclasses.dataclass(frozen=True)
class DistillSection:
    """`jaxdllm distill generate RECIPE`: the teacher answers a prompt set with `jaxdllm.generate`
    (`preset` + `sampler` overrides over the teacher's own sampler defaults), each answer is checked
    (task checker, or the final number against the reference) and written to `out` as JSONL,
    which `[data] source = "teacher"` trains on. Relative paths are taken from the working
    directory, like every path of a recipe."""

    teacher: str | None = None         # checkpoint directory (default: [model] init_from)
    source: str = "tasks"              # prompts: "tasks" | "gsm8k" | "jsonl"
    tasks: tuple[str, ...] = ("copy", "reverse", "sort", "add", "perm", "pick3")
    examples_per_task: int = 1000
    path: str | None = None            # the GSM8K directory (source = "gsm8k")
    files: tuple[str, ...] = ()        # source = "jsonl": prompt files, read in order
    prompt_keys: tuple[str, ...] = ("prompt", "question", "problem")  # the first present key is the prompt
    answer_keys: tuple[str, ...] = ("answer", "solution")             # ... and the reference answer (optional)
    split: str = "train"
    limit: int | None = None           # gsm8k / jsonl: the first `limit` prompts
    seed: int = 0
    chat_template: bool = False        # wrap prompts in the teacher tokenizer's chat template
    dtype: str | None = None           # the teacher's parameter dtype (default: as stored)
    preset: str = "llada"
    sampler: dict = dataclasses.field(default_factory=dict)
    batch_size: int = 64
    out: str = "teacher.jsonl"

    def __post_init__(self):
        check_fields(self, "[distill] ")
        _check(self.source in ("tasks", "gsm8k", "jsonl"),
               f"[distill] source must be 'tasks', 'gsm8k' or 'jsonl', got {self.source!r}")
        _check(self.source != "jsonl" or bool(self.files),
               "[distill] source = 'jsonl' needs files = [\"FILE\", ...] (prompt JSONL files)")
        _check(bool(self.prompt_keys), "[distill] prompt_keys is empty: name the field holding the prompt")
        for name in ("examples_per_task", "batch_size"):
            require_positive_int(getattr(self, name), f"[distill] {name}")
        if self.limit is not None:
            require_positive_int(self.limit, "[distill] limit")
        _check(isinstance(self.seed, int) and self.seed >= 0, f"[distill] seed must be >= 0, got {self.seed!r}")
        _check(bool(self.out.strip()), "[distill] out is empty: name the JSONL file to write")
        _check(self.dtype is None or self.dtype in DTYPES, f"[distill] dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.source == "tasks":
            _check(bool(self.tasks), "[distill] tasks is empty: name one or more tasks")
            for task in self.tasks:
                get_task(task)
        self.sampler_config()  # an unknown preset or a bad sampler setting fails at load time

    def sampler_config(self, defaults: dict | None = None):
        """The teacher's `SamplerConfig`: `preset`, the checkpoint's `defaults`, then `sampler`."""
        from jaxdllm.decoding import SamplerConfig

        _check_sampler_keys(self.sampler, "[distill] sampler")
        return SamplerConfig.preset(self.preset, **{**(defaults or {}), **self.sampler})

    def __hash__(self):
        return hash(json.dumps(dataclasses.asdict(self), sort_keys=True))


@dataclasses.dataclass(frozen=True)
class Learn2PDSection:
    """`jaxdllm distill learn2pd RECIPE`: Learn2PD's filter fitted with BCE to the oracle traces
    that `jaxdllm distill trajectories RECIPE` recorded (the [distill] teacher decoding its prompts
    with its base sampler). The prompts are split: `held_out` of them only measure the filter."""

    trajectories: str | None = None    # the trajectory JSONL (default: [distill] out)
    hidden: int = 32                   # the published 2-layer MLP (32 -> 32); 0: logistic regression
    steps: int = 2000
    batch_size: int = 1024             # recorded block states per Adam step
    lr: float = 3e-3
    held_out: float = 0.1              # share of the prompts kept out of training
    seed: int = 0
    thresholds: tuple[float, ...] = (0.5, 0.7, 0.8, 0.9, 0.96, 0.99)  # acceptance measured at each
    out: str | None = None             # the filter file or folder (default: the teacher's folder)

    def __post_init__(self):
        check_fields(self, "[learn2pd] ")
        _check(isinstance(self.hidden, int) and self.hidden >= 0,
               f"[learn2pd] hidden must be >= 0 (0: logistic regression), got {self.hidden!r}")
        for name in ("steps", "batch_size"):
            require_positive_int(getattr(self, name), f"[learn2pd] {name}")
        _check(isinstance(self.lr, (int, float)) and self.lr > 0, f"[learn2pd] lr must be > 0, got {self.lr!r}")
        _check(isinstance(self.held_out, (int, float)) and 0 <= self.held_out < 1,
               f"[learn2pd] held_out must be in [0, 1), got {self.held_out!r}")
        _check(isinstance(self.seed, int) and self.seed >= 0, f"[learn2pd] seed must be >= 0, got {self.seed!r}")
        _check(bool(self.thresholds) and all(isinstance(t, (int, float)) and 0 < t < 1 for t in self.thresholds),
               f"[learn2pd] thresholds must be values in (0, 1), got {self.thresholds!r}")


@dataclasses.dataclass(frozen=True)
class ObjectiveSection:
    """`kind` names a registered objective (`jaxdllm.train.objectives`); every other key of the
    section is one of that objective's settings (e.g. `eps`, `block_size`), checked here."""

    kind: str = "mdm_sft"
    settings: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_fields(self, "[objective] ")
        make_objective(self.kind, self.settings)  # unknown kind or keys, bad values: fail at load time

    def __hash__(self):
        return hash((self.kind, tuple(sorted(self.settings.items()))))

    def build(self):
        """The configured `Objective` (not checked against a model)."""
        return make_objective(self.kind, self.settings)


@dataclasses.dataclass(frozen=True)
class OptimSection:
    lr: float = 1e-3
    schedule: str = "cosine"           # constant | cosine | linear (after warmup)
    warmup_steps: int = 0
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    clip: float | None = 1.0
    grad_accum: int = 1
    ema_decay: float = 0.0             # > 0: keep an average of the parameters (MDLM's warm-up); export uses it

    def __post_init__(self):
        check_fields(self, "[optim] ")
        _check(0 <= self.ema_decay < 1, f"[optim] ema_decay must be in [0, 1) (0: no average), got {self.ema_decay}")
        _check(self.lr > 0, f"[optim] lr must be positive, got {self.lr}")
        _check(self.schedule in ("constant", "cosine", "linear"),
               f"[optim] schedule must be constant, cosine or linear, got {self.schedule!r}")
        _check(self.warmup_steps >= 0, "[optim] warmup_steps must be >= 0")
        require_positive_int(self.grad_accum, "[optim] grad_accum")
        _check(self.clip is None or self.clip > 0, "[optim] clip must be positive (or omitted)")


@dataclasses.dataclass(frozen=True)
class TrainSection:
    steps: int = 1000
    seed: int = 0
    compute_dtype: str = "float32"     # bfloat16: bf16 matmuls, float32 master weights
    on_nan: str = "stop"               # "stop": raise with the step number
    expert_bias_rate: float = 0.001    # MoE models: aux-loss-free balancing step of the routers' bias (0: off)

    def __post_init__(self):
        check_fields(self, "[train] ")
        _check(self.expert_bias_rate >= 0, f"[train] expert_bias_rate must be >= 0, got {self.expert_bias_rate}")
        require_positive_int(self.steps, "[train] steps")
        _check(self.compute_dtype in ("float32", "bfloat16"),
               f"[train] compute_dtype must be float32 or bfloat16, got {self.compute_dtype!r}")
        _check(self.on_nan in ("stop", "skip"), f"[train] on_nan must be 'stop' or 'skip', got {self.on_nan!r}")


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    dir: str | None = None
    every: int = 500
    keep: int = 2
    sampler: dict = dataclasses.field(default_factory=dict)  # --export's jaxdllm_sampler.json (SamplerConfig keys)

    def __post_init__(self):
        check_fields(self, "[checkpoint] ")
        require_positive_int(self.every, "[checkpoint] every")
        require_positive_int(self.keep, "[checkpoint] keep")
        if self.sampler:
            from jaxdllm.decoding import SamplerConfig

            _check_sampler_keys(self.sampler, "[checkpoint] sampler")
            base = SamplerConfig.preset("llada")  # what `sampler_defaults` builds from (a bad value fails here)
            base.resized(**self.sampler) if "gen_length" in self.sampler else base.replace(**self.sampler)

    def __hash__(self):
        return hash(json.dumps(dataclasses.asdict(self), sort_keys=True))


@dataclasses.dataclass(frozen=True)
class LogSection:
    every: int = 50
    jsonl: str | None = None           # default: <checkpoint dir>/metrics.jsonl
    progress: bool = True
    agreement_every: int = 0           # source = "teacher": log agreement with the teacher's answers every N steps
    agreement_prompts: int = 64        # ... on this many of its training prompts (jaxdllm.train.agreement)
    agreement_fast: dict = dataclasses.field(default_factory=dict)  # ... also under this sampler (preset + options)

    def __post_init__(self):
        check_fields(self, "[log] ")
        require_positive_int(self.every, "[log] every")
        _check(isinstance(self.agreement_every, int) and self.agreement_every >= 0,
               f"[log] agreement_every must be an integer >= 0 (0: off), got {self.agreement_every!r}")
        require_positive_int(self.agreement_prompts, "[log] agreement_prompts")
        _check(self.agreement_every % self.every == 0,
               f"[log] agreement_every ({self.agreement_every}) must be a multiple of [log] every ({self.every}): "
               "agreement is measured with a log record")
        if self.agreement_fast:
            from jaxdllm.decoding import SamplerConfig

            options = dict(self.agreement_fast)
            preset = options.pop("preset", "dparallel")
            _check_sampler_keys(options, "[log] agreement_fast", extra="preset, ")
            SamplerConfig.preset(preset, **options)  # an unknown preset or a bad value fails at load time

    def __hash__(self):
        return hash(json.dumps(dataclasses.asdict(self), sort_keys=True))


@dataclasses.dataclass(frozen=True)
class MeshSection:
    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self):
        check_fields(self, "[mesh] ")
        _check(self.data == -1 or self.data > 0, f"[mesh] data must be a positive integer or -1, got {self.data}")
        require_positive_int(self.fsdp, "[mesh] fsdp")
        require_positive_int(self.tensor, "[mesh] tensor")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A whole recipe. `TrainConfig.from_toml(path)` or build it in Python."""

    model: ModelSection
    data: DataSection = DataSection()
    objective: ObjectiveSection = ObjectiveSection()
    optim: OptimSection = OptimSection()
    train: TrainSection = TrainSection()
    lora: LoraConfig = LoraConfig()
    checkpoint: CheckpointSection = CheckpointSection()
    log: LogSection = LogSection()
    mesh: MeshSection = MeshSection()
    distill: DistillSection | None = None
    learn2pd: Learn2PDSection | None = None

    def __post_init__(self):
        _check(self.data.batch_size % self.optim.grad_accum == 0,
               f"[data] batch_size {self.data.batch_size} must be a multiple of [optim] grad_accum "
               f"{self.optim.grad_accum}")
        _check(objective_class(self.objective.kind).packing or not self.data.pack,
               f"[objective] {self.objective.kind} needs [data] pack = false (one example per row)")
        source = data_source(self.data.source)
        _check(source.distill_command is None or self.data.path is not None or self.distill is not None,
               f"[data] source = {self.data.source!r} needs path = \"FILE\" (a `jaxdllm distill "
               f"{source.distill_command}` output) or a [distill] section whose out it reads")
        on_trajectories = objective_class(self.objective.kind).trajectory_selection is not None
        _check(on_trajectories == source.trajectories,
               f"[objective] {self.objective.kind} " + ("trains on Jacobi trajectories: set [data] source = "
                                                        "\"trajectories\"" if on_trajectories else
                                                        "does not train on trajectories: [data] source = "
                                                        "\"trajectories\" needs kind = \"jacobi_forcing\" or \"cllm\""))

    def run_options(self) -> RunOptions:
        """How the trained model runs: float32 master weights (AdamW steps of lr ~1e-5 vanish in bf16
        weights) and `[train] compute_dtype` matmuls, unless `[model]` names run options itself."""
        options = split_options(self.model.overrides)[1]
        return RunOptions(**{"param_dtype": "float32", "dtype": self.train.compute_dtype, **options})

    @property
    def teacher_answers(self) -> str | None:
        """The JSONL that `[data] source = "teacher"` / `"trajectories"` reads: `[data] path`, else `[distill] out`."""
        if self.data.path is not None:
            return self.data.path
        return self.distill.out if self.distill is not None else None

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "TrainConfig":
        sections = {f.name: f.type for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(sections))
        _check(not unknown, f"unknown recipe section(s) {unknown}; known: {sorted(sections)}")
        _check("model" in raw, "the recipe needs a [model] section")
        kwargs = {}
        for name, value in raw.items():
            _check(isinstance(value, dict), f"[{name}] must be a table")
            if name == "model":
                value = dict(value)
                preset, init_from = value.pop("preset", None), value.pop("init_from", None)
                tokenizer = value.pop("tokenizer", None)
                kwargs[name] = ModelSection(preset=preset, init_from=init_from, tokenizer=tokenizer, overrides=value)
                continue
            if name == "objective":
                value = dict(value)
                kwargs[name] = ObjectiveSection(kind=value.pop("kind", ObjectiveSection.kind), settings=value)
                continue
            klass = {"data": DataSection, "optim": OptimSection, "distill": DistillSection, "learn2pd": Learn2PDSection,
                     "train": TrainSection, "lora": LoraConfig, "checkpoint": CheckpointSection,
                     "log": LogSection, "mesh": MeshSection}[name]
            known = {f.name for f in dataclasses.fields(klass)}
            bad = sorted(set(value) - known)
            _check(not bad, f"[{name}] has unknown key(s) {bad}; known: {sorted(known)}")
            kwargs[name] = klass(**value)
        return cls(**kwargs)

    @classmethod
    def from_toml(cls, path: str | Path) -> "TrainConfig":
        """The recipe in `path`: a TOML file, or a shipped recipe's name (`tasks_tiny_cpu`, see
        `jaxdllm.shipped.recipe_path`)."""
        from jaxdllm.shipped import recipe_path

        path = recipe_path(path)
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"recipe {path} is not valid TOML: {e}") from None
        return cls.from_dict(raw)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        model = out.pop("model")
        out["model"] = {k: model[k] for k in ("preset", "init_from", "tokenizer") if model[k]}
        out["model"].update(model["overrides"])
        objective = out.pop("objective")
        out["objective"] = {"kind": objective["kind"], **objective["settings"]}
        for optional in ("distill", "learn2pd"):
            if out[optional] is None:
                del out[optional]
        return out
