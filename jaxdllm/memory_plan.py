"""How many bytes a model needs per device, from shapes and shardings alone: for sampling with a
preset, and for a training step of a recipe, on a named TPU runtime or any mesh.

Nothing is allocated: the parameters come from `nnx.eval_shape`, their per-device share from the
sharding rules (`jaxdllm.sharding.logical_to_spec`) on a mesh given by its axis sizes, so a plan
for a v5e-8 is computed on a laptop. The activation terms are estimates of the largest buffers
XLA keeps (see `sampling_plan` and `training_plan`); `sampling/benchmarks/memory_plan_check.py` compares
them with XLA's own `compiled.memory_analysis()` at small sizes.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from jaxdllm import sharding as shd
from jaxdllm.decoding.canvas import Footprint
from jaxdllm.decoding.config import SamplerConfig
from jaxdllm.errors import ConfigError
from jaxdllm.models.config import ModelConfig
from jaxdllm.models.families import family_of
from jaxdllm.models.run_options import WEIGHT_FORMATS, RunOptions

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Runtime:
    """A TPU runtime: `devices` JAX devices of `hbm_gib` each, on a host with `host_ram_gib`."""

    name: str
    devices: int
    hbm_gib: float
    host_ram_gib: float
    note: str = ""
    hbm_gbps: float = 0.0  # each device's HBM bandwidth (GB/s; 0: not recorded), for bandwidth floors


# Per JAX device (a v2 core, a v4/v5p megacore chip, a v5e/v6e chip). Colab's TPU runtimes are
# v5e-1, v6e-1 and the legacy v2-8; a process is killed past about 12 GiB of host RAM there.
RUNTIMES: dict[str, Runtime] = {r.name: r for r in (
    Runtime("v5e-1", 1, 16, 12, "Colab TPU v5e-1", 819),
    Runtime("v6e-1", 1, 32, 12, "Colab TPU v6e-1", 1640),
    Runtime("v2-8", 8, 8, 12, "Colab's legacy TPU v2-8 (4 chips, 8 cores)"),
    Runtime("v5e-8", 8, 16, 188, "Cloud TPU v5e-8", 819),
    Runtime("v5e-16", 16, 16, 376, "Cloud TPU v5e-16 (2 hosts)", 819),
    Runtime("v5e-32", 32, 16, 752, "Cloud TPU v5e-32 (4 hosts)", 819),
    Runtime("v4-32", 16, 32, 400, "Cloud TPU v4-32 (16 chips)", 1200),
    Runtime("v5p-8", 4, 95, 400, "Cloud TPU v5p-8 (4 chips)", 2765),
    Runtime("v5p-16", 8, 95, 800, "Cloud TPU v5p-16 (8 chips, 2 hosts)", 2765),
)}


@dataclasses.dataclass(frozen=True)
class MeshShape:
    """The sizes of the `(data, fsdp, tensor)` mesh axes; no devices needed."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self):
        for name in ("data", "fsdp", "tensor"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"mesh {name} must be a positive integer, got {value!r}")

    @property
    def shape(self) -> dict[str, int]:  # what `logical_to_spec` reads of a mesh
        return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}

    @property
    def size(self) -> int:
        return self.data * self.fsdp * self.tensor

    @property
    def batch_shards(self) -> int:
        return self.data * self.fsdp

    def __str__(self) -> str:
        return f"{self.data}x{self.fsdp}x{self.tensor}"


def _itemsize(dtype: str) -> int:
    return np.dtype(jax.numpy.dtype(dtype)).itemsize


def _shards(spec, mesh: MeshShape) -> int:
    count = 1
    for entry in spec:
        for axis in (() if entry is None else (entry,) if isinstance(entry, str) else entry):
            count *= mesh.shape[axis]
    return count


