"""The OpenAI-compatible HTTP layer (`jaxdllm/serving/openai_api.py`) over a scripted engine
(`tests/support/fake_engine.py`): routes, response and error shapes, server-sent events, the sampler
settings a body asks for, and that a client who disconnects frees its row. No Ray, no model: fast.
The server on Ray Serve with the real engine: tests/serving/test_ray_serve.py (slow)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi", reason="the serve extra: pip install -e '.[serve]'")

import jaxdllm  # noqa: E402
from jaxdllm.serving.requests import Request  # noqa: E402
from support.fake_engine import FakeEngine  # noqa: E402

MODEL = "tasks-llada-small"


def _test_client(app):
    try:
        from fastapi.testclient import TestClient
    except RuntimeError as e:  # starlette's test client without httpx2/httpx
        pytest.skip(str(e))
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture(scope="module")
def tokenizer():
    return jaxdllm.Tokenizer.from_pretrained(MODEL)


@pytest.fixture
def engine(tokenizer):
    engine = FakeEngine(tokenizer)
    engine.start()
    yield engine
    engine.hold.set()
    engine.shutdown(drain=False)


@pytest.fixture
def app(engine):
    from jaxdllm.serving.openai_api import create_app

    return create_app(engine, MODEL)


@pytest.fixture
def client(app):
    return _test_client(app)


def _error(response, status):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def _events(response) -> list:
    """The `data:` payloads of a server-sent event stream, JSON decoded ("[DONE]" kept as text)."""
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in response.text.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks), blocks
    return [b[6:] if b[6:] == "[DONE]" else json.loads(b[6:]) for b in blocks]


# -- routes and shapes ------------------------------------------------------------------------------------------


def test_models_lists_the_served_checkpoint(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    [card] = body["data"]
    assert card["id"] == MODEL and card["object"] == "model" and card["max_model_len"] == 64
    assert client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    assert _error(client.get("/v1/models/other"), 404)["code"] == "model_not_found"
    assert client.get("/health").status_code == 200


def test_completion_text_usage_and_the_request_the_engine_got(client, engine):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "reverse 4821=", "seed": 7})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == MODEL
    [choice] = body["choices"]
    assert choice["text"] == "=1284 esrever" and choice["finish_reason"] == "stop" and choice["index"] == 0
    prompt = len(engine.tokenizer.encode("reverse 4821="))  # BOS + 13 characters
    assert body["usage"] == {"prompt_tokens": prompt, "completion_tokens": 13, "total_tokens": prompt + 13,
                             "forwards": 13}
    [request] = engine.submitted
    assert request.prompt_ids == tuple(engine.tokenizer.encode("reverse 4821="))
    assert request.config == jaxdllm.sampler_defaults(MODEL) and request.seed == 7 and request.max_tokens is None


def test_the_prompt_as_a_list_and_as_token_ids(client, engine):
    ids = engine.tokenizer.encode("copy 12=")
    for prompt in (["copy 12="], ids, [ids]):
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
        assert r.json()["choices"][0]["text"] == "=21 ypoc", r.text
    assert _error(client.post("/v1/completions", json={"model": MODEL, "prompt": ["a", "b"]}), 400)["param"] == "prompt"


def test_max_tokens_stop_and_length(client, engine):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "reverse 4821=", "max_tokens": 3})
    assert r.json()["choices"][0]["text"] == "=12" and r.json()["choices"][0]["finish_reason"] == "length"
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "reverse 4821=", "stop": ["8", " "]})
    assert r.json()["choices"][0]["text"] == "=12" and r.json()["choices"][0]["finish_reason"] == "stop"
    assert engine.submitted[-1].stop == ("8", " ") and engine.submitted[0].max_tokens == 3
    client.post("/v1/completions", json={"model": MODEL, "prompt": "reverse 4821=", "stop": "4"})
    assert engine.submitted[-1].stop == ("4",)


def test_chat_without_a_template_joins_the_contents(client, engine):
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "sort 93="}]})
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "=39 tros"}
    assert engine.submitted[-1].prompt_ids == tuple(engine.tokenizer.encode("sort 93="))
    messages = [{"role": "system", "content": "copy 1"}, {"role": "user", "content": [{"type": "text", "text": "2="}]}]
    client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert engine.submitted[-1].prompt_ids == tuple(engine.tokenizer.encode("copy 1\n2="))


def test_chat_with_a_template_renders_it(tokenizer):
    import copy

    from jaxdllm.serving.openai_api import create_app

    templated = copy.copy(tokenizer)
    templated.chat_template = "{% for m in messages %}{{ m.content }}={% endfor %}"
    engine = FakeEngine(templated)
    engine.start()
    try:
        client = _test_client(create_app(engine, MODEL))
        r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "copy 5"}]})
        assert r.status_code == 200, r.text
        assert engine.submitted[-1].prompt_ids == tuple(templated.apply_chat_template(
            [{"role": "user", "content": "copy 5"}], tokenize=True))
    finally:
        engine.shutdown(drain=False)


def test_sampler_settings_from_the_body(client, engine):
    extra = {"preset": "fast-dllm-parallel", "threshold": 0.7, "gen_length": 32, "block_length": 8}
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "copy 1=", "temperature": 0.5, **extra})
    assert r.status_code == 200, r.text
    config = engine.submitted[-1].config
    assert config == jaxdllm.sampler_defaults(MODEL, "fast-dllm-parallel", threshold=0.7, gen_length=32,
                                              block_length=8, temperature=0.5)
    # lists arrive as tuples (a config is hashable: it keys a compiled program)
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "copy 1=", "preset": "prophet",
                                             "prophet_thresholds": [6, 4, 2]})
    assert r.status_code == 200, r.text
    assert engine.submitted[-1].config.policy.prophet_thresholds == (6, 4, 2)


def test_the_server_preset_is_the_default(engine):
    from jaxdllm.serving.openai_api import create_app

    client = _test_client(create_app(engine, MODEL, preset="fast-dllm-parallel", model_name="small"))
    assert client.get("/v1/models").json()["data"][0]["id"] == "small"
    client.post("/v1/completions", json={"model": "small", "prompt": "copy 1="})
    assert engine.submitted[-1].config == jaxdllm.sampler_defaults(MODEL, "fast-dllm-parallel")


def test_streamed_completion_ends_with_done(client, engine):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "copy 123=", "stream": True,
                                             "stream_options": {"include_usage": True}})
    assert r.status_code == 200
    events = _events(r)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "=321 ypoc"
    assert all(c["object"] == "text_completion" for c in chunks) and len({c["id"] for c in chunks}) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    prompt = len(engine.tokenizer.encode("copy 123="))
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": prompt, "completion_tokens": 9,
                                                         "total_tokens": prompt + 9, "forwards": 9}


def test_streamed_chat_starts_with_the_role(client):
    r = client.post("/v1/chat/completions", json={"model": MODEL, "stream": True,
                                                  "messages": [{"role": "user", "content": "copy 45="}]})
    events = _events(r)
    assert events[-1] == "[DONE]" and all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == "=54 ypoc"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in e for e in events[:-1])  # only with stream_options.include_usage


# -- errors --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, param", [
    ({"prompt": "copy 1="}, "model"),
    ({"model": MODEL, "prompt": "copy 1=", "temperature": -1}, "temperature"),
    ({"model": MODEL, "prompt": "copy 1=", "max_tokens": "many"}, "max_tokens"),
    ({"model": MODEL, "prompt": "copy 1=", "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL}, "prompt"),
])
def test_invalid_fields_are_400_not_422(client, body, param):
    error = _error(client.post("/v1/completions", json=body), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param and param in error["message"]


def test_a_body_that_is_not_json_is_400(client):
    r = client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    _error(r, 400)


@pytest.mark.parametrize("extra, param, words", [
    ({"threshhold": 0.9}, "threshhold", "unknown field"),
    ({"preset": "fastest"}, "preset", "unknown preset"),
    ({"preset": "fast-dllm-parallel", "threshold": 1.5}, "threshold", "threshold must be in (0, 1]"),
    ({"temperature": 0.5, "preset": "jacobi"}, None, "sampler settings"),
    ({"n": 2}, "n", "not supported"),
    ({"logprobs": 3}, "logprobs", "not supported"),
])
def test_bad_sampler_settings_and_unsupported_fields_are_400(client, engine, extra, param, words):
    error = _error(client.post("/v1/completions", json={"model": MODEL, "prompt": "copy 1=", **extra}), 400)
    assert words in error["message"] and (param is None or error["param"] == param), error
    assert not engine.submitted


def test_an_unknown_model_is_404(client):
    error = _error(client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": [{"role": "user",
                                                                                            "content": "hi"}]}), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model" and MODEL in error["message"]


def test_an_unknown_route_is_404_in_openais_shape(client):
    _error(client.get("/v1/embeddings"), 404)


def test_a_prompt_past_the_models_length_is_400_naming_the_limit(client):
    error = _error(client.post("/v1/completions", json={"model": MODEL, "prompt": "copy " + "1" * 50 + "="}), 400)
    assert "64" in error["message"] and "max_position" in error["message"] and error["param"] == "prompt"
    error = _error(client.post("/v1/chat/completions", json={"model": MODEL, "messages": [
        {"role": "user", "content": "copy " + "1" * 50 + "="}]}), 400)
    assert error["param"] == "messages"


def test_characters_the_tokenizer_lacks_are_400(client):
    error = _error(client.post("/v1/completions", json={"model": MODEL, "prompt": "copy €="}), 400)
    assert "does not know" in error["message"] and error["param"] == "prompt"


def test_a_policy_the_engine_cannot_run_is_400(client):
    error = _error(client.post("/v1/completions", json={"model": MODEL, "prompt": "copy 1=", "preset": "learn2pd"}), 400)
    assert "learn2pd" in error["message"]


def test_a_full_queue_is_503_with_retry_after(client, engine):
    engine.hold.clear()
    config = jaxdllm.sampler_defaults(MODEL)
    for i in range(engine.slots + engine.max_queue):
        engine.submit(Request(f"filler-{i}", (5, 6), config), lambda event: None)
    for path, body in (("/v1/completions", {"prompt": "copy 1="}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "copy 1="}], "stream": True})):
        r = client.post(path, json={"model": MODEL, **body})
        error = _error(r, 503)
        assert r.headers["retry-after"] == "3" and error["code"] == "queue_full" and error["type"] == "server_error"


def test_a_draining_engine_is_503(client, engine):
    engine.shutdown(drain=True)
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "copy 1="})
    assert _error(r, 503)["code"] == "shutting_down" and "retry-after" in r.headers


def test_an_engine_error_is_500_or_an_error_event(tokenizer):
    from jaxdllm.serving.openai_api import create_app

    engine = FakeEngine(tokenizer, fail_with="XLA ran out of memory")
    engine.start()
    try:
        client = _test_client(create_app(engine, MODEL))
        error = _error(client.post("/v1/completions", json={"model": MODEL, "prompt": "copy 12="}), 500)
        assert "out of memory" in error["message"] and error["type"] == "server_error"
        events = _events(client.post("/v1/completions", json={"model": MODEL, "prompt": "copy 12=", "stream": True}))
        assert events[-1] == "[DONE]" and "out of memory" in events[-2]["error"]["message"]
    finally:
        engine.shutdown(drain=False)


# -- a client that disconnects ------------------------------------------------------------------------------------


def _asgi_call(app, body: dict, *, spec: str, on_first_chunk, fail_send_after_first: bool = False):
    """POST `body` to /v1/completions straight through ASGI; after the first body chunk, `on_first_chunk()`
    runs and the client disconnects (spec 2.3: receive says so; 2.4: the next send raises OSError, as
    uvicorn's does on a closed socket). Returns the messages sent."""
    sent, first = [], asyncio.Event()

    async def run():
        payload = json.dumps(body).encode()
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": spec}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
                 "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json"),
                                                                  (b"content-length", str(len(payload)).encode())],
                 "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
        messages = [{"type": "http.request", "body": payload, "more_body": False}]

        async def receive():
            if messages:
                return messages.pop(0)
            await first.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if fail_send_after_first and first.is_set():
                raise OSError("the client closed the connection")
            sent.append(message)
            if message["type"] == "http.response.body" and message.get("body") and not first.is_set():
                on_first_chunk()
                first.set()

        try:
            await asyncio.wait_for(app(scope, receive, send), timeout=10)
        except ClientDisconnect:  # starlette's answer to the failed send (spec 2.4), for the server to drop
            assert fail_send_after_first

    from starlette.requests import ClientDisconnect

    asyncio.run(run())
    return sent


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
def test_a_client_gone_mid_stream_frees_its_row(app, engine, spec):
    body = {"model": MODEL, "prompt": "copy 123456=", "stream": True}
    _asgi_call(app, body, spec=spec, on_first_chunk=engine.hold.clear, fail_send_after_first=spec == "2.4")
    [request] = engine.submitted
    assert engine.cancelled == [request.request_id]
    assert engine.stats()["running"] == 0 and engine.stats()["waiting"] == 0
    assert app.state.counters == {"requests": 1, "cancelled": 1}


def test_a_client_gone_before_the_answer_frees_its_row(app, engine):
    engine.hold.clear()  # nothing decodes: the client leaves while its request waits
    body = {"model": MODEL, "prompt": "copy 123456="}

    async def run():
        payload = json.dumps(body).encode()
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
                 "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
        messages = [{"type": "http.request", "body": payload, "more_body": False}]

        async def receive():
            if messages:
                return messages.pop(0)
            while not engine.submitted:
                await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        async def send(message):
            pass

        await asyncio.wait_for(app(scope, receive, send), timeout=10)

    asyncio.run(run())
    [request] = engine.submitted
    assert engine.cancelled == [request.request_id] and engine.stats()["waiting"] == 0


def test_a_finished_request_is_not_cancelled(client, engine):
    client.post("/v1/completions", json={"model": MODEL, "prompt": "copy 1=", "stream": True})
    client.post("/v1/completions", json={"model": MODEL, "prompt": "copy 1="})
    assert engine.cancelled == [] and client.get("/v1/engine/stats").json() == {
        "engine": {"running": 0, "waiting": 0, "programs": 1, "compiles": 1},
        "server": {"requests": 2, "cancelled": 0}}
