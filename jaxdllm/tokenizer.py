"""A checkpoint's tokenizer from its local `tokenizer.json` (the `tokenizers` library), with the
chat template from `tokenizer_config.json` or `chat_template.jinja`. Never touches a hub.

Calling it on a batch of texts gives left-padded ids and an attention mask, the form
`jaxdllm.generate` takes, and `answers` turns a generation back into text:

    batch = tok(["reverse 4821=", "sort 93715="])          # TokenBatch(ids [2, L], mask [2, L])
    out = jaxdllm.generate(model, batch.ids, config, attention_mask=batch.mask)
    tok.answers(out)                                         # ["1284", "13579"]

Also the helpers every tokenizer shares: `special_token_ids` (the `ModelConfig` special-id
fields) and `decode_response` (generated ids up to EOS, as text).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import NamedTuple, Sequence

import jinja2
import jinja2.sandbox
import numpy as np
import tokenizers

from jaxdllm.checkpoint.folder import Checkpoint
from jaxdllm.checkpoint.hf_config import require_checkpoint_folder
from jaxdllm.errors import CheckpointError, ConfigError, DataError
from jaxdllm.shipped import checkpoint_dir


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


class TokenBatch(NamedTuple):
    """Prompts of different lengths as one array, the form `jaxdllm.generate` takes."""

    ids: np.ndarray   # [B, L] int32, padded (left by default) with the pad id
    mask: np.ndarray  # [B, L] int32, 1 on the texts' tokens, 0 on padding

    @property
    def input_ids(self) -> np.ndarray:  # transformers' names
        return self.ids

    @property
    def attention_mask(self) -> np.ndarray:
        return self.mask


class Tokenizer:
    """Encode/decode text and render chat prompts for one checkpoint.

    Attributes:
      chat_template: the Jinja chat template, or None when the checkpoint ships none.
      special_tokens: names such as `bos_token`/`eos_token` -> token text, passed to the template.
      stop_ids: token ids that end an answer (`answers` cuts at the first): the `eos_token` and
        `eot_token` the tokenizer names, plus the model's own (`jaxdllm.load` adds its config's
        `eos_token_id` and `eot_token_id`).
      unknown: what the batch call does with characters the vocabulary lacks (they would become
        the `unk_token`): "error" (default; `DataError` naming them) or "keep". `encode` never
        checks (datasets report unknown characters themselves).
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer, *, chat_template: str | None = None,
                 special_tokens: dict[str, str] | None = None, unknown: str = "error"):
        if unknown not in ("error", "keep"):
            raise DataError(f"unknown must be 'error' or 'keep', got {unknown!r}")
        self.backend = tokenizer
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})
        self.unknown = unknown
        named = (self.backend.token_to_id(self.special_tokens[k]) for k in ("eos_token", "eot_token")
                 if self.special_tokens.get(k) is not None)
        self.stop_ids: tuple[int, ...] = tuple(i for i in named if i is not None)

    @classmethod
    def from_pretrained(cls, path: str | Path | Checkpoint, *, what: str = "checkpoint directory",
                        **options) -> "Tokenizer":
        """Load `path/tokenizer.json` (+ `tokenizer_config.json`, `chat_template.jinja`); `path` may
        be a shipped checkpoint's name (`jaxdllm.shipped.checkpoint_dir`) or a `Checkpoint` (its
        folder, found once). `what` names `path` in errors (e.g. "[model] init_from"). `options`: `unknown`."""
        folder = path.folder if isinstance(path, Checkpoint) else checkpoint_dir(path)
        directory = require_checkpoint_folder(folder, what)
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
        return cls(backend, chat_template=template, special_tokens=special, **options)

    def unknown_characters(self, text: str) -> list[tuple[int, str]]:
        """`(position, character)` of each character of `text` that encodes to the `unk_token`
        (none when the tokenizer names no `unk_token`, e.g. byte-level BPE)."""
        unk = self.special_tokens.get("unk_token")
        unk_id = self.token_to_id(unk) if unk else None
        if unk_id is None:
            return []
        encoding = self.backend.encode(text, add_special_tokens=False)
        return [(start, text[start:end]) for tid, (start, end) in zip(encoding.ids, encoding.offsets) if tid == unk_id]

    def check_known(self, text: str) -> None:
        """Raise `DataError` naming the characters of `text` the vocabulary lacks, with their
        positions and, for a small vocabulary, what it does know."""
        unknown = self.unknown_characters(text)
        if not unknown:
            return
        shown = ", ".join(f"{c!r} at {i}" for i, c in unknown[:8]) + (" ..." if len(unknown) > 8 else "")
        vocab = [t for t in self.backend.get_vocab() if len(t) == 1]
        knows = (f"it knows {''.join(sorted(vocab))!r}" if 0 < len(vocab) <= 128
                 else f"its vocabulary has {self.vocab_size} tokens")
        raise DataError(f"the tokenizer does not know {shown} in {text[:60]!r} ({knows}); they would decode as "
                        f"{self.special_tokens.get('unk_token')!r}: change the text, or allow it "
                        "(Tokenizer(..., unknown='keep'), tok.unknown = 'keep', jaxdllm generate --allow-unk)")

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

    def batch_decode(self, rows, skip_special_tokens: bool = True) -> list[str]:
        """`[B, L]` ids -> B texts (every token; `answers` stops at the end of each answer)."""
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in np.asarray(rows)]

    @property
    def pad_id(self) -> int:
        """The id that fills padding: the `pad_token`, else the `eos_token`, else 0 (padding is
        masked out, so its value only has to be a valid id)."""
        for key in ("pad_token", "eos_token"):
            token_id = self.token_to_id(self.special_tokens.get(key) or "")
            if token_id is not None:
                return token_id
        return 0

    def __call__(self, texts: str | Sequence[str], *, chat: bool = False, padding_side: str = "left",
                 add_special_tokens: bool = True) -> TokenBatch:
        """Tokenise a batch of texts into one padded array.

        Left padding is the default because decoding appends the answer after the prompt: with
        every prompt ending in the same column, the B answers share one `[B, G]` canvas region and
        one compiled loop, and the mask tells each row where its prompt starts (RoPE positions
        count from there). `jaxdllm.generate` needs it; `padding_side="right"` is for other uses.

        Args:
          texts: one text or a list of B texts.
          chat: render each text as a user turn with the chat template (instruct models).
          padding_side: "left" or "right".
          add_special_tokens: the tokenizer's own BOS/EOS post-processing (not with `chat`).

        Returns:
          `TokenBatch(ids [B, L] int32, mask [B, L] int32)`, L the longest text's length.
        """
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise DataError("give the tokenizer a text or a non-empty list of texts")
        if padding_side not in ("left", "right"):
            raise DataError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        if self.unknown == "error":
            for text in texts:
                self.check_known(text)
        if chat:
            rows = [self.apply_chat_template([{"role": "user", "content": t}], tokenize=True) for t in texts]
        else:
            rows = self.encode_batch(texts, add_special_tokens=add_special_tokens)
        if not all(rows):
            raise DataError(f"text {texts[[bool(r) for r in rows].index(False)]!r} has no tokens")
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.pad_id, np.int32)
        mask = np.zeros((len(rows), width), np.int32)
        for i, row in enumerate(rows):
            cols = slice(width - len(row), width) if padding_side == "left" else slice(0, len(row))
            ids[i, cols], mask[i, cols] = row, 1
        return TokenBatch(ids, mask)

    def answers(self, generated, prompt_len: int | None = None) -> list[str]:
        """The text of each generated answer, up to its first stop token (`stop_ids`): the EOS
        filler after an answer and padding are dropped, and so are special tokens.

        Args:
          generated: a `GenerateResult` (its prompts are cut off), or `[B, G]` generated ids,
            or `[B, Lp + G]` ids with `prompt_len` = Lp.
          prompt_len: columns of prompt to skip (default: none for an array, the result's own
            `prompt_len` for a `GenerateResult`).

        Returns:
          B strings.
        """
        if hasattr(generated, "generated") and prompt_len is None:
            rows = np.asarray(generated.generated)
        else:
            rows = np.asarray(getattr(generated, "tokens", generated))[:, prompt_len or 0:]
        if rows.ndim != 2:
            raise DataError(f"answers takes [B, G] ids or a GenerateResult, got shape {rows.shape}")
        out = []
        for row in rows.tolist():
            ends = [row.index(s) for s in self.stop_ids if s in row]
            out.append(self.decode(row[:min(ends)] if ends else row, skip_special_tokens=True))
        return out

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            tokenize: bool = False, **kwargs):
        """Render `messages` (`[{"role", "content"}]`) with the checkpoint's chat template.

        Returns the prompt text, or its token ids (no extra special tokens) if `tokenize`.
        """
        if not self.chat_template:
            raise ConfigError("this tokenizer has no chat template (tokenizer_config.json has no "
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
