"""Server-sent events framing for /v1 streams."""

from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"


def frame(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def error_frame(body: dict) -> bytes:
    """An in-stream failure: an `error` event (the status is already 200), then [DONE]."""
    return b"event: error\n" + frame(body)
