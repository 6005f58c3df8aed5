"""Multiverse's structure tags (Yang et al. 2025, arXiv 2506.09991) and the character tokenizer with them.

The 12 tags, in the published order (`/work/shared/reference`-style summary in
`jaxdllm/attention/multiverse.py`):

    <Think> </Think> <Parallel> </Parallel> <Goal> </Goal> <Outline> </Outline> <Path> </Path>
    <Conclusion> </Conclusion>

`build_tag_tokenizer()` is the tiny models' character tokenizer (`jaxdllm/data/char_tokenizer.py`, ids
0..100) with the tags added after it: `<Think>` = 101 ... `</Conclusion>` = 112 (`TAG_IDS`). Each tag
encodes to one token and decodes back to its text (the tags are added tokens that are not "special", so
`decode(..., skip_special_tokens=True)` keeps them). The model's vocabulary is padded to a multiple of 64
(`PADDED_VOCAB_SIZE` = 128), as the published resize does (`pad_to_multiple_of=64`); ids 113..127 are
never produced by the tokenizer. `save_tag_tokenizer(dir)` writes it next to a checkpoint.

`strip_tags(text)` removes every tag (the published AR baseline's "tag-stripped" text).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tokenizers import AddedToken

from jaxdllm.data.char_tokenizer import VOCAB_SIZE, build_char_tokenizer, save_char_tokenizer
from jaxdllm.tokenizer import Tokenizer

TAGS = ("<Think>", "</Think>", "<Parallel>", "</Parallel>", "<Goal>", "</Goal>", "<Outline>", "</Outline>",
        "<Path>", "</Path>", "<Conclusion>", "</Conclusion>")
TAG_WORDS = ("Think", "Think", "Parallel", "Parallel", "Goal", "Goal", "Outline", "Outline", "Path", "Path",
             "Conclusion", "Conclusion")  # the sub-tokens whose mean embedding initialises each tag's row
FIRST_TAG_ID = VOCAB_SIZE  # 101
TAG_IDS = {tag: FIRST_TAG_ID + i for i, tag in enumerate(TAGS)}
PAD_MULTIPLE = 64
PADDED_VOCAB_SIZE = -(-(FIRST_TAG_ID + len(TAGS)) // PAD_MULTIPLE) * PAD_MULTIPLE  # 128
_TAG_RE = re.compile("|".join(re.escape(t) for t in TAGS))


def build_tag_tokenizer() -> Tokenizer:
    """The character tokenizer plus the 12 tags as added tokens (ids 101..112, `TAG_IDS`).

    Returns:
      A `jaxdllm.Tokenizer` whose `vocab_size` is 113 (the model pads its table to 128).
    """
    tok = build_char_tokenizer()
    added = tok.backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    ids = [tok.token_to_id(t) for t in TAGS]
    if added != len(TAGS) or ids != list(TAG_IDS.values()):  # the vocabulary is fixed; this cannot drift
        raise AssertionError(f"tag ids {ids} differ from {list(TAG_IDS.values())}")
    return tok


def save_tag_tokenizer(directory: str | os.PathLike, *, model_max_length: int | None = None) -> Path:
    """Write the tag tokenizer's `tokenizer.json` and `tokenizer_config.json` into `directory`."""
    return save_char_tokenizer(directory, model_max_length=model_max_length, tokenizer=build_tag_tokenizer(),
                               extra_config={"multiverse_tags": list(TAGS)})


def tag_ids_of(tokenizer: Tokenizer) -> tuple[int, ...]:
    """The 12 tag ids of `tokenizer` in `TAGS` order; `DataError` if it lacks one."""
    from jaxdllm.errors import DataError

    ids = tuple(tokenizer.token_to_id(t) for t in TAGS)
    missing = [t for t, i in zip(TAGS, ids) if i is None]
    if missing:
        raise DataError(f"the tokenizer has no Multiverse tag(s) {missing}; build it with "
                        "jaxdllm.data.multiverse_tags.build_tag_tokenizer()")
    return ids


def strip_tags(text: str) -> str:
    """`text` with every Multiverse tag removed (nothing else changes)."""
    return _TAG_RE.sub("", text)
