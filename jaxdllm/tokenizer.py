"""A checkpoint's tokenizer from its local `tokenizer.json` (the `tokenizers` library), with the
chat template from `tokenizer_config.json` or `chat_template.jinja`. Never touches a hub.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Sequence

import jinja2
import jinja2.sandbox
import tokenizers

from jaxdllm.checkpoint.hf_config import CheckpointError


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
