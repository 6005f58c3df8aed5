"""An OpenAI-compatible HTTP API around an `Engine` (`jaxdllm/serving/engine.py`): a FastAPI app.

    app = create_app(engine, "tasks-llada-small")      # any object with the Engine's surface
    uvicorn.run(app)                                    # or Ray Serve: jaxdllm/serving/ray_app.py

Routes:
  GET  /v1/models              the one served model (its id: the checkpoint's folder name, or `model_name`)
  POST /v1/completions         `prompt` (text, one-element list of text, token ids)
  POST /v1/chat/completions    `messages`, rendered with the tokenizer's chat template; a checkpoint
                               without one (the shipped task models) gets the messages' contents joined
                               with newlines, no roles: one user message is its content as is
  GET  /v1/engine/stats        the engine's `stats()` and this server's counters (not OpenAI's)
  GET  /health                 200 while the app runs

Fields: `model`, `max_tokens` (the most answer tokens returned; a diffusion model still decodes its
whole canvas, `gen_length`), `temperature` (the sampler's; omitted: the checkpoint's default, greedy for
the shipped models), `top_p` (the sampler's, where the policy has one), `stop` (a string or a list),
`seed` (omitted: a random one), `stream` (server-sent events, `data: {...}` per chunk, ending
`data: [DONE]`), `stream_options.include_usage`. jaxdllm's sampler settings go in the body beside them
(the OpenAI client's `extra_body`): `preset` and any `SamplerConfig` option, e.g.
`{"preset": "fast-dllm-parallel", "threshold": 0.9, "gen_length": 32}`; the config is
`jaxdllm.sampler_defaults(checkpoint, preset, **options)`. `usage` has `prompt_tokens`,
`completion_tokens`, `total_tokens` and `forwards` (the model forwards the request's row took part in,
its NFE: `completion_tokens / forwards` is tokens per forward).

Errors have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: a field that is invalid
or unknown 400 (FastAPI's own 422 included), a model this server does not serve 404, a prompt the
model cannot take (e.g. past its length; the engine's `check`) 400, the engine's queue full 503 with a
`Retry-After` header, a draining engine 503. A client that disconnects has its request cancelled in the
engine, which frees its row.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from jaxdllm.errors import JaxdllmError
from jaxdllm.serving.requests import EngineStopped, Event, QueueFull, Request

# The extra body field that picks a preset; every other extra field must be a SamplerConfig option.
PRESET_FIELD = "preset"
_CACHE_SIZE = 256  # distinct sampler settings kept built


class ApiError(Exception):
    """An error the API answers in OpenAI's shape: `status` and the `error` object's fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, type=self.type, param=self.param, code=self.code,
                              headers=self.headers)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """`{"error": {"message", "type", "param", "code"}}`, OpenAI's error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(status: int, message: str, **fields) -> JSONResponse:
    headers = fields.pop("headers", None)
    return JSONResponse(error_body(message, **fields), status_code=status, headers=headers)


# ---------------------------------------------------------------------------------------------------
# Request bodies. `extra="allow"`: the sampler settings ride beside OpenAI's fields.


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**31)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None


class CompletionBody(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Common):
    messages: list[Message] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)


# Fields OpenAI has and jaxdllm does not do, with the value that means "not asked for".
_UNSUPPORTED = {"n": 1, "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
                "logit_bias": (None, {}), "echo": False, "logprobs": (None, False, 0), "best_of": (None, 1),
                "suffix": (None, ""), "top_logprobs": (None, 0)}


def _check_unsupported(body: BaseModel) -> None:
    for name, allowed in _UNSUPPORTED.items():
        if name not in type(body).model_fields:
            continue
        value = getattr(body, name)
        allowed = allowed if isinstance(allowed, tuple) else (allowed,)
        if value not in allowed:
            raise ApiError(400, f"{name}={value!r} is not supported by jaxdllm's server (leave it out)", param=name,
                           code="unsupported_parameter")


# ---------------------------------------------------------------------------------------------------
# From a body to an engine `Request`.


class SamplerSettings:
    """Builds (and keeps) the `SamplerConfig` of a request's preset and options, from the checkpoint.

    Args:
      checkpoint: folder, shipped name or `Checkpoint` (`jaxdllm.sampler_defaults` reads its settings).
      preset: the preset a request without `preset` decodes with (None: the checkpoint's default).
    """

    def __init__(self, checkpoint, preset: str | None = None):
        from jaxdllm.checkpoint.folder import Checkpoint
        from jaxdllm.decoding.config import SAMPLER_PRESETS, SamplerConfig

        self.checkpoint = Checkpoint.open(checkpoint)
        self.preset = preset
        self.options = frozenset(SamplerConfig.option_names())
        self.presets = tuple(SAMPLER_PRESETS)
        self._built: dict[str, Any] = {}

    def config(self, preset: str | None, overrides: dict):
        """The `SamplerConfig`; an unknown option or a bad value is a 400 naming it."""
        from jaxdllm.pretrained import sampler_defaults

        unknown = sorted(set(overrides) - self.options)
        if unknown:
            raise ApiError(400, f"unknown field(s) {unknown}: the body takes OpenAI's fields, {PRESET_FIELD!r} and "
                                f"SamplerConfig options ({', '.join(sorted(self.options))})", param=unknown[0],
                           code="unknown_parameter")
        preset = self.preset if preset is None else preset
        if preset is not None and (not isinstance(preset, str) or preset not in self.presets):
            raise ApiError(400, f"unknown preset {preset!r}; presets: {', '.join(self.presets)}", param=PRESET_FIELD)
        overrides = {k: _frozen(v) for k, v in overrides.items()}
        key = json.dumps([preset, sorted(overrides.items(), key=lambda kv: kv[0])], default=repr)
        if key not in self._built:
            try:
                config = sampler_defaults(self.checkpoint, preset, **overrides)
            except (ValueError, TypeError) as e:  # ConfigError / ConfigTypeError, and bad keyword values
                param = next((k for k in sorted(overrides) if k in str(e)), None)
                raise ApiError(400, f"sampler settings: {e}", param=param) from e
            if len(self._built) >= _CACHE_SIZE:
                self._built.pop(next(iter(self._built)))
            self._built[key] = config
        return self._built[key]


def _frozen(value):
    """JSON lists as tuples (SamplerConfig settings are hashable: a config keys a compiled program)."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def _stops(stop) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if any(not s for s in stops):
        raise ApiError(400, "stop strings must not be empty", param="stop")
    return stops


def chat_prompt(tokenizer, messages: list[Message]) -> list[int]:
    """The prompt ids of `messages`: the tokenizer's chat template (with the generation prompt), or, for
    a checkpoint without one, the contents joined with newlines and encoded as plain text."""
    plain = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ApiError(400, f"messages[{i}].content: only text parts are supported, got "
                                        f"{part.get('type')!r}", param=f"messages[{i}].content")
                parts.append(part["text"])
            content = "".join(parts)
        plain.append({"role": m.role, "content": content or ""})
        _check_known(tokenizer, content or "", f"messages[{i}].content")
    if getattr(tokenizer, "chat_template", None):
        try:
            return list(tokenizer.apply_chat_template(plain, tokenize=True))
        except JaxdllmError as e:
            raise ApiError(400, f"messages: {e}", param="messages") from e
        except Exception as e:  # a template's own raise_exception (e.g. roles out of order)
            raise ApiError(400, f"messages: the chat template rejected them: {e}", param="messages") from e
    return list(tokenizer.encode("\n".join(m["content"] for m in plain)))


def _check_known(tokenizer, text: str, param: str) -> None:
    check = getattr(tokenizer, "check_known", None)
    if check is not None:
        try:
            check(text)  # characters the vocabulary lacks: a DataError naming them
        except JaxdllmError as e:
            raise ApiError(400, f"{param}: {e}", param=param) from e


def _encode(tokenizer, text: str, param: str) -> list[int]:
    _check_known(tokenizer, text, param)
    return list(tokenizer.encode(text))


def completion_prompt(tokenizer, prompt) -> list[int]:
    """The prompt ids of a completion's `prompt`: text, a one-element list of text, or token ids."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ApiError(400, f"prompt: one prompt per request (got {len(prompt)}); send several requests, the "
                                "engine batches them", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "prompt is empty: give the text to continue", param="prompt")
        return _encode(tokenizer, prompt, "prompt")
    if not prompt:
        raise ApiError(400, "prompt is empty: give the text or token ids to continue", param="prompt")
    return [int(i) for i in prompt]


# ---------------------------------------------------------------------------------------------------
# The engine's thread -> the request's asyncio task.


class Submission:
    """One request in the engine, its events handed to the event loop through an `asyncio.Queue`.

    `submit()` raises as `Engine.submit` does (mapped to HTTP by `_submit_error`); iterate `events()`
    to the finished one. `close()` cancels the request in the engine unless it finished (a client gone).
    """

    def __init__(self, engine, request: Request, counters: dict):
        self.engine, self.request, self.counters = engine, request, counters
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False
        self.submitted = False

    def _on_event(self, event: Event) -> None:  # the engine's thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody waits for this request any more
            pass

    def submit(self) -> None:
        self.engine.submit(self.request, self._on_event)
        self.submitted = True
        self.counters["requests"] += 1

    async def next(self) -> Event:
        event = await self.queue.get()
        self.finished = self.finished or event.finished
        return event

    def close(self) -> None:
        """Cancel the request in the engine if it has not finished (frees its row or queue place)."""
        if self.submitted and not self.finished:
            self.finished = True
            self.counters["cancelled"] += 1
            self.engine.cancel(self.request.request_id)


def _submit_error(e: Exception, prompt_param: str) -> ApiError:
    if isinstance(e, QueueFull):
        retry = max(1, math.ceil(getattr(e, "retry_after_s", 1.0) or 1.0))
        return ApiError(503, f"the server is busy: {e}; retry in {retry} s", type="server_error", code="queue_full",
                        headers={"Retry-After": str(retry)})
    if isinstance(e, EngineStopped):
        return ApiError(503, f"the server is shutting down: {e}", type="server_error", code="shutting_down",
                        headers={"Retry-After": "1"})
    from jaxdllm.errors import ConfigError, InputError

    if isinstance(e, InputError):
        return ApiError(400, str(e), param=prompt_param, code="invalid_prompt")
    if isinstance(e, (ConfigError, JaxdllmError)):
        return ApiError(400, str(e))
    raise e


def _usage(event: Event | None) -> dict:
    prompt, completion, forwards = ((event.prompt_tokens, event.completion_tokens, event.forwards) if event
                                    else (0, 0, 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "forwards": forwards}


def _finish_error(event: Event) -> ApiError | None:
    """The error a finished event ends the request with, None for "stop" and "length"."""
    if event.finish_reason == "error":
        return ApiError(500, f"decoding failed: {event.error or 'unknown error'}", type="server_error",
                        code="engine_error")
    if event.finish_reason == "cancelled":
        return ApiError(503, "the request was cancelled in the engine (the server is stopping)", type="server_error",
                        code="cancelled", headers={"Retry-After": "1"})
    return None


def _sse(data) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


# ---------------------------------------------------------------------------------------------------
# The app.


def create_app(engine, checkpoint, *, model_name: str | None = None, preset: str | None = None,
               server_info: dict | None = None, title: str = "jaxdllm") -> FastAPI:
    """The OpenAI-compatible app serving `engine` (routes in this module's docstring).

    Args:
      engine: an `Engine` (started), or any object with its surface (`submit`, `cancel`, `stats`,
        `tokenizer`, `model_config`).
      checkpoint: the checkpoint folder, shipped name or `Checkpoint` it decodes: requests' sampler
        settings are `jaxdllm.sampler_defaults(checkpoint, preset, **options)`.
      model_name: the model id clients send (default: the checkpoint folder's name).
      preset: the preset of a request that names none (default: the checkpoint's own).
      server_info: more fields for `/v1/engine/stats`'s "server" part (e.g. the process id, start-up time).
    """
    settings = SamplerSettings(checkpoint, preset)
    model_name = model_name or settings.checkpoint.folder.name
    created = int(time.time())
    counters = {"requests": 0, "cancelled": 0}
    app = FastAPI(title=title, docs_url=None, redoc_url=None)
    app.state.engine, app.state.settings, app.state.counters = engine, settings, counters

    @app.exception_handler(ApiError)
    async def api_error(_, e: ApiError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_, e: RequestValidationError):  # FastAPI answers 422; OpenAI answers 400
        errors = e.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        message = "; ".join(f"{'.'.join(str(p) for p in err.get('loc', ()) if p != 'body') or 'body'}: "
                            f"{err.get('msg', 'invalid')}" for err in errors) or "invalid request body"
        return error_response(400, message, param=param, code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_, e: StarletteHTTPException):
        kind = "invalid_request_error" if e.status_code < 500 else "server_error"
        return error_response(e.status_code, str(e.detail), type=kind, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(_, e: Exception):  # still logged by the server; the client gets OpenAI's shape
        return error_response(500, f"internal error: {type(e).__name__}: {e}", type="server_error")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(model_name, created, engine)]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        _check_model(name, model_name)
        return _model_card(model_name, created, engine)

    @app.get("/v1/engine/stats")
    async def stats():
        return {"engine": _jsonable(engine.stats()), "server": {**counters, **_jsonable(server_info or {})}}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, http: HttpRequest):
        _check_model(body.model, model_name)
        ids = completion_prompt(engine.tokenizer, body.prompt)
        return await _respond(http, body, ids, "prompt", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, http: HttpRequest):
        _check_model(body.model, model_name)
        ids = chat_prompt(engine.tokenizer, body.messages)
        return await _respond(http, body, ids, "messages", chat=True)

    async def _respond(http: HttpRequest, body: _Common, ids: list[int], prompt_param: str, chat: bool):
        _check_unsupported(body)
        overrides = dict(body.model_extra or {})
        request_preset = overrides.pop(PRESET_FIELD, None)
        if body.temperature is not None:
            overrides["temperature"] = body.temperature
        if body.top_p is not None and body.top_p != 1:
            overrides["top_p"] = body.top_p
        config = settings.config(request_preset, overrides)
        max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        request = Request(request_id=request_id, prompt_ids=tuple(ids), config=config, max_tokens=max_tokens,
                          stop=_stops(body.stop), seed=secrets.randbelow(2**31) if body.seed is None else body.seed)
        submission = Submission(engine, request, counters)
        try:
            submission.submit()
        except Exception as e:
            raise _submit_error(e, prompt_param) from e
        reply = _Reply(request_id, model_name, chat)
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_stream(http, submission, reply, usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _whole(http, submission, reply)

    return app


def _model_card(name: str, created: int, engine) -> dict:
    card = {"id": name, "object": "model", "created": created, "owned_by": "jaxdllm"}
    max_position = getattr(getattr(engine, "model_config", None), "max_position", None)
    if max_position is not None:
        card["max_model_len"] = int(max_position)
    return card


def _jsonable(value):
    """`value` with numpy scalars and arrays (and anything else JSON lacks) as plain values or text."""
    return json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))


def _check_model(name: str, served: str) -> None:
    if name != served:
        raise ApiError(404, f"the model {name!r} does not exist here; this server serves {served!r} "
                            "(GET /v1/models)", param="model", code="model_not_found")


class _Reply:
    """The response objects of one request (completion or chat; whole or chunks)."""

    def __init__(self, request_id: str, model: str, chat: bool):
        self.id, self.model, self.chat, self.created = request_id, model, chat, int(time.time())

    def _frame(self, obj: str, choices: list, usage=None) -> dict:
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            out["usage"] = usage
        return out

    def whole(self, text: str, finish_reason: str, usage: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
            return self._frame("chat.completion", [choice], usage)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._frame("text_completion", [choice], usage)

    def chunk(self, text: str, finish_reason: str | None, first: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            return self._frame("chat.completion.chunk",
                               [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}])
        return self._frame("text_completion",
                           [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}])

    def usage_chunk(self, usage: dict) -> dict:
        return self._frame("chat.completion.chunk" if self.chat else "text_completion", [], usage)


async def _next_event(submission: Submission, watcher: asyncio.Future) -> Event | None:
    """The request's next event, or None when `watcher` (the client's disconnect) comes first."""
    getter = asyncio.ensure_future(submission.next())
    try:
        done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getter.done():
            getter.cancel()
    return getter.result() if getter in done else None


async def _whole(http: HttpRequest, submission: Submission, reply: _Reply) -> JSONResponse:
    """Wait for the finished event; a client that disconnects first cancels the request."""
    watcher = asyncio.ensure_future(_disconnected(http))
    texts, event = [], None
    try:
        while True:
            event = await _next_event(submission, watcher)
            if event is None:  # the client is gone: nobody reads this answer
                return JSONResponse(error_body("client disconnected", code="cancelled"), status_code=499)
            texts.append(event.text)
            if event.finished:
                break
    finally:
        watcher.cancel()
        submission.close()  # a cancelled handler (Ray Serve cancels it when the client goes) frees the row
    error = _finish_error(event)
    if error is not None:
        return error.response()
    return JSONResponse(reply.whole("".join(texts), event.finish_reason, _usage(event)))


async def _disconnected(http: HttpRequest) -> None:
    """Returns when the client disconnects (the body has been read: the next message is the disconnect)."""
    try:
        while True:
            message = await http.receive()
            if message.get("type") == "http.disconnect":
                return
    except Exception:  # a server whose receive cannot be awaited here: never report a disconnect
        await asyncio.Event().wait()


async def _stream(http: HttpRequest, submission: Submission, reply: _Reply, include_usage: bool):
    """Server-sent events: a chunk per event, the finish reason on the last, usage if asked, `[DONE]`.
    A client that disconnects ends it (its disconnect message, a failed send or the task cancelled);
    the `finally` cancels the request in the engine."""
    first = True
    watcher = asyncio.ensure_future(_disconnected(http))
    try:
        if reply.chat:  # the assistant's role first, as OpenAI's stream does
            yield _sse(reply.chunk("", None, first=True))
            first = False
        while True:
            event = await _next_event(submission, watcher)
            if event is None:
                return
            error = _finish_error(event) if event.finished else None
            if error is not None:
                if event.text:
                    yield _sse(reply.chunk(event.text, None, first=first))
                yield _sse(error_body(error.message, type=error.type, code=error.code))
                break
            if event.text or event.finished:
                yield _sse(reply.chunk(event.text, event.finish_reason if event.finished else None, first=first))
                first = False
            if event.finished:
                if include_usage:
                    yield _sse(reply.usage_chunk(_usage(event)))
                break
        yield _sse("[DONE]")
    finally:
        watcher.cancel()
        submission.close()


__all__ = ["ApiError", "ChatBody", "CompletionBody", "SamplerSettings", "Submission", "chat_prompt",
           "completion_prompt", "create_app", "error_body"]
