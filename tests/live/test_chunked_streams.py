"""Streamed answers as they are on the wire (http/core/chunked.py frames their chunks): read by h11
as a client from four requests pipelined on one keep-alive connection, each chunk whole events
(SSE) or whole lines (NDJSON), the same text and usage as the whole answers, and a /v1 stream's
end — its last finishing chunk, the usage-only chunk and [DONE] — one chunk, one write."""

from __future__ import annotations

import json
import socket

import h11
from conftest import MODEL

TOKENS = 24
MESSAGES = [{"role": "user", "content": "Tell a story about chunks."}]
V1 = {"model": MODEL, "messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0}
OLLAMA = {"model": MODEL, "messages": MESSAGES, "options": {"num_predict": TOKENS, "temperature": 0}}


def post(client: h11.Connection, path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    headers = [("Host", "x"), ("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    return client.send(h11.Request(method="POST", target=path, headers=headers)) + client.send(h11.Data(data=data))


def responses(url: str, requests: list[tuple[str, dict]]) -> list[list[bytes]]:
    """`requests` sent at once on one connection; each response's body as the chunks it was framed in."""
    host, port = url.removeprefix("http://").split(":")
    client = h11.Connection(h11.CLIENT)
    out = []
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sent = b""
        for path, body in requests:  # h11 writes one request a cycle: pipelined by hand
            writer = h11.Connection(h11.CLIENT)
            sent += post(writer, path, body) + writer.send(h11.EndOfMessage())
        sock.sendall(sent)
        for _ in requests:
            client.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
            client.send(h11.EndOfMessage())
            chunks = []
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    client.receive_data(sock.recv(65536))
                elif isinstance(event, h11.Response):
                    assert event.status_code == 200, event
                elif isinstance(event, h11.Data):
                    if event.chunk_start or not chunks:
                        chunks.append(b"")
                    chunks[-1] += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
            out.append(chunks)
            client.start_next_cycle()
    return out


def test_pipelined_streams_are_validly_chunked_whole_events_and_end_in_one_write(server):
    sse, whole, ndjson, ollama_whole = responses(
        server.url,
        [
            ("/v1/chat/completions", {**V1, "stream": True, "stream_options": {"include_usage": True}}),
            ("/v1/chat/completions", V1),
            ("/api/chat", {**OLLAMA, "stream": True}),
            ("/api/chat", {**OLLAMA, "stream": False}),
        ],
    )
    events = [[e for e in chunk.decode().split("\n\n") if e] for chunk in sse]
    assert all(chunk.endswith(b"\n\n") for chunk in sse)
    *_, end = events
    assert [e.startswith("data: ") for e in end] == [True] * 3 and end[-1] == "data: [DONE]"
    finishing, usage = (json.loads(e.removeprefix("data: ")) for e in end[:2])
    assert finishing["choices"][0]["finish_reason"] == "length" and not finishing["choices"][0]["delta"]
    assert usage["choices"] == []
    answer = json.loads(b"".join(whole))
    assert usage["usage"] == answer["usage"]
    chunks = [json.loads(e.removeprefix("data: ")) for chunk in events[:-1] for e in chunk]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == answer["choices"][0]["message"]["content"] and len(chunks) > 2

    assert all(chunk.endswith(b"\n") for chunk in ndjson)
    lines = [json.loads(line) for chunk in ndjson for line in chunk.splitlines()]
    done = json.loads(b"".join(ollama_whole))
    assert lines[-1]["done"] and lines[-1]["eval_count"] == done["eval_count"] == TOKENS
    assert "".join(line["message"]["content"] for line in lines) == done["message"]["content"] == text
