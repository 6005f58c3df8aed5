"""`Sampler`: a model's parameters held once, placed as the model was (sharded or not), and a
batch placed over the mesh's data axes; `generate` and `generate_stepwise` are its one-call forms.

    sampler = jaxdllm.Sampler(model)                 # split once
    out = sampler(prompt_ids, SamplerConfig.preset("fast-dllm-dual"), attention_mask=mask)
    sampler.params = new_params                      # e.g. after a training step; same tree, shapes

When the parameters live on a mesh (`from_pretrained(..., mesh=mesh)`), the prompts are sharded
over its `batch` axes (`data`, `fsdp` in `jaxdllm.sharding.DEFAULT_RULES`), padded with idle rows
to a multiple of their size; the idle rows start finished and are dropped from the result.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from jaxdllm import sharding as shd
from jaxdllm.decoding.config import SamplerConfig
from jaxdllm.decoding.layout import (Layout, answer_columns, block_lead, prepare_block_prompts, prepare_prompts,
                                     prompt_bucket)
from jaxdllm.decoding.loop import decode, decode_stepwise, decode_to_export
from jaxdllm.decoding.policies import POLICIES
from jaxdllm.errors import ConfigError, ConfigTypeError, DeviceMemoryError, InputError, out_of_memory_message


class GenerateResult(NamedTuple):
    """Host (numpy) results of one generation."""

    tokens: np.ndarray        # [B, Lp + G]
    nfe: np.ndarray           # [B]
    commit_step: np.ndarray   # [B, Lp + G]
    trajectory: np.ndarray | None  # [B, max_trajectory, Lp + G] or None
    steps: int                # loop iterations (forwards of the whole batch)
    initial: np.ndarray | None = None  # [B, Lp + G] the canvas before the first step, with a trajectory
    prompt_len: int = 0       # Lp, the width of the prompts as passed: the answer starts at this column
    drafter_forwards: np.ndarray | None = None  # [B] a drafting second model's forwards (`spec_diffusion`)

    @property
    def generated(self) -> np.ndarray:
        """`[B, G]` the generated tokens (EOS filler included; `Tokenizer.answers` cuts it)."""
        return self.tokens[:, self.prompt_len:]


class Prepared(NamedTuple):
    """Host-side prompts of one call, bucketed and left-padded, and the static layout."""

    ids: np.ndarray     # [B', Lp] (B' >= B: idle rows added for the data sharding)
    seg: np.ndarray     # [B', Lp] 1 on prompt tokens (and a block-causal lead's MASK), 0 on padding
    valid: np.ndarray   # [B'] rows that are real prompts
    lay: Layout
    extra: int          # padding columns added in front (dropped from the result)
    rows: int           # B
    answer_start: np.ndarray | None = None  # [B'] block-causal layout: each row's first answer column
    prompts: np.ndarray | None = None       # [B, Lp_in] block-causal layout: the prompts as passed


def check(model_config, config: SamplerConfig, prompt_len: int, policy_params=None, lead: int = 0) -> None:
    """Errors a user can act on, raised before anything compiles (`lead`: the block-causal layout's
    first block, whose answer columns are whole blocks: `layout.answer_columns`)."""
    config.canvas.check_model(model_config, config)
    if prompt_len >= model_config.max_position:
        raise ConfigError(f"the prompt alone ({prompt_len} tokens after padding) fills the model's max_position "
                          f"({model_config.max_position}): shorten it to fewer than {model_config.max_position} "
                          "tokens, leaving room for gen_length")
    answer = answer_columns(config.gen_length, lead)
    if prompt_len + answer > model_config.max_position:
        blocks = f" (to the end of its last block of {lead}: {answer})" if answer != config.gen_length else ""
        room = model_config.max_position - prompt_len
        raise ConfigError(f"prompt ({prompt_len} tokens after padding) + gen_length ({config.gen_length}{blocks}) "
                          f"exceeds the model's max_position ({model_config.max_position}): lower gen_length "
                          f"to at most {room // lead * lead if lead else room}, or "
                          "shorten the prompt (padding to prompt_bucket is dropped when it would not fit)")
    if config.stop_at_eos and model_config.eos_token_id is None:
        raise ConfigError("stop_at_eos needs the model config's eos_token_id")
    policy = config.policy
    if policy_params is None and policy.needs_params:
        raise ConfigError(f"policy {policy.name!r} reads {policy.params_kind}: load it with "
                          "params = jaxdllm.policy_params(model_dir, config) and pass generate(..., "
                          "policy_params=params)")
    if policy_params is not None and not policy.needs_params:
        readers = [name for name, cls in POLICIES.items() if cls.needs_params]
        raise ConfigError(f"policy {policy.name!r} has no parameters of its own: drop policy_params (only "
                          f"{', '.join(map(repr, readers))} take them)")


def second_model(config: SamplerConfig, policy_params=None, companions: dict | None = None):
    """The module the loop carries for `config.policy`: `policy_params` (a filter, heads, or a second
    model), or the second model named by its role in `companions` (`{"drafter": model}` for
    `spec_diffusion`, `{"verifier": model}` for `apd`: `Policy.companion`). Errors name the role."""
    if not companions:
        return policy_params
    policy, role = config.policy, config.policy.companion
    if not role:
        raise ConfigError(f"policy {policy.name!r} runs no second model: drop companions= "
                          f"(got {', '.join(map(repr, companions))})")
    if set(companions) != {role}:
        raise ConfigError(f"policy {policy.name!r} runs a {role}: pass companions={{{role!r}: model}}, got "
                          f"{', '.join(map(repr, companions))}")
    if policy_params is not None:
        raise ConfigError(f"the {role} of policy {policy.name!r} was given twice: pass companions= or "
                          "policy_params=, not both")
    return companions[role]


def check_inputs(model_config, input_ids, attention_mask) -> None:
    """Errors in the arrays a user passes (`input_ids [B, Lp]`, `attention_mask [B, Lp]` or None),
    each naming the row: float or bool ids, ids outside the vocabulary, a mask row with no token,
    mask values other than 0/1, left-padded rows passed without a mask, and rows of different lengths."""
    try:
        ids = np.asarray(input_ids)
    except ValueError as e:  # a list of prompts of different lengths
        raise InputError(f"input_ids rows differ in length ({e}); left-pad them to one length and pass "
                         "attention_mask (0 for padding), or pass the tokenizer's batch: tok(texts)") from None
    if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"input_ids must be integer token ids, got dtype {ids.dtype} (a float array would be "
                         "truncated): pass the tokenizer's ids, e.g. tok(texts).ids")
    if ids.ndim != 2 or ids.size == 0:
        raise InputError(f"input_ids must be [batch, prompt_len] with at least one token, got shape {ids.shape}")
    bad = np.argwhere((ids < 0) | (ids >= model_config.vocab_size))
    if len(bad):
        row, col = bad[0]
        raise InputError(f"input_ids row {row}, position {col}: id {ids[row, col]} is outside the vocabulary "
                         f"[0, {model_config.vocab_size}) ({len(bad)} such ids in all)")
    if attention_mask is not None:
        mask = np.asarray(attention_mask)
        if mask.shape == ids.shape:
            if not np.isin(mask, (0, 1)).all():
                raise InputError("attention_mask must hold 0 (padding) and 1 (prompt token) only")
            empty = np.flatnonzero(mask.sum(1) == 0)
            if len(empty):
                raise InputError(f"attention_mask row {empty[0]} has no prompt token: every row needs at least one "
                                 f"({len(empty)} empty rows)")
        return
    pad = model_config.pad_token_id
    if pad is not None and pad != model_config.bos_token_id and ids.shape[0] > 1:
        padded = np.flatnonzero(ids[:, 0] == pad)
        if 0 < len(padded) < ids.shape[0]:
            raise InputError(f"input_ids row {padded[0]} starts with the pad id {pad} but no attention_mask was "
                             "given, so the padding would be read as prompt: pass attention_mask (tok(texts) "
                             "returns ids and mask)")


def prepare(model_config, input_ids, attention_mask, config: SamplerConfig, row_multiple: int = 1,
            policy_params=None) -> Prepared:
    """Bucket and left-pad the prompts, check everything, and fix the layout (host only)."""
    check_inputs(model_config, input_ids, attention_mask)
    pad_id = model_config.pad_token_id if model_config.pad_token_id is not None else 0
    prompt_len = np.shape(input_ids)[-1]
    bucket = prompt_bucket(model_config, config, prompt_len)
    answer_start = prompts = None
    lead = extra = 0
    if model_config.attention == "block_causal" and config.canvas.block_layout:
        lead = block_lead(model_config, config)
        # A token-shifted model reads the logit before the first decoded block: keep a block of context.
        ids, seg, answer_start = prepare_block_prompts(input_ids, attention_mask, lead, bucket, pad_id,
                                                       model_config.mask_token_id,
                                                       min_context=lead if model_config.shift_logits else 0)
        prompts = np.asarray(input_ids)
    else:
        ids, seg, extra = prepare_prompts(input_ids, attention_mask, bucket, pad_id)
    check(model_config, config, ids.shape[1], policy_params, lead)
    rows = ids.shape[0]
    idle = -rows % row_multiple
    valid = np.concatenate([np.ones(rows, bool), np.zeros(idle, bool)])
    ids = np.concatenate([ids, np.repeat(ids[-1:], idle, 0)])  # idle rows: a copy of the last (never decoded)
    seg = np.concatenate([seg, np.repeat(seg[-1:], idle, 0)])
    if answer_start is not None:
        answer_start = np.concatenate([answer_start, np.repeat(answer_start[-1:], idle)])
    mc = model_config
    lay = Layout(prompt_len=ids.shape[1], total=ids.shape[1] + answer_columns(config.gen_length, lead),
                 mask_id=mc.mask_token_id,
                 shift=int(mc.shift_logits), eos_eot=tuple(t for t in (mc.eos_token_id, mc.eot_token_id) if t is not None),
                 eos_id=mc.eos_token_id, attention=mc.attention, block_size=mc.block_size, lead=lead)
    return Prepared(ids, seg, valid, lay, extra, rows, answer_start, prompts)


@contextlib.contextmanager
def _decoding_mesh(params_mesh):
    """Decode under the parameters' mesh (so activation constraints and the attention kernels'
    `shard_map` see it), whatever mesh context the caller set; with unsharded parameters inside
    `jax.set_mesh(mesh)` with Explicit axes (a `jax.make_mesh` mesh), under that mesh's Auto twin."""
    if params_mesh is not None:
        with jax.set_mesh(shd.auto_mesh(params_mesh)):
            yield
    elif not jax.sharding.get_abstract_mesh().empty:
        # One-device parameters decode on their device: outside the caller's mesh, whose devices jit
        # would otherwise require of every argument ("incompatible devices").
        with jax.set_mesh(None):
            yield
    else:
        yield


