"""The character-level tokenizer of the tiny models, as a real Hugging Face `tokenizer.json`.

Vocabulary (101 ids, fixed): the special tokens `<pad>`=0, `<bos>`=1, `<eos>`=2, `<mask>`=3,
`<unk>`=4, then newline and the 95 printable ASCII characters (space, punctuation including `#`,
digits, upper- and lowercase letters) in code-point order. Any other character encodes to
`<unk>`. `encode(text)` prepends `<bos>` (the post-processor), as training does, so
`jaxdllm generate` on a saved tiny model sees prompts in the training layout; batching encodes
with `add_special_tokens=False` and adds BOS/EOS itself. Decoding concatenates characters
(`Fuse` decoder) and drops special tokens.

`save_char_tokenizer(dir)` writes `tokenizer.json` + `tokenizer_config.json` next to a
`save_pretrained` checkpoint, so `jaxdllm.Tokenizer.from_pretrained(dir)` (and transformers'
`PreTrainedTokenizerFast`) load it back; `jaxdllm.tokenizer.special_token_ids` gives the `ModelConfig` ids.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers, processors

from jaxdllm.tokenizer import Tokenizer

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>",
                  "mask_token": "<mask>", "unk_token": "<unk>"}
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB = tuple(SPECIAL_TOKENS.values()) + tuple(CHARS)
PAD_ID, BOS_ID, EOS_ID, MASK_ID, UNK_ID = range(5)
VOCAB_SIZE = len(VOCAB)


def build_char_tokenizer() -> Tokenizer:
    """The character tokenizer as a `jaxdllm.Tokenizer` (no files written)."""
    backend = tokenizers.Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)},
                                                    unk_token=SPECIAL_TOKENS["unk_token"]))
    backend.add_special_tokens(list(SPECIAL_TOKENS.values()))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    bos = SPECIAL_TOKENS["bos_token"]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, BOS_ID)])
    return Tokenizer(backend, special_tokens=dict(SPECIAL_TOKENS))


def save_char_tokenizer(directory: str | os.PathLike, *, model_max_length: int | None = None,
                        tokenizer: Tokenizer | None = None, extra_config: dict | None = None) -> Path:
    """Write `tokenizer.json` and `tokenizer_config.json` into `directory`; returns the directory.
    `tokenizer`: a variant of the character tokenizer to write (default: `build_char_tokenizer()`);
    `extra_config`: more `tokenizer_config.json` keys."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (tokenizer or build_char_tokenizer()).backend.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              **SPECIAL_TOKENS, **(extra_config or {})}
    if model_max_length is not None:
        config["model_max_length"] = int(model_max_length)
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory
