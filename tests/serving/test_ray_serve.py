"""The OpenAI-compatible server on a real local Ray Serve, started as a user starts it (`jaxdllm serve`
in a fresh process, its own local Ray instance) with the shipped tasks-llada-small and the real engine,
driven over HTTP with the `openai` client and raw server-sent events: answers equal offline
`jaxdllm.generate` of the same prompt and settings; streaming; errors through Serve's proxy; a full
queue; a client that disconnects; a replica process killed mid-request (Ray restarts it, the request
fails, nothing hangs); SIGTERM drains the requests in flight (last: it stops the module's server).

One server for the module (about 15 s to start on a 2-core machine). Every wait has a timeout."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

pytestmark = pytest.mark.slow

# Found, not imported: the default run collects this module too, and importing Ray takes a second or two.
if not all(importlib.util.find_spec(m) for m in ("ray", "openai", "fastapi")):
    pytest.skip("the serve extra: pip install -e '.[serve]'", allow_module_level=True)
httpx = importlib.import_module("httpx2" if importlib.util.find_spec("httpx2") else "httpx")  # openai's own

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jaxdllm  # noqa: E402
from support.cli import cli_env, start_cli  # noqa: E402

MODEL = "tasks-llada-small"
SLOTS, MAX_QUEUE = 2, 2
LONG = {"gen_length": 44}  # 44 forwards with the checkpoint's llada settings: ~0.5 s a request here
START_TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The `jaxdllm serve` process and how to reach it."""

    def __init__(self, proc: subprocess.Popen, port: int, log_path, banner: str, ready_s: float):
        self.proc, self.port, self.log_path, self.banner, self.ready_s = proc, port, log_path, banner, ready_s
        self.url = f"http://127.0.0.1:{port}"

    def client(self, **options):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                             timeout=options.pop("timeout", 60), **options)

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/v1/engine/stats", timeout=30).json()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = _free_port()
    log_path = tmp_path_factory.mktemp("serve") / "stderr.txt"
    env = cli_env(RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION="0.01")  # ~200 MB of object store: we ship no objects
    env.pop("RAY_ADDRESS", None)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = start_cli("serve", MODEL, "--slots", SLOTS, "--max-queue", MAX_QUEUE, "--port", port,
                         "--drain-timeout", 60, env=env, stderr=log, start_new_session=True)
    banner = _read_banner(proc, log_path)
    server = Server(proc, port, log_path, banner, time.perf_counter() - started)
    print(f"\n{banner}\n(server process ready {server.ready_s:.1f} s after start; replica: "
          f"{server.stats()['server']})")
    yield server
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
    try:  # Ray's own processes live in the server's session: none may outlive the module
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


def _read_banner(proc, log_path) -> str:
    """The line `jaxdllm serve` prints once the replica is ready (it fails the test if the server stops)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(START_TIMEOUT_S)
    if not lines or " at http://" not in lines[0]:
        proc.kill()
        pytest.fail(f"jaxdllm serve did not start in {START_TIMEOUT_S} s: {lines}\n"
                    f"{log_path.read_text(errors='replace')[-4000:]}")
    return lines[0].strip()


@pytest.fixture(scope="module")
def offline():
    """`(answer text, NFE)` of `jaxdllm.generate` on the same checkpoint: the independent reference."""
    pretrained = jaxdllm.load(MODEL)
    cache = {}

    def answer(prompt: str, preset: str | None = None, seed: int = 0, **settings) -> tuple[str, int]:
        key = (prompt, preset, seed, tuple(sorted(settings.items())))
        if key not in cache:
            config = jaxdllm.sampler_defaults(MODEL, preset, **settings)
            ids = np.asarray([pretrained.tokenizer.encode(prompt)], np.int32)
            out = jaxdllm.generate(pretrained.model, ids, config, key=jax.random.PRNGKey(seed))
            cache[key] = (pretrained.tokenizer.answers(out)[0], int(out.nfe[0]))
        return cache[key]

    answer.tokenizer = pretrained.tokenizer
    return answer


def _sse_lines(response) -> list[str]:
    return [line for line in response.iter_lines() if line]


def _stream_chat(server, content: str, *, on_first=None, timeout=60, **extra):
    """Stream a chat completion with raw HTTP: `(status, data lines)`, or the exception that ended it."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": True, **extra}
    lines = []
    try:
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=timeout) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    if len(lines) == 1 and on_first is not None:
                        on_first()
            return r.status_code, lines
    except Exception as e:  # a connection the server dropped
        return e, lines


