"""A second model inside the compiled loop: a drafter for a causal model (`spec_diffusion`), a
small causal model steering a diffusion model (`apd`).

The second model is the policy's parameters (`policy_params`): an `nnx.Module` merged inside the
jitted loop like the model itself, so its weights are traced arrays placed (and sharded) as the
caller placed them, and no step goes back to the host. Its KV cache lives in the policy's carry.

Rows sit at different offsets, so each forward is vmapped over rows (`row_forward`), as the draft
canvas runs the model itself. Two attention shapes are used:

* `window_mask`: the fed window sees the cached slots before it and itself, bidirectionally (a
  diffusion model drafting or re-reading a window after a cached prefix). Slots after the window
  may hold stale K/V from an earlier, longer window; the mask hides them (`MaskSpec(kind="tree")`
  with the window as one node).
* `causal_mask`: each fed token sees the cached slots before it and the fed tokens up to itself.

`check_pair` compares two checkpoints' tokenizers before anything loads: a pair decodes together
only when every token id means the same text in both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxdllm.attention import MaskSpec
from jaxdllm.checkpoint.folder import COMPANIONS_FILE, Checkpoint, read_companions
from jaxdllm.errors import ConfigError
from jaxdllm.models.cache import KVCache


def window_mask(start, length: int, seg=None) -> MaskSpec:
    """One row's mask for a window of `length` tokens written at slot `start` (scalar): the
    cached slots before it and the window itself; `seg [1, length]` 0 on padding (default 1)."""
    seg = jnp.ones((1, length), jnp.int32) if seg is None else seg
    return MaskSpec(kind="tree", block_size=length, tree=(-1,), prefix_len=start, q_offset=start, q_segment_ids=seg)


def causal_mask(start, length: int, seg=None) -> MaskSpec:
    """One row's causal mask for `length` tokens written at slot `start` (scalar)."""
    seg = jnp.ones((1, length), jnp.int32) if seg is None else seg
    return MaskSpec(kind="causal", q_offset=start, q_segment_ids=seg)


def row_forward(model, tokens, positions, start, cache: KVCache, mask_fn, seg=None):
    """Each row's forward at its own cache offset.

    Args:
      model: a `Transformer`.
      tokens, positions: `[B, L]` int32 ids and RoPE positions.
      start: `[B]` int32 first slot of each row's window.
      cache: the model's `KVCache` `[B, S]`.
      mask_fn: `window_mask` or `causal_mask`.
      seg: `[B, L]` int32, 0 on padding (default 1).

    Returns:
      `(logits [B, L, V] float32, cache)` with the window's K/V written.
    """
    seg = jnp.ones(tokens.shape, jnp.int32) if seg is None else seg
    length = tokens.shape[1]

    def one(tokens, positions, start, seg, cache):
        row_cache = jax.tree.map(lambda x, axis: jnp.expand_dims(x, axis), cache, cache.batch_axes())
        out = model(tokens[None], positions[None], mask_fn(start, length, seg[None]), row_cache)
        return out.logits[0], jax.tree.map(lambda x, axis: jnp.squeeze(x, axis), out.cache, out.cache.batch_axes())

    axes = cache.batch_axes()
    return jax.vmap(one, in_axes=(0, 0, 0, 0, axes), out_axes=(0, axes))(tokens, positions, start, seg, cache)


def check_second_model(module, vocab_size: int, policy: str, role: str) -> None:
    """Raise `ConfigError` unless `module` is a model with the decoded model's vocabulary size."""
    config = getattr(module, "config", None)
    if config is None or not hasattr(module, "init_cache"):
        raise ConfigError(f"policy {policy!r} needs its {role} model as policy_params (a jaxdllm Transformer: "
                          f"jaxdllm.policy_params(model_dir, config) loads it), got {type(module).__name__}")
    if config.vocab_size != vocab_size:
        raise ConfigError(f"policy {policy!r}: the {role} has a vocabulary of {config.vocab_size} tokens, the model "
                          f"{vocab_size}: the two must share one tokenizer")


