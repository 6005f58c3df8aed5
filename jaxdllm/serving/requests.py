"""What a caller hands the engine (`Request`) and what the engine hands back as a request decodes
(`Event`), with the errors a request can end in."""

from __future__ import annotations

import dataclasses

from jaxdllm.decoding.config import SamplerConfig
from jaxdllm.errors import JaxdllmError


class QueueFull(JaxdllmError, RuntimeError):
    """The engine's waiting queue is at its bound: try again later (HTTP 503 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineStopped(JaxdllmError, RuntimeError):
    """The engine is draining or stopped and takes no new request."""


@dataclasses.dataclass(frozen=True)
class Request:
    """One generation request.

    Attributes:
      request_id: the caller's id (unique among the engine's live requests).
      prompt_ids: the prompt's token ids (chat template already applied).
      config: the `SamplerConfig` it decodes with (a static setting of the compiled loop: requests with
        equal configs share rows of one compiled program).
      max_tokens: the most answer tokens returned (None: `config.gen_length`); the row is released as
        soon as that many are decided left to right. It never changes the canvas (`gen_length`).
      stop: strings that end the answer (the text up to the first one is returned; finish reason "stop").
      seed: the PRNG seed (`jax.random.PRNGKey(seed)`), as `generate(..., key=PRNGKey(seed))`.
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    config: SamplerConfig
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Event:
    """What a request decided since its last event (delivered from the engine's thread).

    Attributes:
      text: new answer text since the last event (incrementally detokenised; may be "").
      token_ids: the new answer tokens behind `text`.
      finished: the last event of the request.
      finish_reason: "stop" (EOS or a stop string), "length" (max_tokens or gen_length), "cancelled",
        "error" (`error` says what); None until finished.
      prompt_tokens: tokens of the prompt.
      completion_tokens: answer tokens emitted so far.
      forwards: the model forwards the request's row took part in so far (its NFE).
      error: the error message when `finish_reason == "error"`.
    """

    text: str
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    forwards: int
    error: str | None = None