def with_weights(options: RunOptions | None, weights: str | None) -> RunOptions:
    """`options` with the weights stored as `weights`: a float dtype (every parameter and the compute
    in it), or `int8` (weight-only int8 linear layers and LM head; the rest in the options'
    `param_dtype`, by default bfloat16: the published checkpoints' dtype, which int8 loading keeps).
    Default options: `RunOptions()` (float32)."""
    if options is None:
        options = RunOptions(param_dtype="bfloat16", dtype="bfloat16") if weights == "int8" else RunOptions()
    if weights is None:
        return options
    if weights not in WEIGHT_FORMATS:
        raise ConfigError(f"weights must be one of {WEIGHT_FORMATS}, got {weights!r}")
    if weights == "int8":
        return options.replace(quantization="int8")
    return options.replace(param_dtype=weights, dtype=weights, quantization=None)


def parameter_bytes(config: ModelConfig, mesh: MeshShape = MeshShape(), dtype: str | None = None,
                    rules=shd.DEFAULT_RULES, options: RunOptions | None = None) -> int:
    """Bytes of the parameters on the most loaded device: each tensor's size over the mesh axes
    its logical axes map to (replicated where they do not divide), for a model run with `options`
    (default `RunOptions()`), counted in `dtype` (default: the options' `param_dtype`; int8
    kernels of quantized options stay one byte)."""
    total = 0
    for shape, value_dtype, axes in _parameter_shapes(config, RunOptions() if options is None else options):
        spec = shd.logical_to_spec(axes, shape, mesh, rules)
        floating = jax.numpy.issubdtype(value_dtype, jax.numpy.floating)
        itemsize = _itemsize(dtype) if dtype and floating else value_dtype.itemsize
        total += -(-math.prod(shape) // _shards(spec, mesh)) * itemsize
    return total


def _parameter_shapes(config: ModelConfig, options: RunOptions) -> tuple:
    """`(shape, dtype, logical axes)` of every parameter of `config`'s model run with `options`: its
    family's answer (`Family.parameter_shapes`, from `nnx.eval_shape`, cached: a plan over several
    runtimes traces the model once)."""
    return family_of(config).parameter_shapes(config, options)


def _local(n: int, shards: int) -> int:
    """`n` split over `shards` devices (not split where it does not divide, as the rules do)."""
    return n // shards if n % shards == 0 else n


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-device bytes by term (`terms`), their `total`, and what it was computed for."""

    what: str
    mesh: str
    terms: dict
    notes: tuple = ()

    @property
    def total(self) -> int:
        return sum(self.terms.values())

    def fits(self, runtime: Runtime, headroom: float = 0.9) -> bool:
        """Whether the total fits in `headroom` of one device's HBM (XLA keeps some for itself)."""
        return self.total <= headroom * runtime.hbm_gib * GIB

    def table(self) -> str:
        """The terms one per line, in GiB (MiB for a plan under 1 GiB)."""
        unit, scale = ("GiB", GIB) if self.total >= GIB else ("MiB", 2 ** 20)
        rows = [f"{name:>22s}  {value / scale:8.2f} {unit}" for name, value in self.terms.items()]
        return "\n".join([f"{self.what} on mesh {self.mesh} (per device)", *rows,
                          f"{'total':>22s}  {self.total / scale:8.2f} {unit}"])

    def to_dict(self) -> dict:
        return {"what": self.what, "mesh": self.mesh, "terms_bytes": dict(self.terms), "total_bytes": self.total,
                "total_gib": round(self.total / GIB, 3), "notes": list(self.notes)}


def _flash(options: RunOptions, platform: str) -> bool:
    """Whether attention runs in a tiled kernel (no `[Lq, Lk]` score matrix kept)."""
    if options.attention_impl in ("splash", "pallas", "cudnn"):
        return True
    return options.attention_impl == "auto" and platform in ("tpu", "gpu")


def sampling_plan(config: ModelConfig, sampler: SamplerConfig, *, batch: int, prompt_len: int,
                  mesh: MeshShape = MeshShape(), dtype: str | None = None, platform: str = "tpu",
                  options: RunOptions | None = None, companions: dict | None = None) -> MemoryPlan:
    """Per-device bytes of `jaxdllm.generate` with `sampler` on prompts `[batch, prompt_len]`.

    The canvas the sampler's policy decodes on says what its compiled loop holds per row
    (`Canvas.footprint`: the canvas's columns, the K/V slots it keeps, its widest forward, the logits a
    step keeps, its second models); this turns that into bytes for the model, the mesh and the dtype.

    Terms: `weights` (in `dtype`: a float dtype or `int8`, see `with_weights`; default the
    `options`' own); `kv_cache` (K and V of every layer, each layer with its own K/V shape, over the
    slots the canvas keeps); `logits` (the float32 `[positions, V]` buffers a step keeps);
    `activations` (the largest layer of the widest forward, and its `[Lq, Lk]` scores unless attention
    is a tiled kernel on `platform`); `decode_state` (canvas, commit steps and masks). MoE models add
    `moe_dispatch`: the widest MoE layer's routed rows. Experts shard over `fsdp` (the `expert` rule)
    and XLA runs each device's experts on every token of the step, so the rows are the whole batch's:
    the gathered inputs, the float32 gate/up/down outputs of `experts_per_token` rows per token, and
    the router's float32 scores.

    A canvas or policy that runs a second model (SpecDiff's drafter, APD's verifier) adds its weights
    and the same terms for it (`<role>_weights`, `<role>_kv_cache`, `<role>_logits`,
    `<role>_activations`): pass its `ModelConfig` as `companions={role: config}`.
    """
    c, o = config, with_weights(options, dtype)
    rows = _local(batch, mesh.batch_shards)
    canvas = sampler.canvas
    shape = canvas.footprint(c, sampler, prompt_len)
    terms = {"weights": parameter_bytes(c, mesh, options=o), **_forward_terms(c, o, mesh, rows, shape, platform),
             "logits": shape.logit_copies * rows * shape.logits * _local(c.vocab_size, mesh.tensor) * 4,
             "decode_state": rows * shape.canvas * 16}
    e = c.experts
    if e is not None:
        routed = batch * shape.widest * e.experts_per_token  # every token of the step, on every expert shard
        terms["moe_dispatch"] = (routed * (c.embed_dim * (_itemsize(o.dtype) + 4)
                                           + 2 * _local(e.expert_dim, mesh.tensor) * 4)
                                 + batch * shape.widest * e.num_experts * 4)
    given = dict(companions or {})
    for part in shape.companions:
        if part.role not in given:
            raise ConfigError(f"policy {sampler.policy.name!r} runs a {part.role} in the loop: pass its ModelConfig "
                              f"as sampling_plan(..., companions={{{part.role!r}: config}}) so the plan counts it")
        other = given.pop(part.role)
        second = Footprint(canvas=0, kv_slots=part.kv_slots, widest=part.widest, attended=part.kv_slots,
                           logits=part.logits)
        terms[f"{part.role}_weights"] = parameter_bytes(other, mesh, options=o)
        for name, value in _forward_terms(other, o, mesh, rows, second, platform).items():
            terms[f"{part.role}_{name}"] = value
        terms[f"{part.role}_logits"] = rows * part.logits * _local(other.vocab_size, mesh.tensor) * 4
    if given:
        raise ConfigError(f"policy {sampler.policy.name!r} runs no {' or '.join(map(repr, sorted(given)))}: drop it "
                          "from companions=")
    notes = ("XLA's own workspace and fragmentation are not counted: keep 10 % of HBM free",)
    return MemoryPlan(f"sampling {sampler.policy.name}/{sampler.cache.name}, batch {batch}, prompt {prompt_len}"
                      f" + {sampler.gen_length}", str(mesh), terms, notes)


def _forward_terms(c: ModelConfig, o: RunOptions, mesh: MeshShape, rows: int, shape: Footprint, platform: str) -> dict:
    """`kv_cache` and `activations` bytes per device of one model over a canvas `Footprint`."""
    act = _itemsize(o.dtype)
    heads_local = _local(c.num_heads, mesh.tensor)
    kv_per_slot = sum(_local(c.kv_shape(i)[0], mesh.tensor) * c.kv_shape(i)[1] for i in range(c.num_layers))
    scores = 0 if _flash(o, platform) else rows * heads_local * shape.widest * shape.attended * 4
    gathered = 2 * rows * shape.gathered * (kv_per_slot // c.num_layers) * act  # one layer's gathered view (K and V)
    return {"kv_cache": 2 * rows * shape.kv_slots * kv_per_slot * act,
            "activations": (rows * shape.widest * (4 * c.embed_dim + 3 * _local(c.mlp_dim, mesh.tensor)) * act + scores
                            + gathered)}


def training_plan(config: ModelConfig, recipe, *, mesh: MeshShape = MeshShape(), rows: int | None = None,
                  seq_len: int | None = None, platform: str = "tpu") -> MemoryPlan:
    """Per-device bytes of one training step of `recipe` (a `TrainConfig`) for `config`.

    Terms: `weights` (the master copy in the recipe's `param_dtype`, float32 by default);
    `gradients` and `adam_moments` (float32, of the trainable parameters: all of them, or the
    LoRA adapters); `activations` (what the backward pass keeps per layer of each micro-batch:
    about 6 embed-wide and 3 MLP-wide tensors per token, plus the `[L, L]` scores unless
    attention is a tiled kernel), times the copies of the batch the objective stacks in its forward
    (`Objective.stacked_views`: the two views of certainty forcing); `logits` (float32 logits,
    probabilities and their gradient over the micro-batch, times the same copies).
    """
    c, o = config, recipe.run_options()
    rows = rows or recipe.data.batch_size
    seq_len = seq_len or recipe.data.seq_len
    micro = _local(rows // recipe.optim.grad_accum, mesh.batch_shards)
    act = _itemsize(o.dtype)
    weights = parameter_bytes(c, mesh, options=o)
    if recipe.lora.enabled:
        trainable = _lora_bytes(c, recipe.lora, mesh)
    else:
        trainable = parameter_bytes(c, mesh, dtype="float32", options=o)
    views = recipe.objective.build().stacked_views
    heads_local = _local(c.num_heads, mesh.tensor)
    per_layer = micro * seq_len * (10 * c.embed_dim + 5 * _local(c.mlp_dim, mesh.tensor)) * act
    if not _flash(o, platform):  # scores and probabilities
        per_layer += 2 * micro * heads_local * seq_len * seq_len * 4
    if recipe.lora.enabled:  # each adapted projection keeps its float32 `x A` and `(x A) B` for the backward
        widths = _projection_widths(c)
        per_layer += micro * seq_len * sum(widths[t][1] + recipe.lora.rank for t in recipe.lora.targets) * 4
    saved_layers = 1 if o.remat != "none" else c.num_layers
    terms = {"weights": weights + (trainable if recipe.lora.enabled else 0),
             "gradients": trainable, "adam_moments": 2 * trainable,
             "activations": views * saved_layers * per_layer,
             "logits": views * 3 * micro * seq_len * _local(c.vocab_size, mesh.tensor) * 4}
    notes = ("XLA's own workspace and fragmentation are not counted: keep 10 % of HBM free",)
    return MemoryPlan(f"training {recipe.objective.kind}{' + LoRA' if recipe.lora.enabled else ''}, "
                      f"{rows} x {seq_len} tokens, accumulation {recipe.optim.grad_accum}", str(mesh), terms, notes)


def _projection_widths(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """`(inputs, outputs)` of each projection LoRA can adapt."""
    e, h, kv, d, m = config.embed_dim, config.num_heads, config.num_kv_heads, config.head_dim, config.mlp_dim
    return {"q": (e, h * d), "k": (e, kv * d), "v": (e, kv * d), "o": (h * d, e), "gate": (e, m), "up": (e, m),
            "down": (m, e)}


def _lora_bytes(config: ModelConfig, lora, mesh: MeshShape) -> int:
    """float32 bytes of the LoRA adapters (A: inputs x rank, B: rank x outputs, per projection)."""
    shapes = _projection_widths(config)
    per_layer = sum((i + o) * lora.rank for name, (i, o) in shapes.items() if name in lora.targets)
    return -(-config.num_layers * per_layer * 4 // mesh.fsdp)


def expected_experts_touched(config: ModelConfig, tokens: int) -> float:
    """Distinct routed experts a forward over `tokens` tokens runs in one MoE layer, expected under
    uniform routing (each token picks `experts_per_token` of `num_experts`): `E (1 - (1 - k/E)^T)`;
    0 for a dense model."""
    if config.experts is None:
        return 0.0
    e, k = config.experts.num_experts, config.experts.experts_per_token
    return e * (1 - (1 - k / e) ** tokens)


def step_weight_bytes(config: ModelConfig, tokens: int, dtype: str | None = None,
                      options: RunOptions | None = None) -> int:
    """Weight bytes a forward over `tokens` tokens reads from memory (all devices together): every
    parameter except the routed experts, plus the experts it is expected to run
    (`expected_experts_touched`). For a dense model, all the weights. `dtype`: as `with_weights`."""
    c, o = config, with_weights(options, dtype)
    total = parameter_bytes(c, options=o)
    if c.experts is None:
        return total
    per_expert = 3 * c.embed_dim * c.experts.expert_dim * (1 if o.quantization == "int8" else _itemsize(o.param_dtype))
    untouched = c.experts.num_experts - expected_experts_touched(c, tokens)
    return int(total - c.num_moe_layers * untouched * per_expert)


def runtime_mesh(runtime: Runtime, tensor: int = 1) -> MeshShape:
    """The runtime's devices as a mesh: `tensor`-way tensor parallel, the rest fsdp."""
    if runtime.devices % tensor:
        raise ConfigError(f"{runtime.name} has {runtime.devices} devices, not divisible by tensor={tensor}")
    return MeshShape(data=1, fsdp=runtime.devices // tensor, tensor=tensor)


def runtime_plans(config: ModelConfig, sampler: SamplerConfig, names, *, batch: int, prompt_len: int,
                  dtype: str | None = None) -> dict[str, dict]:
    """`{runtime name: summary}`: `sampling_plan` on each runtime of `names` (keys of `RUNTIMES`),
    fsdp over its devices, with at least one row per device. Each summary holds the device's HBM,
    whether the plan fits, every term and the total in GiB, the batch and the mesh (what
    `jaxdllm inspect --plan` prints)."""
    unknown = [n for n in names if n not in RUNTIMES]
    if unknown:
        raise ConfigError(f"unknown runtime(s) {unknown}; known: {list(RUNTIMES)}")
    out = {}
    for name in names:
        runtime = RUNTIMES[name]
        rows = max(batch, runtime.devices)
        plan = sampling_plan(config, sampler, batch=rows, prompt_len=prompt_len, mesh=runtime_mesh(runtime),
                             dtype=dtype)
        out[name] = {"hbm_gib_per_device": runtime.hbm_gib, "fits": plan.fits(runtime),
                     **{f"{k}_gib": round(v / GIB, 2) for k, v in plan.terms.items()},
                     "total_gib": round(plan.total / GIB, 2), "batch": rows, "mesh": plan.mesh}
    return out


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
    """What a runtime offers: JAX's `device_kind`, the device count, and each device's memory
    (None where JAX does not report it, e.g. on a CPU)."""

    kind: str
    count: int
    bytes_per_device: int | None

    @classmethod
    def of_this_machine(cls) -> "DeviceFacts":
        """The facts of `jax.devices()`: kind, count and `memory_stats()["bytes_limit"]`."""
        devices = jax.devices()
        stats = devices[0].memory_stats() or {}
        return cls(devices[0].device_kind, len(devices), stats.get("bytes_limit"))


@dataclasses.dataclass(frozen=True)
class DecodingSetup:
    """The mesh and weight format (`dtype`: a float dtype or `int8`) `choose_decoding_setup` picked, the plan behind it, and a
    sentence for the user (`fits` False: nothing fits, and the sentence says what would)."""

    mesh: MeshShape
    dtype: str
    plan: MemoryPlan
    fits: bool
    message: str

    @property
    def load_kwargs(self) -> dict:
        """`from_pretrained` keywords for the chosen weights: `{"dtype": ...}`, or for int8 the
        `quantization` (the other parameters keep the checkpoint's dtype)."""
        return {"quantization": "int8"} if self.dtype == "int8" else {"dtype": self.dtype}


def choose_decoding_setup(config: ModelConfig, sampler: SamplerConfig, facts: DeviceFacts, *, prompt_len: int,
                          batch: int = 1, dtypes=("bfloat16", "int8"), headroom: float = 0.9) -> DecodingSetup:
    """The first layout that fits a decoding run on the devices `facts` describes: every device
    in one mesh (tensor parallel when the heads divide, else fsdp), the weight formats in order
    (`dtypes`: float dtypes or `int8`; by default bf16, then int8 where bf16 does not fit).

    Returns a `DecodingSetup`; when nothing fits, `fits` is False and `message` names the bytes
    needed and the runtimes where the plan fits (`RUNTIMES`).
    """
    heads_divide = config.num_heads % facts.count == 0 and config.num_kv_heads % facts.count == 0
    mesh = MeshShape(tensor=facts.count) if heads_divide else MeshShape(fsdp=facts.count)
    rows = max(batch, mesh.batch_shards)
    plans = [(dtype, sampling_plan(config, sampler, batch=rows, prompt_len=prompt_len, mesh=mesh, dtype=dtype))
             for dtype in dtypes]
    if facts.bytes_per_device is None:  # no device memory reported (a CPU): the host's RAM decides
        dtype, plan = plans[0]
        return DecodingSetup(mesh, dtype, plan, True, f"{plan.total / 2**20:.1f} MiB per device on mesh {mesh} "
                                                      f"({dtype}); {facts.kind} reports no device memory")
    usable = headroom * facts.bytes_per_device
    for dtype, plan in plans:
        if plan.total <= usable:
            return DecodingSetup(mesh, dtype, plan, True,
                                 f"{plan.total / GIB:.2f} GiB per device of {facts.bytes_per_device / GIB:.1f} on "
                                 f"{facts.count} x {facts.kind}, mesh {mesh}, {dtype} weights")
    dtype, plan = min(plans, key=lambda p: p[1].total)
    where = [r.name for r in RUNTIMES.values()
             if sampling_plan(config, sampler, batch=max(batch, r.devices), prompt_len=prompt_len,
                              mesh=runtime_mesh(r, tensor=r.devices if config.num_heads % r.devices == 0
                                                and config.num_kv_heads % r.devices == 0 else 1),
                              dtype=dtype).fits(r, headroom)]
    return DecodingSetup(mesh, dtype, plan, False,
                         f"this model needs {plan.total / GIB:.1f} GiB per device ({dtype} weights "
                         f"{plan.terms['weights'] / GIB:.1f} GiB) but {facts.count} x {facts.kind} offers "
                         f"{usable / GIB:.1f} GiB usable of {facts.bytes_per_device / GIB:.1f}; it fits on "
                         f"{', '.join(where) or 'none of the known runtimes'}")
