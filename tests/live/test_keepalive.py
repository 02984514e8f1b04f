"""Pooled (keep-alive) connections: a response that leaves its request body unread (404,
401, a GET whose body no view reads) never strands the next request on the connection, while
generations run; a body too big or too slow to drain gets its answer with Connection: close.
greenroom/http/core/connection.py says why the next request used to hang."""

import contextlib
import json
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from conftest import MODEL, UNENDING
from hypercorn.config import Config as HypercornConfig

from greenroom.http.core.connection import DRAIN_TIMEOUT_S

ANSWER_S = 5  # an answer on loopback takes milliseconds, even under load: past this it hangs
LONG = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me a long story"}],
    "max_tokens": 500,
    "stream": True,
    **UNENDING,
}
BODY = json.dumps({"model": MODEL, "input": "a body nobody reads " * 20}).encode()
KEY = "keepalive-key"


@contextlib.contextmanager
def generating(url: str, n: int = 3, headers: dict | None = None):
    """`n` clients streaming long generations until the block ends: the load under which the
    hang showed (the front end framing chunks, both processes contending for the cores)."""
    stop, errors = threading.Event(), []
    first = [threading.Event() for _ in range(n)]

    def stream(i: int) -> None:
        try:
            with httpx.Client(timeout=60, headers=headers) as client:
                while not stop.is_set():
                    with client.stream("POST", url + "/v1/chat/completions", json=LONG) as r:
                        if r.status_code == 503:  # queue_full while the load test's requests fill the queue
                            time.sleep(0.1)
                            continue
                        assert r.status_code == 200, r.read()
                        for _ in r.iter_lines():
                            first[i].set()
                            if stop.is_set():
                                break
        except Exception as exc:  # noqa: BLE001 - reported by the test, not lost in the thread
            errors.append(repr(exc))
            first[i].set()

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for event in first:
        assert event.wait(60), "a generation never started"
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors


class Connection:
    """One keep-alive connection spoken by hand, so the body can come after the headers."""

    def __init__(self, url: str):
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=ANSWER_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _more(self) -> bytes:
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            pytest.fail(f"no answer within {ANSWER_S} s: the connection hangs")
        self.buffer += data
        return data

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            assert self._more(), f"the server closed the connection: {self.buffer!r}"
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status, *lines = head.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = int(headers["content-length"])
        while len(self.buffer) < length:
            assert self._more(), "the server closed the connection mid-body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status.split()[1]), headers, body

    def closed(self, within_s: float) -> bool:
        self.sock.settimeout(within_s)
        try:
            return self.sock.recv(65536) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def head(request_line: bytes, length: int, extra: bytes = b"") -> bytes:
    return (
        request_line + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n" % (length, extra)
    )


MODELS = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n"
# the body with the headers, just behind them, and late enough that the route has answered by then
GAPS_S = (0, 0.001, 0.05)


def unread_then_next(url: str, request_line: bytes, status: int, auth: bytes = b"") -> None:
    """On one connection, rounds of: a request answered without its body being read, the body
    arriving after its headers, then GET /v1/models; each answered within ANSWER_S."""
    conn = Connection(url)
    try:
        for gap in GAPS_S * 3:
            conn.send(head(request_line, len(BODY)))
            time.sleep(gap)
            conn.send(BODY)
            got, headers, body = conn.response()
            assert got == status, body
            assert "connection" not in headers, headers  # the body was drained: the connection stays pooled
            conn.send(MODELS % auth)
            got, _, body = conn.response()
            assert got == 200 and json.loads(body)["data"], body
    finally:
        conn.close()


@pytest.mark.parametrize(
    "request_line, status",
    [
        (b"POST /v1/images/generations", 404),  # no such route
        (b"PUT /v1/chat/completions", 404),  # the wrong method (OpenAI's answer: an unknown URL)
        (b"GET /v1/models", 200),  # a body no view reads
    ],
)
def test_unread_body_then_the_next_request(server, request_line, status):
    with generating(server.url):
        unread_then_next(server.url, request_line, status)


def test_unauthorized_body_then_the_next_request(own_server):
    srv = own_server(f'api_key = "{KEY}"\n[[models]]\nid = "greenroom-demo"\nsource = "demo:tiny"\n')
    with generating(srv.url, headers={"Authorization": f"Bearer {KEY}"}):
        unread_then_next(srv.url, b"POST /v1/chat/completions", 401, auth=f"Authorization: Bearer {KEY}\r\n".encode())


