"""Grow a model's vocabulary for added tokens: new embedding (and untied LM head) rows, each the mean
of given existing rows, the rest zero.

This is how Multiverse adds its 12 tags (Yang et al. 2025, `train/utils.py` of Infini-AI-Lab/Multiverse):
`resize_token_embeddings(pad_to_multiple_of=64)`, then each tag's row is the mean embedding of its tag
word's sub-tokens ("Parallel", "Goal", ...). `add_multiverse_tags` does that for a loaded model and
`prepare_multiverse_checkpoint` for a checkpoint folder (writing the tag tokenizer beside it):

    python -m jaxdllm.checkpoint.resize_vocab checkpoints/tasks-qwen2-small runs/mv-init --max-position 192
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdllm.errors import ConfigError
from jaxdllm.models.transformer import Transformer


def resize_vocab(model: Transformer, vocab_size: int, init_rows: Mapping[int, Sequence[int]] | None = None,
                 **config_changes) -> Transformer:
    """A copy of `model` with `vocab_size` embedding rows (and LM-head columns when untied).

    Args:
      model: a loaded `Transformer` (float weights).
      vocab_size: the new vocabulary size, at least the old one.
      init_rows: new row id -> the existing ids whose rows' mean initialises it (in the embedding and,
        separately, in the untied LM head); new rows not named are zero.
      **config_changes: other `ModelConfig` fields to change that keep the parameter shapes (e.g.
        `max_position`: RoPE has no learned table).

    Returns:
      A new `Transformer` with `config.vocab_size == vocab_size`; every other parameter is shared.
    """
    old = model.config.vocab_size
    if not isinstance(vocab_size, int) or vocab_size < old:
        raise ConfigError(f"resize_vocab grows a vocabulary: vocab_size must be an int >= {old}, got {vocab_size!r}")
    if model.options.quantization is not None:
        raise ConfigError("resize_vocab needs float weights; load the checkpoint without quantization")
    init_rows = dict(init_rows or {})
    for new_id, sources in init_rows.items():
        if not old <= new_id < vocab_size or not sources or any(not 0 <= s < old for s in sources):
            raise ConfigError(f"init_rows[{new_id}] = {sources!r}: a new id in [{old}, {vocab_size}) from "
                              f"existing ids in [0, {old})")

    def grow(table: np.ndarray, axis: int) -> np.ndarray:
        rows = np.moveaxis(table, axis, 0)
        out = np.zeros((vocab_size,) + rows.shape[1:], rows.dtype)
        out[:old] = rows
        for new_id, sources in init_rows.items():
            out[new_id] = rows[list(sources)].astype(np.float32).mean(0).astype(rows.dtype)
        return np.moveaxis(out, 0, axis)

    config = model.config.replace(vocab_size=vocab_size, **config_changes)
    graphdef, state = nnx.split(model)
    new = nnx.eval_shape(lambda: Transformer(config, model.options, rngs=nnx.Rngs(0)))
    new_graphdef, new_state = nnx.split(new)
    pure = nnx.to_pure_dict(state)
    pure["embed"] = jnp.asarray(grow(np.asarray(pure["embed"]), 0))
    if pure.get("lm_head") is not None:
        pure["lm_head"] = jnp.asarray(grow(np.asarray(pure["lm_head"]), 1))
    nnx.replace_by_pure_dict(new_state, pure)
    return nnx.merge(new_graphdef, new_state)


def add_multiverse_tags(model: Transformer, tokenizer=None, **config_changes) -> Transformer:
    """`model` grown to the tag vocabulary (`jaxdllm.data.multiverse_tags`: 12 tags at ids 101..112, padded
    to 128 rows), each tag's row the mean of its tag word's character rows ("Parallel" for `<Parallel>`
    and `</Parallel>`), padding rows zero. `tokenizer`: the model's own (default: the character
    tokenizer)."""
    from jaxdllm.data.char_tokenizer import build_char_tokenizer
    from jaxdllm.data.multiverse_tags import PADDED_VOCAB_SIZE, TAG_IDS, TAG_WORDS, TAGS

    tokenizer = tokenizer or build_char_tokenizer()
    rows = {TAG_IDS[tag]: tokenizer.encode(word, add_special_tokens=False) for tag, word in zip(TAGS, TAG_WORDS)}
    if model.config.vocab_size > min(TAG_IDS.values()):
        raise ConfigError(f"the model has {model.config.vocab_size} rows; the tags go at ids "
                          f"{min(TAG_IDS.values())}.. of the character vocabulary (101 ids)")
    return resize_vocab(model, PADDED_VOCAB_SIZE, rows, **config_changes)


def prepare_multiverse_checkpoint(src: str | Path, out: str | Path, *, max_position: int | None = None) -> Path:
    """Load the character-tokenizer checkpoint `src`, add the Multiverse tags (`add_multiverse_tags`),
    optionally raise `max_position`, and save it with the tag tokenizer to `out`; returns `out`."""
    from jaxdllm.checkpoint import from_pretrained, save_pretrained
    from jaxdllm.data.multiverse_tags import save_tag_tokenizer

    model = from_pretrained(src, dtype="float32")
    changes = {} if max_position is None else {"max_position": int(max_position)}
    grown = add_multiverse_tags(model, **changes)
    out = save_pretrained(grown, out)
    save_tag_tokenizer(out, model_max_length=grown.config.max_position)
    return Path(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=prepare_multiverse_checkpoint.__doc__)
    parser.add_argument("src")
    parser.add_argument("out")
    parser.add_argument("--max-position", type=int, default=None)
    args = parser.parse_args(argv)
    print(prepare_multiverse_checkpoint(args.src, args.out, max_position=args.max_position))


if __name__ == "__main__":
    main()
