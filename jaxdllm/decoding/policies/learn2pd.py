"""Learn2PD: a tiny learned filter reads the block's top-1 probabilities and accepts positions whose
prediction is already final (sigmoid > `filter_threshold`); the LLaDA schedule's top-k is
committed too. With `eot_prediction` (EoTP), an accepted EOS ends the answer: everything after it
becomes EOS and later blocks are never decoded.

The filter is any module `[B, block_length] -> [B, block_length]` accept logits passed as
`generate(..., policy_params=module)`; `Learn2PDFilter` is the published 2-layer MLP (32 -> 32),
or with `hidden=0` the published logistic-regression variant. `jaxdllm.train.distill.learn2pd`
trains it with BCE on oracle traces of the engine's own decoding; `save_filter` writes it beside
the model it was trained for (`learn2pd_filter.safetensors`), where `load_filter` and
`jaxdllm generate --preset learn2pd` find it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from jaxdllm.decoding.policies.base import Commit, ConfidencePolicy, in_unit_interval, rank_among, scheduled_count
from jaxdllm.checkpoint.side_files import load_module, read_facts, save_module, side_file_path
from jaxdllm.errors import ConfigError

FILTER_FILE = "learn2pd_filter.safetensors"


class Learn2PDFilter(nnx.Module):
    """`[B, block_length]` top-1 probabilities -> `[B, block_length]` accept logits: a 2-layer MLP
    with a ReLU (`hidden` units), or one linear layer (`hidden=0`: logistic regression)."""

    def __init__(self, block_length: int = 32, hidden: int = 32, *, rngs: nnx.Rngs):
        self.block_length, self.hidden_size = block_length, hidden
        self.hidden = nnx.Linear(block_length, hidden, rngs=rngs) if hidden else None
        self.out = nnx.Linear(hidden or block_length, block_length, rngs=rngs)

    def __call__(self, top1_probs: jax.Array) -> jax.Array:
        if self.hidden is None:
            return self.out(top1_probs)
        return self.out(jax.nn.relu(self.hidden(top1_probs)))


def save_filter(module: Learn2PDFilter, path, **facts) -> Path:
    """Write `module` as safetensors to `path` (a model folder: `learn2pd_filter.safetensors` in it);
    `facts` (JSON-able: the model it belongs to, how it was trained) go in the file's metadata."""
    meta = {"block_length": module.block_length, "hidden": module.hidden_size, **facts}
    return save_module(module, side_file_path(path, FILTER_FILE), "learn2pd", meta, "learn2pd filter")


def filter_facts(path) -> dict:
    """The metadata `save_filter` wrote (`block_length`, `hidden`, and the facts given)."""
    target = side_file_path(path, FILTER_FILE)
    return read_facts(target, "learn2pd", f"Learn2PD filter at {target}: train one with `jaxdllm distill learn2pd`")


def load_filter(path) -> Learn2PDFilter:
    """The filter in `path` (a model folder holding `learn2pd_filter.safetensors`, or the file)."""
    facts = filter_facts(path)
    return load_module(side_file_path(path, FILTER_FILE),
                       lambda: Learn2PDFilter(facts["block_length"], facts["hidden"], rngs=nnx.Rngs(0)),
                       f"a filter of block_length {facts['block_length']}, hidden {facts['hidden']}")


@dataclasses.dataclass(frozen=True)
class Learn2PD(ConfidencePolicy):
    filter_threshold: float = 0.96
    eot_prediction: bool = True
    name = "learn2pd"
    scheduled = True
    needs_params = True
    params_kind = "its trained filter (learn2pd_filter.safetensors beside the model)"

    def check(self, config):
        in_unit_interval(self.filter_threshold, "filter_threshold", self.name)
        super().check(config)

    def load_params(self, directory, config) -> "Learn2PDFilter":
        """The filter saved beside a model (`directory/learn2pd_filter.safetensors`), checked
        against `config`'s block length (the filter reads one block's probabilities)."""
        facts = filter_facts(directory)
        if facts["block_length"] != config.block_length:
            raise ConfigError(f"the Learn2PD filter in {directory} reads blocks of {facts['block_length']} "
                              f"positions, the sampler's block_length is {config.block_length}: pass "
                              f"block_length={facts['block_length']} (`--block-length {facts['block_length']}`) "
                              "and a gen_length that is a multiple of it")
        return load_filter(directory)

    def commit(self, logits, candidates, ctx):
        cfg = ctx.config
        tokens, conf = self.greedy(logits, ctx)
        p1 = jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1)
        accept = candidates & (jax.nn.sigmoid(ctx.policy_params(p1)) > self.filter_threshold)
        k = scheduled_count(cfg, jnp.minimum(ctx.block_step, cfg.steps_per_block - 1))
        commit = accept | (candidates & (rank_among(conf, candidates) < k))
        if not (self.eot_prediction and ctx.eos_id is not None):
            return Commit(commit, tokens, ctx.state)
        # EoTP: the first accepted EOS cuts the answer: everything after it becomes EOS (the rest of
        # this block, committed or not, and every later block, which is then never decoded).
        eos_here = accept & (tokens == ctx.eos_id)
        cut = ctx.block * logits.shape[1] + jnp.argmax(eos_here, axis=-1)  # answer index of the EOS
        fill = eos_here.any(-1, keepdims=True) & (jnp.arange(ctx.undecided.shape[1])[None] > cut[:, None])
        return Commit(commit, tokens, ctx.state, fill=fill, fill_tokens=jnp.full(fill.shape, ctx.eos_id, jnp.int32))
