"""How streamed answers are framed on the wire: server-sent events (/v1 and the monitoring
stream) and newline-delimited JSON (the Ollama surface), and the streamed response that
carries them. One place for each format.

A stream's running text goes out as a `Template` filled in: the frame is built and encoded once
per stream with a marker where its text goes, and each chunk is then the pieces around it and
the text's JSON string — the same bytes as building and encoding the frame whole, which took
about a fifth of the front end's CPU per chunk (the objects' build, a dict per level, the
encoder's pass over all of it) at 64 streams of bench/throughput.py.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Callable

import attrs
from quart import Response


@attrs.frozen
class Framing:
    """A streamed response's media type and the headers it always carries."""

    content_type: str
    headers: dict = attrs.Factory(dict)


SSE = Framing("text/event-stream", {"Cache-Control": "no-cache"})
NDJSON = Framing("application/x-ndjson")

SSE_DONE = b"data: [DONE]\n\n"


def _json(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


_string = json.encoder.encode_basestring  # a str as json.dumps(..., ensure_ascii=False) writes it


@attrs.frozen
class Template:
    """A frame whose strings `fill` gives, in the order they appear in it."""

    pieces: tuple[bytes, ...]

    @classmethod
    def of(cls, frame: Callable[..., bytes], holes: int = 1) -> Template:
        """`frame(*strings)`'s bytes cut around each string: built with random markers, which
        nothing else in a frame can hold."""
        marks = [secrets.token_hex(16) for _ in range(holes)]
        rest, pieces = frame(*marks), []
        for mark in marks:
            piece, _, rest = rest.partition(b'"' + mark.encode() + b'"')
            pieces.append(piece)
        return cls((*pieces, rest))

    def fill(self, *strings: str) -> bytes:
        out = [self.pieces[0]]
        for string, piece in zip(strings, self.pieces[1:], strict=True):
            out += (_string(string).encode(), piece)
        return b"".join(out)


def sse(obj: dict, event: str | None = None) -> bytes:
    """One server-sent event: `data: <json>`, named when `event` is given."""
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + _json(obj) + b"\n\n"


def sse_error(body: dict) -> bytes:
    """An in-stream failure: an `error` event (the status is already 200), then [DONE]."""
    return sse(body, "error")


def ndjson(obj: dict) -> bytes:
    """One line of an NDJSON stream."""
    return _json(obj) + b"\n"


class StreamBody:
    """A streamed response body that always releases its request: quart calls
    `aclose` when the client goes away, even before the first chunk. `done` runs once the
    last chunk has been taken (not when the client went away first)."""

    def __init__(self, chunks, stack: contextlib.AsyncExitStack, done: Callable[[], None] | None = None):
        self._chunks = chunks
        self._stack = stack
        self._done = done

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            if self._done is not None:
                self._done()
            raise

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()
        finally:
            await self._stack.aclose()


def streamed(
    chunks: AsyncIterator[bytes],
    framing: Framing,
    headers: dict[str, str],
    stack: contextlib.AsyncExitStack | None = None,
    done: Callable[[], None] | None = None,
) -> Response:
    """A response that streams `chunks` for as long as they come (no response timeout); `done`
    runs after the last."""
    response = Response(
        StreamBody(chunks, stack or contextlib.AsyncExitStack(), done),
        content_type=framing.content_type,
        headers={**headers, **framing.headers},
    )
    response.timeout = None
    return response
