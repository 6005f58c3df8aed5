"""GenMol's tokenization of SAFE strings: SAFE's regex splitter (one token per bracket atom, atom,
bond, branch, ring digit or `.`), a word-level vocabulary built from the training strings, and
GenMol's special tokens with their ids: `[UNK]` 0, `[CLS]` 1 (BOS), `[SEP]` 2 (EOS), `[PAD]` 3,
`[MASK]` 4. Encoding adds `[CLS] ... [SEP]`; decoding joins tokens with nothing between them.

The published tokenizer (`datamol-io/safe-gpt`, vocabulary 1880) is a BPE over the same splitter whose
merges never cross a split, so each token is one split piece there too; a vocabulary built from the
training data is the same map on those pieces, with rare bracket atoms it never saw read as `[UNK]`.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Iterable

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors

from jaxdllm.tokenizer import Tokenizer

# SAFE's splitter (safe-mol 0.2.1's, with its `%(NNN)` ring numbers), and GenMol V2's bracket SAFE attachments
# (`jaxdllm.molecules.bracket_safe`): `<1>` is one piece, as a ring label is, so a bracket string is as many
# tokens as its plain SAFE string. (GenMol's own V2 tokenizer reads `<1>` as the three tokens `<`, `1`, `>`;
# its converted checkpoints keep that tokenizer.) A stray `<` is a piece of its own.
SAFE_PATTERN = (r"(\[[^\]]+]|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|\/|:|~|@|\?|>>?"
                r"|<%?[0-9]{1,5}>|<|\*|\$|\%\([0-9]{1,5}\)|\%[0-9]{2}|[0-9])")
SPECIAL_TOKENS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")  # ids 0..4, GenMol's
TOKENIZER_CONFIG = {"unk_token": "[UNK]", "bos_token": "[CLS]", "eos_token": "[SEP]", "pad_token": "[PAD]",
                    "mask_token": "[MASK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}


def split_safe(text: str) -> list[str]:
    """The splitter's pieces of `text` (their concatenation is `text` for any SAFE string)."""
    import re

    return re.findall(SAFE_PATTERN, text)


def is_label(piece: str) -> bool:
    """`piece` (one of `split_safe`'s) is a ring or attachment label: `1`, `%12` or `%(123)`."""
    return piece[0].isdigit() or piece[0] == "%"


def unpaired_digits(text: str) -> list[str]:
    """The ring or attachment labels (`1`, `%12`, `%(123)`) that `text` writes an odd number of times, sorted
    (bracket SAFE: convert with `bracket_safe.bracket_to_safe` first).
    Each bond needs both of its ends, so a SAFE string with any cannot decode whole: GenMol's decoding
    then drops fragments (a diagnostic of a model's samples; the training strings have none)."""
    counts = collections.Counter(p for p in split_safe(text) if is_label(p))
    return sorted(label for label, count in counts.items() if count % 2)


def build_safe_tokenizer(safe_strings: Iterable[str], *, min_count: int = 1) -> Tokenizer:
    """A tokenizer whose vocabulary is the special tokens then every piece seen in `safe_strings` at
    least `min_count` times (most frequent first, ties by text)."""
    counts = collections.Counter(piece for s in safe_strings for piece in split_safe(s))
    pieces = sorted((p for p, n in counts.items() if n >= min_count), key=lambda p: (-counts[p], p))
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex(SAFE_PATTERN), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return Tokenizer(backend, special_tokens=dict(TOKENIZER_CONFIG))


def save_safe_tokenizer(tokenizer: Tokenizer, directory: str | Path, *, model_max_length: int | None = None) -> Path:
    """Write `tokenizer.json` and `tokenizer_config.json` (the special tokens) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.backend.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              **TOKENIZER_CONFIG}
    if model_max_length is not None:
        config["model_max_length"] = int(model_max_length)
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


__all__ = ["SAFE_PATTERN", "SPECIAL_TOKENS", "build_safe_tokenizer", "is_label", "save_safe_tokenizer", "split_safe"]
