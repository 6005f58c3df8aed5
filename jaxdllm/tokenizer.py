"""A checkpoint's tokenizer from its local `tokenizer.json` (the `tokenizers` library), with the
chat template from `tokenizer_config.json` or `chat_template.jinja`. Never touches a hub.

Also the helpers every tokenizer shares: `special_token_ids` (the `ModelConfig` special-id
fields) and `decode_response` (generated ids up to EOS, as text).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Sequence

import jinja2
import jinja2.sandbox
import tokenizers

from jaxdllm.errors import CheckpointError, DataError


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


class Tokenizer:
    """Encode/decode text and render chat prompts for one checkpoint.

    Attributes:
      chat_template: the Jinja chat template, or None when the checkpoint ships none.
      special_tokens: names such as `bos_token`/`eos_token` -> token text, passed to the template.
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer, *, chat_template: str | None = None,
                 special_tokens: dict[str, str] | None = None):
        self.backend = tokenizer
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "Tokenizer":
        """Load `path/tokenizer.json` (+ `tokenizer_config.json`, `chat_template.jinja`)."""
        directory = Path(path)
        file = directory / "tokenizer.json"
        if not file.is_file():
            raise CheckpointError(f"{file} is missing: jaxdllm reads tokenizers from tokenizer.json")
        try:
            backend = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception on bad files
            raise CheckpointError(f"cannot read {file}: {e}") from e
        config = {}
        config_file = directory / "tokenizer_config.json"
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text())
            except ValueError as e:
                raise CheckpointError(f"cannot read {config_file}: {e}") from e
        template = config.get("chat_template")
        if isinstance(template, list):  # older format: named templates
            named = {t["name"]: t["template"] for t in template}
            template = named.get("default", next(iter(named.values()), None))
        jinja_file = directory / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text()
        special = {k: _token_text(v) for k, v in config.items()
                   if k.endswith("_token") and _token_text(v) is not None}
        return cls(backend, chat_template=template, special_tokens=special)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (with the tokenizer's own BOS/EOS post-processing if asked)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            tokenize: bool = False, **kwargs):
        """Render `messages` (`[{"role", "content"}]`) with the checkpoint's chat template.

        Returns the prompt text, or its token ids (no extra special tokens) if `tokenize`.
        """
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template (tokenizer_config.json has no "
                             "chat_template and there is no chat_template.jinja)")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        text = env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            **self.special_tokens, **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text


# `special_token_ids` keys, as `ModelConfig` names them.
_MODEL_FIELDS = {"pad_token": "pad_token_id", "bos_token": "bos_token_id", "eos_token": "eos_token_id",
                 "mask_token": "mask_token_id", "eot_token": "eot_token_id"}


def special_token_ids(tokenizer: Tokenizer) -> dict[str, int | None]:
    """Every special-id field of `ModelConfig` for this tokenizer: `pad_token_id`, `bos_token_id`,
    `eos_token_id`, `mask_token_id`, `eot_token_id`.

    Ids come from the token names in `tokenizer.special_tokens` (`tokenizer_config.json`); a field
    whose token the tokenizer does not name is None (the character tokenizer names no
    end-of-turn token), so `ModelConfig.preset(name, vocab_size=..., **ids)` keeps no stale id
    from the preset. A named token missing from the vocabulary raises `DataError`.
    """
    out = {}
    for key, field in _MODEL_FIELDS.items():
        text = tokenizer.special_tokens.get(key)
        token_id = None if text is None else tokenizer.token_to_id(text)
        if text is not None and token_id is None:
            raise DataError(f"the tokenizer's {key} {text!r} is not in its vocabulary")
        out[field] = token_id
    return out


def answer_length(ids: Sequence[int], eos_id: int | None) -> int:
    """Generated tokens up to and including the first EOS: the answer, without the EOS filler
    after it (what "answer tokens per forward" counts)."""
    ids = [int(i) for i in ids]
    return ids.index(eos_id) + 1 if eos_id is not None and eos_id in ids else len(ids)


def decode_response(tokenizer: Tokenizer, ids: Sequence[int], eos_id: int | None = None) -> str:
    """The text of generated `ids` up to the first EOS (default: the tokenizer's `eos_token`)."""
    if eos_id is None:
        eos_id = special_token_ids(tokenizer)["eos_token_id"]
    ids = [int(i) for i in ids]
    if eos_id is not None and eos_id in ids:
        ids = ids[:ids.index(eos_id)]
    return tokenizer.decode(ids, skip_special_tokens=True)
