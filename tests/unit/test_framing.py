"""The wire framing of streamed answers (greenroom/http/core/framing.py): server-sent events and
NDJSON lines byte for byte, and a streamed body that releases its request however it ends."""

from __future__ import annotations

import contextlib

import pytest
import trio

from greenroom.http.core.framing import NDJSON, SSE, SSE_DONE, Template, ndjson, sse, sse_error, streamed


@pytest.mark.parametrize(
    "frame, wire",
    [
        (sse({"a": 1}), b'data: {"a":1}\n\n'),
        (sse({"a": [1, 2], "b": None}), b'data: {"a":[1,2],"b":null}\n\n'),  # compact
        (sse({"t": "é\n😀"}), 'data: {"t":"é\\n😀"}\n\n'.encode()),  # UTF-8, not \\u escapes; newlines escaped
        (sse({"type": "ping"}, "ping"), b'event: ping\ndata: {"type":"ping"}\n\n'),
        (sse_error({"error": {"code": "x"}}), b'event: error\ndata: {"error":{"code":"x"}}\n\n'),
        (ndjson({"done": False, "response": "hi"}), b'{"done":false,"response":"hi"}\n'),
        (ndjson({"t": "a\nb"}), b'{"t":"a\\nb"}\n'),  # one line whatever the text
        (SSE_DONE, b"data: [DONE]\n\n"),
    ],
)
def test_frames_byte_for_byte(frame, wire):
    assert frame == wire


def test_each_framing_names_its_media_type():
    assert (SSE.content_type, SSE.headers) == ("text/event-stream", {"Cache-Control": "no-cache"})
    assert (NDJSON.content_type, NDJSON.headers) == ("application/x-ndjson", {})


def released(consume: int) -> tuple[list[bytes], list[str]]:
    """Stream three chunks as quart sends them, the client gone after `consume` of them: what
    was read, and what was released (the generator's own cleanup, then the request's stack)."""
    events: list[str] = []

    async def chunks():
        try:
            for i in range(3):
                yield b"%d" % i
        finally:
            events.append("chunks closed")

    async def main():
        stack = contextlib.AsyncExitStack()
        stack.callback(events.append, "request released")
        response = streamed(chunks(), SSE, {"X-Test": "1"}, stack)
        assert response.timeout is None  # a stream runs as long as it runs
        assert response.content_type == "text/event-stream"
        assert response.headers["X-Test"] == "1" and response.headers["Cache-Control"] == "no-cache"
        read = []
        async with response.response as body:  # as quart sends a body
            async for chunk in body:
                if len(read) == consume:
                    break  # the client went away
                read.append(chunk)
        return read

    return trio.run(main), events


@pytest.mark.parametrize("consume, read", [(0, []), (1, [b"0"]), (3, [b"0", b"1", b"2"])])
def test_a_streamed_body_releases_its_request_however_far_it_was_read(consume, read):
    got, events = released(consume)
    assert got == read
    assert events == ["chunks closed", "request released"]  # each once, the stream's own cleanup first


@pytest.mark.parametrize("text", ["", "plain", 'quo"te\\', "é\n😀\u2028", "\x00\x1f"])
def test_a_template_filled_is_the_frame_built_whole(text):
    """framing.Template: a chunk's text filled into the frame encoded once is byte for byte the
    frame built and encoded whole, whatever the text, a marker-like model name included."""

    def frame(created: str, content: str) -> bytes:
        return ndjson({"model": 'm"é', "created_at": created, "message": {"content": content}, "done": False})

    assert Template.of(frame, holes=2).fill("2026-01-01T00:00:00Z", text) == frame("2026-01-01T00:00:00Z", text)
    one = Template.of(lambda content: sse({"id": "x", "choices": [{"delta": {"content": content}}]}))
    assert one.fill(text) == sse({"id": "x", "choices": [{"delta": {"content": text}}]})
