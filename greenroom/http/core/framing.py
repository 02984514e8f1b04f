"""How streamed answers are framed on the wire: server-sent events (/v1 and the monitoring
stream) and newline-delimited JSON (the Ollama surface), and the streamed response that
carries them. One place for each format."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

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
    `aclose` when the client goes away, even before the first chunk."""

    def __init__(self, chunks, stack: contextlib.AsyncExitStack):
        self._chunks = chunks
        self._stack = stack

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        return await self._chunks.__anext__()

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
) -> Response:
    """A response that streams `chunks` for as long as they come (no response timeout)."""
    response = Response(
        StreamBody(chunks, stack or contextlib.AsyncExitStack()),
        content_type=framing.content_type,
        headers={**headers, **framing.headers},
    )
    response.timeout = None
    return response
