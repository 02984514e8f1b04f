"""SIGTERM on a server with streams open on every surface (http/core/shutdown.py): new requests get 503
server_shutting_down at once, what fits in the drain completes, what is left ends with its
surface's failure form — OpenAI's `error` event and [DONE], Anthropic's `error` event, the
Responses API's `error` and `response.failed`, Ollama's error line — and the process exits soon
after, with no traceback."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest
from conftest import MODEL, UNENDING, Server
from fake_hub import server_cache

GGUF = "greenroom-demo-gguf:Q8_0"
DRAIN_S = 4.0
CONFIG = f"""
npu_actors = []
graceful_shutdown_timeout_s = {DRAIN_S}
gguf_parallel = 8
[[models]]
id = "{MODEL}"
source = "demo:tiny"
[[models]]
id = "{GGUF}"
source = "demo-gguf:Q8_0"
engine = "llama.cpp"
n_ctx = 4096
"""
LONG = 3000  # tokens: far past the drain (the GGUF demo decodes ~30 a second a stream here)
CHAT = {"messages": [{"role": "user", "content": "Go"}]}

# (path, body) per surface: each a long stream on the GGUF model's actor
STREAMS = {
    "chat": ("/v1/chat/completions", {**CHAT, "max_tokens": LONG, **UNENDING}),
    "completions": ("/v1/completions", {"prompt": "Go", "max_tokens": LONG, **UNENDING}),
    "messages": ("/v1/messages", {**CHAT, "max_tokens": LONG, **UNENDING}),
    "responses": ("/v1/responses", {"input": "Go", "max_output_tokens": LONG, **UNENDING}),
    "ollama_chat": ("/api/chat", {**CHAT, "options": {"num_predict": LONG, "temperature": 0}}),
    "ollama_generate": ("/api/generate", {"prompt": "Go", "options": {"num_predict": LONG, "temperature": 0}}),
}


class Exchange(threading.Thread):
    """One request read to its end in a thread: its status, its body's bytes with the time each
    arrived, and whether it has begun."""

    def __init__(self, url: str, path: str, body: dict | None, method: str = "POST"):
        super().__init__(daemon=True)
        self.url, self.path, self.body, self.method = url, path, body, method
        self.status: int | None = None
        self.chunks: list[tuple[float, bytes]] = []
        self.begun = threading.Event()
        self.error: Exception | None = None
        self.start()

    def run(self) -> None:
        try:
            with httpx.stream(self.method, self.url + self.path, json=self.body, timeout=120) as r:
                self.status = r.status_code
                for chunk in r.iter_bytes():
                    self.chunks.append((time.monotonic(), chunk))
                    self.begun.set()
        except Exception as exc:  # noqa: BLE001 (the assertions say what went wrong)
            self.error = exc
        self.ended = time.monotonic()
        self.begun.set()

    @property
    def text(self) -> str:
        return b"".join(c for _, c in self.chunks).decode()

    def after(self, t: float) -> int:
        return sum(len(c) for at, c in self.chunks if at > t)


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """A server-sent event stream as (event name, data) pairs."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        name = next((line[len("event: ") :] for line in lines if line.startswith("event: ")), None)
        data = next((line[len("data: ") :] for line in lines if line.startswith("data: ")), None)
        if data is not None:
            out.append((name, data))
    return out


@pytest.fixture
def srv(tmp_path, model_cache):
    server = Server(tmp_path, server_cache(tmp_path, model_cache), CONFIG)
    yield server
    server.stop()


def test_sigterm_drains_then_ends_every_stream_in_its_surfaces_form(srv):
    assert httpx.post(srv.url + "/api/models/load", json={"model": GGUF}, timeout=120).status_code == 200
    streams = {
        name: Exchange(srv.url, path, {"model": GGUF, "stream": True, **body}) for name, (path, body) in STREAMS.items()
    }
    whole = Exchange(srv.url, "/v1/chat/completions", {"model": GGUF, **CHAT, "max_tokens": LONG, **UNENDING})
    for exchange in streams.values():
        assert exchange.begun.wait(60) and exchange.status == 200, (exchange.path, exchange.error)
    monitoring = Exchange(srv.url, "/api/monitoring/stream", None, "GET")  # no work: ended at once
    short = Exchange(srv.url, "/v1/chat/completions", {"model": MODEL, **CHAT, "max_tokens": 60, "stream": True})
    assert short.begun.wait(60) and monitoring.begun.wait(60)
    signalled = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)

    time.sleep(0.5)  # draining: new requests are refused in each surface's envelope, and told to close
    refused = httpx.post(srv.url + "/v1/chat/completions", json={"model": MODEL, **CHAT}, timeout=10)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
    assert refused.headers["Connection"] == "close"
    refused = httpx.post(srv.url + "/api/chat", json={"model": MODEL, **CHAT}, timeout=10)
    assert refused.status_code == 503 and refused.json()["code"] == "server_shutting_down"
    refused = httpx.post(srv.url + "/v1/messages", json={"model": MODEL, **CHAT, "max_tokens": 4}, timeout=10)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"

    srv.proc.wait(DRAIN_S + 10)
    exited = time.monotonic() - signalled
    for exchange in [*streams.values(), whole, short, monitoring]:
        exchange.join(10)
        assert exchange.error is None, (exchange.path, exchange.error)

    assert monitoring.ended - signalled < 2.0
    event, data = sse_events(monitoring.text)[-1]
    assert event == "error" and json.loads(data)["error"]["code"] == "server_shutting_down"
    # the stream that fitted in the drain completed as it would have
    events = sse_events(short.text)
    assert events[-1] == (None, "[DONE]") and json.loads(events[-2][1])["choices"][0]["finish_reason"] == "length"
    # the others streamed on through the drain, then ended with the typed error
    for name, exchange in streams.items():
        assert exchange.after(signalled + 1.0) > 0, name
    for name in ("chat", "completions"):
        (event, data), done = sse_events(streams[name].text)[-2:]
        assert event == "error" and json.loads(data)["error"]["code"] == "server_shutting_down", name
        assert done == (None, "[DONE]"), name
    event, data = sse_events(streams["messages"].text)[-1]
    body = json.loads(data)
    assert event == "error" and body["type"] == "error" and body["error"]["code"] == "server_shutting_down"
    (error, data), (failed, last) = sse_events(streams["responses"].text)[-2:]
    assert error == "error" and json.loads(data)["code"] == "server_shutting_down"
    assert failed == "response.failed" and json.loads(last)["response"]["status"] == "failed"
    for name in ("ollama_chat", "ollama_generate"):
        line = json.loads(streams[name].text.strip().splitlines()[-1])
        assert line["code"] == "server_shutting_down" and "shut down" in line["error"], name
    # the request not answering yet gets the error as its response
    assert whole.status == 503 and json.loads(whole.text)["error"]["code"] == "server_shutting_down"

    assert DRAIN_S <= exited < DRAIN_S + 8.0, exited
    assert srv.proc.returncode == 0
    log = srv.log_path.read_text(errors="replace")
    assert "SIGTERM received: taking no new requests, draining for up to 4 s" in log
    assert "Traceback" not in log, log[-5000:]