def _recreated(key: jax.Array) -> jax.Array:
    """`key` made again from its host value: a key created under another mesh context carries that
    mesh in its type."""
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(np.asarray(jax.random.key_data(key)), impl=jax.random.key_impl(key))
    return jax.numpy.asarray(np.asarray(key))


def _mesh_of(params):
    for leaf in jax.tree.leaves(params):
        if isinstance(getattr(leaf, "sharding", None), NamedSharding):
            return leaf.sharding.mesh
    return None


class Sampler:
    """Decodes with one model whose parameters it holds (split once, kept where they are placed).

    Args:
      model: a `Transformer`, on one device or sharded over a mesh.
      rules: the logical-axis rules: the mesh axes of `batch` for the rows, and the table in force
        for the model's activation constraints while the loop is traced (default
        `sharding.DEFAULT_RULES`; use the rules the model was placed with).
    """

    def __init__(self, model, rules=shd.DEFAULT_RULES):
        self.model_config = model.config
        if model.options.remat != "none":  # remat only costs time when nothing is differentiated
            model = model.with_options(remat="none")  # a view over the same arrays; the caller's model is untouched
        self._graphdef, self._params = nnx.split(model)
        self._rules = rules
        self._static_rules = shd.frozen_rules(rules)  # the loop's static argument
        self._row_multiple = 1
        mesh = self._mesh = _mesh_of(self._params)
        if mesh is not None:
            self._row_multiple = shd.batch_shards(mesh, rules)

    # -- parameters --------------------------------------------------------------------------
    @property
    def params(self) -> nnx.State:
        """The model state the sampler decodes with."""
        return self._params

    @params.setter
    def params(self, state: nnx.State) -> None:
        """Replace the parameters: same tree, shapes and dtypes; placed like the current ones."""
        old, new = jax.tree.leaves(self._params), jax.tree.leaves(state)
        if jax.tree.structure(self._params) != jax.tree.structure(state):
            raise ConfigError("new params must have the same tree structure as the model's")
        for a, b in zip(old, new):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise ConfigError(f"new params must keep shapes and dtypes: {b.shape} {b.dtype} vs {a.shape} {a.dtype}")
        self._params = jax.device_put(state, jax.tree.map(lambda x: x.sharding, self._params))

    # -- decoding ----------------------------------------------------------------------------
    def _row_sharding(self, ndim: int) -> NamedSharding | None:
        """Rows over the mesh's batch axes, the other `ndim - 1` dims whole (None: one device)."""
        if self._mesh is None:
            return None
        return shd.batch_sharding(self._mesh, ndim, self._rules)

    def _place(self, host: np.ndarray):
        sharding = self._row_sharding(host.ndim)
        if sharding is None:
            return host
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    def _run(self, driver, input_ids, config, attention_mask, key, policy_params) -> GenerateResult:
        if not isinstance(config, SamplerConfig):
            raise ConfigTypeError(f"config must be a SamplerConfig, got {type(config).__name__}")
        if hasattr(input_ids, "ids") and hasattr(input_ids, "mask"):  # a tokenizer's TokenBatch
            attention_mask = input_ids.mask if attention_mask is None else attention_mask
            input_ids = input_ids.ids
        p = prepare(self.model_config, input_ids, attention_mask, config, self._row_multiple, policy_params)
        params_def, params_state = (None, None) if policy_params is None else nnx.split(policy_params)
        try:
            with _decoding_mesh(self._mesh):
                key = jax.random.PRNGKey(0) if key is None else _recreated(key)
                answer_start = None if p.answer_start is None else self._place(p.answer_start)
                state = driver(self._graphdef, self._params, self._place(p.ids), self._place(p.seg),
                               self._place(p.valid), key, params_state, answer_start, canvas=config.canvas,
                               lay=p.lay, config=config, params_def=params_def, rules=self._static_rules)
            return _result(state, p, config)
        except Exception as e:  # XLA's out of memory has no stable public type: read its status
            memory = out_of_memory_message(e, self._sizes(p))
            if memory is None:
                raise
            raise DeviceMemoryError(memory) from e

    def _abstract_call(self, input_shape: tuple[int, int], config: SamplerConfig, policy_params=None):
        """`(args, kwargs)` of `decode` for prompts of `input_shape`, as shapes and shardings
        (`policy_params`: a module, its arrays real or `jax.ShapeDtypeStruct`s)."""
        if not isinstance(config, SamplerConfig):
            raise ConfigTypeError(f"config must be a SamplerConfig, got {type(config).__name__}")
        ids = np.ones(input_shape, np.int32)  # placeholder prompts: only their shape is lowered
        p = prepare(self.model_config, ids, None, config, self._row_multiple, policy_params)
        params_def = params_state = None
        if policy_params is not None:
            params_def, params_state = nnx.split(policy_params)
            params_state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                       sharding=getattr(x, "sharding", None)),
                                        params_state)

        def spec(host: np.ndarray):
            return jax.ShapeDtypeStruct(host.shape, host.dtype, sharding=self._row_sharding(host.ndim))

        key = jax.ShapeDtypeStruct((2,), np.uint32)  # a raw PRNGKey
        answer_start = None if p.answer_start is None else spec(p.answer_start)
        args = (self._graphdef, self._params, spec(p.ids), spec(p.seg), spec(p.valid), key, params_state,
                answer_start)
        return args, dict(canvas=config.canvas, lay=p.lay, config=config, params_def=params_def,
                          rules=self._static_rules)

    def export(self, input_shape: tuple[int, int], config: SamplerConfig, *, platform: str = "tpu",
               policy_params=None):
        """Lower the compiled loop for `platform` ("tpu", "cuda" or "cpu") without running it, on
        any machine: the attention kernels are lowered as they would be there (Mosaic splash on
        TPU), for the mesh the parameters are placed on. The sampler may hold abstract parameters
        (`jaxdllm.lowering.abstract_model`): no weights are needed.

        Args:
          input_shape: `(B, Lp)` of the prompts (B a multiple of the mesh's batch axes).
          config: the `SamplerConfig` to lower.
          platform: the target platform.
          policy_params: the policy's own parameters or second model (see `__call__`), real or
            abstract (`jaxdllm.lowering.abstract_model` of the second model's config).

        Returns:
          A `jax.export.Exported` (`.mlir_module()` is the StableHLO text).
        """
        from jaxdllm.attention.platform import exporter, lowering_for

        args, kwargs = self._abstract_call(input_shape, config, policy_params)
        with _decoding_mesh(self._mesh), lowering_for(platform):
            return exporter(decode_to_export(), platform)(*args, **kwargs)

    def lower(self, input_shape: tuple[int, int], config: SamplerConfig, *, policy_params=None):
        """The loop lowered for this machine (`jax.stages.Lowered`): `.compile().memory_analysis()`
        gives XLA's byte counts for prompts of `input_shape` (see `jaxdllm.memory_plan`);
        `policy_params` as for `export`."""
        args, kwargs = self._abstract_call(input_shape, config, policy_params)
        with _decoding_mesh(self._mesh):
            return decode_to_export().lower(*args, **kwargs)

    def _sizes(self, p: Prepared) -> str:
        """What a decoding call holds, for an out-of-memory message."""
        weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self._params))
        devices = 1 if self._mesh is None else self._mesh.size
        return (f"{p.ids.shape[0]} rows x {p.lay.total} positions (prompt {p.lay.prompt_len} + gen_length "
                f"{p.lay.total - p.lay.prompt_len}), weights {weights / 2**30:.2f} GiB on {devices} device(s)")

    def __call__(self, input_ids, config: SamplerConfig, attention_mask=None, *, key: jax.Array | None = None,
                 policy_params: nnx.Module | None = None, companions: dict | None = None) -> GenerateResult:
        """Decode `gen_length` tokens after each prompt in one compiled call.

        Args:
          input_ids: `[B, Lp]` prompts, left-padded where lengths differ, or a `TokenBatch` from
            calling the tokenizer (its mask is the attention mask).
          config: a `SamplerConfig` (see `SamplerConfig.preset`).
          attention_mask: `[B, Lp]` 1 for prompt tokens, 0 for left padding; default all ones.
          key: PRNG key for sampling, random remasking and draft initialisation (default `PRNGKey(0)`).
          policy_params: the parameters of a policy that has its own (`Policy.needs_params`), as
            an NNX module: for `learn2pd`, its filter (`Learn2PDFilter`: `[B, block_length]`
            top-1 probabilities to accept logits of the same shape). The policy reads it as
            `StepContext.policy_params`; the loop only carries it.
          companions: a second model the policy runs, by its role (`Policy.companion`):
            `{"drafter": model}` for `spec_diffusion`, `{"verifier": model}` for `apd`
            (`jaxdllm.companions(model_dir, config)` loads it beside a checkpoint).

        Returns:
          `GenerateResult(tokens [B, Lp+G], nfe [B], commit_step [B, Lp+G], trajectory, steps, initial,
          prompt_len)`; `.generated` is `tokens[:, prompt_len:]`, `[B, G]`.
        """
        return self._run(decode, input_ids, config, attention_mask, key,
                         second_model(config, policy_params, companions))

    def stepwise(self, input_ids, config: SamplerConfig, attention_mask=None, *, key: jax.Array | None = None,
                 policy_params: nnx.Module | None = None, companions: dict | None = None) -> GenerateResult:
        """The same decoding as `__call__`, driven by a Python loop of jitted steps (for benchmarks)."""
        return self._run(decode_stepwise, input_ids, config, attention_mask, key,
                         second_model(config, policy_params, companions))


