"""One request's answer as it is decided: tokens in, text out, cut at its end.

The engine feeds `AnswerStream.extend` the answer's tokens that are decided and final, left to
right; the stream answers with the new text to send. The text is the tokenizer's decoding of the
whole answer so far (as `Tokenizer.answers` decodes a finished one), so what is streamed joins up
to exactly the offline answer: text is held back while it ends in an incomplete character (a
byte-level tokenizer's U+FFFD) or could be the start of a stop string.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Piece:
    """What one `extend` adds: `text` to send, its `token_ids`, and `finish_reason` ("stop": a
    stop token or string; "length": `max_tokens`) when the answer ended."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None


class AnswerStream:
    """The answer of one request.

    Args:
      tokenizer: a `jaxdllm.Tokenizer` (`decode`, `stop_ids`).
      max_tokens: the most answer tokens (None: no limit here).
      stop: strings that end the answer (not included in it).
    """

    def __init__(self, tokenizer, max_tokens: int | None = None, stop: tuple[str, ...] = ()):
        self._tok = tokenizer
        self._stop_ids = set(tokenizer.stop_ids)
        self._max = max_tokens
        self._stop = tuple(s for s in stop if s)
        self.tokens: list[int] = []     # answer tokens taken (the stop token excluded)
        self.sent = ""                  # text sent so far
        self._sent_tokens = 0
        self.finish_reason: str | None = None

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)

    def extend(self, decided: list[int], final: bool = False) -> Piece:
        """Take the answer's tokens decided so far (`decided`: every final token from the answer's
        start; only the ones not seen yet are new); `final`: nothing more will be decided (the row is
        done). Returns the text to send now."""
        if self.finish_reason is not None:
            return Piece("", ())
        for token in decided[len(self.tokens):]:
            if token in self._stop_ids:
                self.finish_reason = "stop"
                break
            if self._max is not None and len(self.tokens) >= self._max:
                break
            self.tokens.append(int(token))
        if self.finish_reason is None and self._max is not None and len(self.tokens) >= self._max:
            self.finish_reason = "length"
        if self.finish_reason is None and final:
            self.finish_reason = "length"
        text = self._tok.decode(self.tokens, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            text, self.finish_reason = text[:cut], "stop"
        if self.finish_reason is None:
            text = self._held_back(text)
        if not text.startswith(self.sent):  # a tokenizer that rewrote earlier text: send nothing until the end
            return self._piece("", done=self.finish_reason is not None)
        piece = text[len(self.sent):]
        self.sent = text
        return self._piece(piece, done=self.finish_reason is not None)

    def _held_back(self, text: str) -> str:
        """`text` without a trailing incomplete character or the start of a stop string."""
        text = text.rstrip("\ufffd")
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    text = text[:-k]
                    break
        return text

    def _piece(self, text: str, done: bool) -> Piece:
        new = tuple(self.tokens[self._sent_tokens:])
        self._sent_tokens = len(self.tokens)
        return Piece(text, new, self.finish_reason if done else None)