def test_openai_sdk_after_a_not_found(server):
    """The reported sequence: a route greenroom has none of (then /v1/responses, now images) and
    models.list() on the same client, which used to wait out the SDK's whole timeout."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0, timeout=ANSWER_S)
    with generating(server.url), client:
        for _ in range(10):
            with pytest.raises(openai.NotFoundError):
                client.images.generate(model=MODEL, prompt="Hello")
            assert MODEL in [m.id for m in client.models.list()]


def test_bodies_too_big_or_too_slow_are_answered_with_a_close(server):
    """No drain past the bounds: the answer comes with Connection: close, then the close."""
    for length, sent, at_least_s in [
        (10**10, b"0123456789", 0),  # declared far past DRAIN_MAX_BYTES
        (1000, b"0123456789", DRAIN_TIMEOUT_S),
    ]:  # a client that stalls
        conn = Connection(server.url)
        t0 = time.monotonic()
        conn.send(head(b"POST /v1/nothing", length) + sent)
        status, headers, body = conn.response()
        elapsed = time.monotonic() - t0
        assert status == 404 and json.loads(body)["error"]["code"] == "unknown_url", body
        assert headers["connection"] == "close" and at_least_s <= elapsed < at_least_s + ANSWER_S, (headers, elapsed)
        assert conn.closed(ANSWER_S)
        conn.close()

    conn, chunk = Connection(server.url), b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
    conn.send(b"POST /v1/nothing HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")

    def endless() -> None:
        with contextlib.suppress(OSError):  # until the server closes the connection
            while True:
                conn.send(chunk)

    pump = threading.Thread(target=endless, daemon=True)
    pump.start()
    status, headers, _ = conn.response()
    assert status == 404 and headers["connection"] == "close", headers
    assert conn.closed(ANSWER_S)
    pump.join(ANSWER_S)
    assert not pump.is_alive()
    conn.close()


def test_idle_connections_are_still_closed_by_the_keepalive_timeout(server):
    """The same cancellation used to skip restarting hypercorn's idle timer: pooled
    connections a client forgot stayed open for ever."""
    conn = Connection(server.url)
    conn.send(MODELS % b"")
    assert conn.response()[0] == 200
    conn.send(head(b"POST /v1/images/generations", len(BODY)) + BODY)
    assert conn.response()[0] == 404
    assert conn.closed(HypercornConfig.keep_alive_timeout + ANSWER_S)
    conn.close()


def streamed(conn: Connection) -> tuple[int, dict[str, str], bytes]:
    """A chunked response, whole: its status, headers and body as sent (chunk sizes and all)."""
    while b"\r\n\r\n" not in conn.buffer:
        assert conn._more(), f"the server closed the connection: {conn.buffer!r}"
    head, _, conn.buffer = conn.buffer.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    assert headers["transfer-encoding"] == "chunked", headers
    while (end := conn.buffer.find(b"\r\n0\r\n\r\n")) < 0:
        assert conn._more(), "the server closed the connection mid-stream"
    body, conn.buffer = conn.buffer[: end + 7], conn.buffer[end + 7 :]
    return int(status.split()[1]), headers, body


def test_streams_one_after_another_on_one_connection(server):
    """A pooled connection carries streamed generations one after another, each whole, whether
    the next request comes once the last one's answer is in or with it in one write (pipelined:
    hypercorn's idle timer is then restarted and stopped at once); each request has its own id;
    the idle timer closes the connection after the last."""
    chat = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stream": True})
    request = head(b"POST /v1/chat/completions", len(chat)) + chat.encode()
    conn = Connection(server.url)
    try:
        ids = set()
        for sent in (1, 1, 2, 3):
            conn.send(request * sent)
            for _ in range(sent):
                status, headers, body = streamed(conn)
                assert status == 200 and "connection" not in headers, (status, headers)
                assert body.count(b'"finish_reason":"length"') == 1 and body.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
                ids.add(headers["x-request-id"])
        assert len(ids) == 7
        assert not conn.buffer
        assert conn.closed(HypercornConfig.keep_alive_timeout + ANSWER_S)
    finally:
        conn.close()


def test_load_50_pooled_connections(server):
    """50 clients, each with one pooled connection, 20 mixed requests each (404s — wrong paths and methods — with
    bodies, a body no view reads, /v1/models, tiny completions) while 3 long generations run:
    every request answered within its timeout, a completion by 200 or a typed queue_full."""

    def requests(i: int) -> list[tuple[str, str, dict, int]]:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": f"client {i}"}], "max_tokens": 1 + i % 4}
        mix = [
            ("POST", "/v1/images/generations", {"json": {"model": MODEL, "prompt": "x" * 300}}, 404),
            ("PUT", "/v1/chat/completions", {"json": chat}, 404),
            ("GET", "/v1/models", {"content": BODY}, 200),
            ("GET", "/v1/models", {}, 200),
            ("POST", "/v1/chat/completions", {"json": chat}, 200),
        ] * 4
        random.Random(i).shuffle(mix)
        return mix

    connections = set()

    def client(i: int) -> list[str]:
        with httpx.Client(base_url=server.url, timeout=30, limits=httpx.Limits(max_connections=1)) as http:
            for method, path, kwargs, status in requests(i):
                try:
                    r = http.request(method, path, **kwargs)
                except httpx.HTTPError as exc:
                    return [f"{method} {path}: {exc!r}"]  # the first failure ends the client: the test ends
                connections.add(r.extensions["network_stream"])  # held: no id reused
                busy = r.status_code == 503 and r.json()["error"]["code"] == "queue_full"  # 53 generations, 32 queued
                if r.status_code != status and not (busy and path == "/v1/chat/completions"):
                    return [f"{method} {path}: {r.status_code} {r.text[:200]}"]
        return []

    t0 = time.monotonic()
    with generating(server.url), ThreadPoolExecutor(50) as pool:
        failures = [f for result in pool.map(client, range(50)) for f in result]
    print(f"1000 requests on {len(connections)} connections in {time.monotonic() - t0:.1f} s")
    assert not failures, failures[:10]