def _host(x) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def _block_layout_result(canvas, commit_step, nfe, trajectory, steps, initial, p: Prepared,
                         config: SamplerConfig) -> GenerateResult:
    """A block-causal canvas back in the caller's layout: each row's prompt as passed, then the
    `gen_length` tokens from its own answer column (a block's positions past them are dropped)."""
    r, G = p.rows, config.gen_length
    prompts = np.asarray(p.prompts, canvas.dtype)
    cols = p.answer_start[:r, None] + np.arange(G)[None]

    def answer(x):  # [r, T] or [r, S, T] -> the answer columns
        idx = cols if x.ndim == 2 else cols[:, None, :]
        return np.take_along_axis(x[:r], np.broadcast_to(idx, x[:r].shape[:-1] + (G,)), axis=-1)

    tokens = np.concatenate([prompts, answer(canvas)], 1)
    steps_taken = np.concatenate([np.zeros_like(prompts, commit_step.dtype), answer(commit_step)], 1)
    traj = init = None
    if config.max_trajectory:
        reached = (trajectory[:r] >= 0).any(-1, keepdims=True)  # [r, S, 1]
        traj = np.concatenate([np.where(reached, prompts[:, None, :], -1).astype(trajectory.dtype),
                               answer(trajectory)], -1)
        init = np.concatenate([prompts.astype(initial.dtype), answer(initial)], 1)
    return GenerateResult(tokens=tokens, nfe=nfe[:r], commit_step=steps_taken, trajectory=traj, steps=int(steps),
                          initial=init, prompt_len=prompts.shape[1])