def _chat_text(lines: list[str]) -> str:
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


def _wait_for(predicate, timeout: float, what: str, every: float = 0.25):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            value = predicate()
        except Exception:  # e.g. the proxy has no replica for a moment
            value = None
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


# -- answers ---------------------------------------------------------------------------------------------------


def test_completion_and_chat_equal_offline_generate(server, offline):
    client = server.client()
    [card] = client.models.list().data
    assert card.id == MODEL

    r = client.completions.create(model=MODEL, prompt="reverse 4821=")
    text, nfe = offline("reverse 4821=")
    assert text == "1284" and r.choices[0].text == text and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == len(offline.tokenizer.encode("reverse 4821="))
    assert r.usage.completion_tokens >= len(text) and 0 < r.usage.forwards <= nfe
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "sort 93715="}],
                                       extra_body={"preset": "fast-dllm-parallel", "threshold": 0.9})
    text, nfe = offline("sort 93715=", "fast-dllm-parallel", threshold=0.9)
    assert r.choices[0].message.content == text == "13579" and r.usage.forwards == nfe == 1

    # temperature and seed: the same sampled tokens as generate(..., key=PRNGKey(seed))
    r = client.completions.create(model=MODEL, prompt="perm 4312=", temperature=0.8, seed=3)
    assert r.choices[0].text == offline("perm 4312=", seed=3, temperature=0.8)[0]


def test_streaming_equals_the_whole_answer(server, offline):
    client = server.client()
    text, _ = offline("copy 2718=")
    chunks = list(client.completions.create(model=MODEL, prompt="copy 2718=", stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.forwards > 0

    status, lines = _stream_chat(server, "copy 2718=")
    assert status == 200 and lines[-1] == "data: [DONE]" and _chat_text(lines) == text
    assert json.loads(lines[0][6:])["choices"][0]["delta"]["role"] == "assistant"


def test_errors_through_the_proxy(server):
    import openai

    client = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="copy 1=", temperature=-1)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="copy 1=", extra_body={"threshhold": 0.9})
    assert e.value.body["param"] == "threshhold"
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4o", prompt="copy 1=")
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="copy " + "1" * 50 + "=")
    assert "max_position (64)" in e.value.body["message"]


# -- load and faults -----------------------------------------------------------------------------------------------