def _vocab(directory: Path) -> tuple[dict, dict]:
    """`(token -> id, special role -> token)` of a checkpoint's tokenizer files."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"{directory} has no tokenizer.json: a pair is checked by its tokenizers")
    raw = json.loads(path.read_text())
    vocab = dict(raw["model"].get("vocab") or {})
    for added in raw.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    special = {}
    config = directory / "tokenizer_config.json"
    if config.is_file():
        settings = json.loads(config.read_text())
        for role in ("bos_token", "eos_token", "pad_token", "mask_token", "unk_token"):
            value = settings.get(role)
            special[role] = value.get("content") if isinstance(value, dict) else value
    return vocab, special


def check_pair(model_dir: str | os.PathLike, other_dir: str | os.PathLike, role: str) -> None:
    """Raise `ConfigError` (one line naming the first difference) unless the two checkpoints'
    tokenizers give every token the same id and the same special tokens."""
    a, b = Path(model_dir), Path(other_dir)
    (va, sa), (vb, sb) = _vocab(a), _vocab(b)
    if len(va) != len(vb):
        raise ConfigError(f"the {role} {b} has {len(vb)} tokens, the model {a} {len(va)}: they must share one "
                          "tokenizer")
    for token, i in sorted(va.items(), key=lambda kv: kv[1]):
        if vb.get(token) != i:
            raise ConfigError(f"token {token!r} is id {i} for the model {a} and {vb.get(token)} for the {role} {b}: "
                              "they must share one tokenizer")
    for role_name in sorted(set(sa) | set(sb)):
        if sa.get(role_name) != sb.get(role_name):
            raise ConfigError(f"{role_name} is {sa.get(role_name)!r} for the model {a} and {sb.get(role_name)!r} for "
                              f"the {role} {b}: they must share one tokenizer")


def companion_dir(directory: Path | Checkpoint, given: str, policy: str, role: str) -> Path:
    """The second model's folder: `given` (a folder or shipped name), else the one the model's
    `companions.json` names for `policy` (a relative folder is read from the model's folder first).
    `directory`: the model's folder, or its `Checkpoint` (whose `companions.json` is read once)."""
    from jaxdllm.shipped import checkpoint_dir, shipped_hint
    listing = directory / COMPANIONS_FILE
    source = f"{role}={given!r}"
    if not given:
        table = directory.companions if isinstance(directory, Checkpoint) else read_companions(directory)
        given = table.get(policy)
        if not given:
            raise ConfigError(f"policy {policy!r} needs a {role}: pass one (--set {role}=DIR on the command line, "
                              f"{role}=\"DIR\" in Python; a checkpoint folder or shipped name), or name it in "
                              f'{listing} as {{"{policy}": "DIR"}}')
        source = f"{listing} ({policy!r}: {given!r})"
    path = Path(given).expanduser()
    if not path.is_absolute() and (directory / given).is_dir():
        path = directory / given
    found = checkpoint_dir(path if path.is_dir() else given)
    if not found.is_dir():
        raise ConfigError(f"the {role} named by {source} is not a folder (looked at {path.resolve()}"
                          f"{'' if path.is_absolute() else f' and {(directory / given).resolve()}'}) nor a shipped "
                          f"checkpoint ({shipped_hint()})")
    return found


def load_companion(directory, given: str, policy: str, role: str, **load_options):
    """The second model for `policy`, loaded (`from_pretrained(..., **load_options)`: `mesh=`,
    `dtype=`) after its tokenizer is checked against the model's in `directory` (a folder or the
    model's `Checkpoint`)."""
    from jaxdllm.checkpoint import from_pretrained
    model = directory if isinstance(directory, Checkpoint) else Checkpoint(Path(directory))
    other = Checkpoint(companion_dir(model, given, policy, role))  # found once; its config.json read once
    check_pair(model.folder, other.folder, role)
    return from_pretrained(other, **load_options)