def _result(state, p: Prepared, config: SamplerConfig) -> GenerateResult:
    """Fetch the outputs and drop the bucket padding and idle rows on the host (slicing on the
    device would compile a kernel per prompt length)."""
    canvas, commit_step, nfe, trajectory, steps, initial = (_host(x) for x in (
        state.canvas, state.commit_step, state.nfe, state.trajectory, state.step, state.initial))
    if p.answer_start is not None:
        return _block_layout_result(canvas, commit_step, nfe, trajectory, steps, initial, p, config)
    r, e = p.rows, p.extra
    drafter = getattr(state.policy_state, "drafter_forwards", None)
    return GenerateResult(tokens=canvas[:r, e:], nfe=nfe[:r], commit_step=commit_step[:r, e:],
                          trajectory=trajectory[:r, :, e:] if config.max_trajectory else None, steps=int(steps),
                          initial=initial[:r, e:] if config.max_trajectory else None,
                          prompt_len=canvas.shape[1] - e - config.gen_length,
                          drafter_forwards=None if drafter is None else _host(drafter)[:r])


def generate(model, input_ids, config: SamplerConfig, attention_mask=None, *, key: jax.Array | None = None,
             policy_params: nnx.Module | None = None, companions: dict | None = None) -> GenerateResult:
    """`Sampler(model)(input_ids, config, ...)`: decode `gen_length` tokens after each prompt in one
    compiled call (see `Sampler.__call__`). Holding a `Sampler` avoids splitting the model per call.

    Args:
      model: a `Transformer`: diffusion (bidirectional: LLaDA, Dream; block-causal: block
        diffusion, Fast-dLLM v2) with a `mask_token_id`, or causal for a draft-and-verify policy (`jacobi`, `lookahead`).
      input_ids: `[B, Lp]` prompts, left-padded where lengths differ, or the tokenizer's `TokenBatch`.
      config: a `SamplerConfig`.
      attention_mask: `[B, Lp]` 1 for prompt tokens, 0 for left padding.
      policy_params, companions: a policy's own parameters, or its second model by role (see
        `Sampler.__call__`).

    Returns:
      `GenerateResult(tokens [B, Lp+G], nfe [B], commit_step [B, Lp+G], trajectory, steps, initial,
      prompt_len)`; `.generated` is `tokens[:, prompt_len:]`, `[B, G]`.
    """
    return Sampler(model)(input_ids, config, attention_mask, key=key, policy_params=policy_params,
                          companions=companions)


def generate_stepwise(model, input_ids, config: SamplerConfig, attention_mask=None, *, key: jax.Array | None = None,
                      policy_params: nnx.Module | None = None, companions: dict | None = None) -> GenerateResult:
    """The same decoding as `generate`, driven by a Python loop that calls a jitted step and reads
    `done` back each iteration (one dispatch and one host sync per step). For benchmarks."""
    return Sampler(model).stepwise(input_ids, config, attention_mask, key=key, policy_params=policy_params,
                                   companions=companions)
