"""A stand-in for `jaxdllm.serving.engine.Engine` with the same public surface, for the HTTP layer's
fast tests (`tests/serving/test_openai_api.py`): no model, answers scripted, every event on a background
thread as the real engine delivers them.

Each request's answer is `answer(prompt_text)` (default: the prompt reversed), emitted one character per
event, one forward per event. `hold` (a `threading.Event`, set by default) pauses decoding while
cleared, so a test can fill rows and the queue, or disconnect mid-request, deterministically.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from jaxdllm.errors import ConfigError, InputError
from jaxdllm.serving.requests import EngineStopped, Event, QueueFull, Request


class FakeEngine:
    def __init__(self, tokenizer, *, max_position: int = 64, vocab_size: int = 101, slots: int = 2,
                 max_queue: int = 2, answer=None, retry_after_s: float = 2.5, fail_with: str | None = None):
        self.tokenizer = tokenizer
        self.model_config = SimpleNamespace(max_position=max_position, vocab_size=vocab_size)
        self.slots, self.max_queue, self.retry_after_s = slots, max_queue, retry_after_s
        self.answer = answer or (lambda text: text[::-1])
        self.fail_with = fail_with  # a finished event with finish_reason "error" after the first token
        self.hold = threading.Event()
        self.hold.set()
        self.submitted: list[Request] = []
        self.cancelled: list[str] = []
        self._live: dict[str, dict] = {}  # request_id -> {"request", "on_event", "left", "sent", "forwards"}
        self._lock = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- the Engine's surface --------------------------------------------------------------------------------

    def check(self, request: Request) -> None:
        limit = self.model_config.max_position
        if len(request.prompt_ids) + request.config.gen_length > limit:
            raise InputError(f"prompt of {len(request.prompt_ids)} tokens + gen_length {request.config.gen_length} "
                             f"is past the model's {limit} positions (max_position): shorten the prompt or "
                             "lower gen_length")
        if any(not 0 <= i < self.model_config.vocab_size for i in request.prompt_ids):
            raise InputError(f"prompt ids outside the vocabulary of {self.model_config.vocab_size}")
        if request.config.policy.needs_params:
            raise ConfigError(f"policy {request.config.policy.name!r} needs its parameters, which this engine "
                              "was not started with")

    def submit(self, request: Request, on_event) -> None:
        with self._lock:
            if self._stopping:
                raise EngineStopped("the engine is draining")
            self.check(request)
            if len(self._live) >= self.slots + self.max_queue:
                raise QueueFull(f"{self.max_queue} requests wait already", retry_after_s=self.retry_after_s)
            text = self.answer(self.tokenizer.decode(request.prompt_ids))
            limit = min(request.max_tokens or request.config.gen_length, request.config.gen_length)
            reason = "length" if len(text) >= limit else "stop"
            text = text[:limit]
            for s in request.stop:
                if s in text:
                    text, reason = text[:text.index(s)], "stop"
            self.submitted.append(request)
            self._live[request.request_id] = {"request": request, "on_event": on_event, "left": list(text),
                                              "sent": 0, "forwards": 0, "reason": reason}
            self._lock.notify_all()

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self.cancelled.append(request_id)
            live = self._live.pop(request_id, None)
            self._lock.notify_all()
        if live is not None:
            live["on_event"](self._event(live, "", True, "cancelled"))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fake-engine", daemon=True)
        self._thread.start()

    def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if drain:
            end = None if timeout is None else time.monotonic() + timeout
            while self._live and (end is None or time.monotonic() < end):
                time.sleep(0.01)
        with self._lock:
            rest, self._live = list(self._live.values()), {}
        for live in rest:
            live["on_event"](self._event(live, "", True, "error", error="the engine stopped"))
        if self._thread is not None:
            self._thread.join(timeout=5)

    def stats(self) -> dict:
        with self._lock:
            running = min(len(self._live), self.slots)
            return {"running": running, "waiting": len(self._live) - running, "programs": 1, "compiles": 1}

    # -- the scripted decoding ------------------------------------------------------------------------------

    def _event(self, live, text, finished, reason, error=None):
        request = live["request"]
        return Event(text=text, token_ids=tuple(self.tokenizer.encode(text)) if text else (), finished=finished,
                     finish_reason=reason, prompt_tokens=len(request.prompt_ids), completion_tokens=live["sent"],
                     forwards=live["forwards"], error=error)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not (self._live and self.hold.is_set()) and not (self._stopping and not self._live):
                    self._lock.wait(0.01)
                if self._stopping and not self._live:
                    return
                rows = list(self._live.values())[:self.slots]
            for live in rows:
                with self._lock:
                    if live["request"].request_id not in self._live:
                        continue  # cancelled meanwhile
                    char = live["left"].pop(0) if live["left"] else ""
                    live["sent"] += bool(char)
                    live["forwards"] += 1
                    done = not live["left"]
                    failed = self.fail_with is not None and live["sent"] >= 1
                    if done or failed:
                        self._live.pop(live["request"].request_id, None)
                if failed:
                    live["on_event"](self._event(live, char, True, "error", error=self.fail_with))
                else:
                    live["on_event"](self._event(live, char, done, live["reason"] if done else None))
            time.sleep(0.002)