def test_a_full_queue_is_503_with_retry_after(server, offline):
    text, _ = offline("reverse 90817=", **LONG)
    results = []

    def one():
        r = httpx.post(f"{server.url}/v1/completions", timeout=120,
                       json={"model": MODEL, "prompt": "reverse 90817=", **LONG})
        results.append(r)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert len(results) == 12, "a request hung"
    busy = [r for r in results if r.status_code == 503]
    done = [r for r in results if r.status_code == 200]
    assert len(busy) + len(done) == 12, [(r.status_code, r.text) for r in results]
    # at least a running request and the queue's are answered (more as rows free up meanwhile)
    assert busy and len(done) >= MAX_QUEUE + 1, [r.status_code for r in results]
    assert all(r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full" for r in busy)
    assert all(r.json()["choices"][0]["text"] == text for r in done)


def test_a_client_that_disconnects_frees_its_row(server):
    before = server.stats()["server"]["cancelled"]

    class Gone(Exception):
        pass

    def leave():
        raise Gone  # after the first event (the assistant's role): the request is decoding

    status, lines = _stream_chat(server, "copy 582014396=", on_first=leave, **LONG)
    assert isinstance(status, Gone) and len(lines) == 1
    stats = _wait_for(lambda: (s := server.stats()) and s["server"]["cancelled"] == before + 1
                      and s["engine"]["running"] == 0 and s["engine"]["waiting"] == 0 and s, 30,
                      "the engine to cancel the request")
    assert stats["engine"]["running"] == 0


def test_a_killed_replica_is_restarted_and_its_requests_fail(server, offline):
    pid = server.stats()["server"]["pid"]
    results, first = {}, threading.Event()

    def streamed():
        results["streamed"] = _stream_chat(server, "copy 112233445=", on_first=first.set, timeout=60, **LONG)

    def whole():
        try:
            r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                           json={"model": MODEL, "prompt": "reverse 9081726=", **LONG})
            results["whole"] = (r.status_code, r.text)
        except Exception as e:
            results["whole"] = (e, "")
        results["whole_done"] = time.perf_counter()

    threads = [threading.Thread(target=streamed), threading.Thread(target=whole)]
    threads[0].start()
    assert first.wait(60), "no first event"
    threads[1].start()
    # both requests in the replica's engine (each decodes for ~0.5 s): then kill it at once
    _wait_for(lambda: server.stats()["engine"]["running"] >= 2 or not threads[1].is_alive(), 30, "both running",
              every=0.02)
    os.kill(pid, signal.SIGKILL)
    killed = time.perf_counter()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads), "a request hung after its replica died"
    status, lines = results["streamed"]
    print(f"\nthe killed replica's requests ended with: streamed {status!r} after {len(lines)} events; "
          f"whole {results['whole'][0]!r} {results['whole'][1][:200]}")
    assert isinstance(status, Exception) or any('"error"' in line for line in lines), (status, lines)
    assert "data: [DONE]" not in lines
    status, text = results["whole"]
    if results["whole_done"] > killed:  # in flight when the replica died (on a loaded machine it may end first)
        assert isinstance(status, Exception) or status >= 500, (status, text)

    # Ray starts a new replica: a new process answers as before
    stats = _wait_for(lambda: (s := server.stats()) and s["server"]["pid"] != pid and s, 180, "a new replica")
    print(f"a new replica answers {time.perf_counter() - killed:.1f} s after the kill ({stats['server']})")
    assert stats["server"]["requests"] == 0
    r = server.client().completions.create(model=MODEL, prompt="reverse 4821=")
    assert r.choices[0].text == offline("reverse 4821=")[0]


def test_sigterm_drains_the_requests_in_flight(server, offline):
    """Last: it stops the module's server."""
    text, _ = offline("copy 582014396=", **LONG)
    results, first = {}, threading.Event()

    def stream(i):
        results[i] = _stream_chat(server, "copy 582014396=", on_first=first.set if i == 0 else None,
                                  timeout=120, **LONG)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(SLOTS + 1)]  # one waits for a row
    for t in threads:
        t.start()
    assert first.wait(60)
    # every request inside the replica's engine (running or waiting for a row) before the signal: one still on
    # its way through the proxy when Serve drops the route gets a 404, which no drain can answer
    _wait_for(lambda: (e := server.stats()["engine"]) and e["running"] + e["waiting"] + len(results) >= SLOTS + 1,
              30, "every request in the engine", every=0.02)
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(150)
    assert len(results) == SLOTS + 1, "a request hung"
    for status, lines in results.values():
        assert status == 200 and lines[-1] == "data: [DONE]" and _chat_text(lines) == text, (status, lines)
    assert server.proc.wait(120) == 143
    log = server.log()
    assert "the requests in flight were answered; the server stopped" in log, log
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/v1/models", timeout=10)
