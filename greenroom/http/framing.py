"""How streamed answers are framed on the wire: server-sent events (/v1 and the monitoring
stream) and newline-delimited JSON (the Ollama surface). One place for each format."""

from __future__ import annotations

import json

import attrs


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
