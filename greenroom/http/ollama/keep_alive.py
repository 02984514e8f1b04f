"""Ollama's `keep_alive`: how long a model stays loaded after a request.

Ollama reads it as a Go `time.Duration`: a number is seconds, a string a Go duration
("5m", "1h30m", "0"), a negative value means "forever" (Ollama stores math.MaxInt64 ns).
A Go duration holds at most MaxInt64 nanoseconds (~292 years); Ollama refuses a longer
string ("invalid duration") and wraps a longer number silently. greenroom refuses both
with a 400 naming `keep_alive`, so every stored deadline is one a later read can render.
"""

from __future__ import annotations

import math
import re

from greenroom.errors import GreenroomError

# the longest Go duration, in seconds: what Ollama shows for "forever"
MAX_SECONDS = (2**63 - 1) / 1e9

_DURATION = re.compile(r"-?(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))*")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_WHAT = (
    '\'keep_alive\' must be a duration such as "5m", "-1" or "0", or a number of seconds, '
    f"at most {MAX_SECONDS:.0f} s (Go's longest duration, ~292 years); a negative value keeps the model "
    "loaded for good"
)


def parse(body: dict) -> float | None:
    """`keep_alive` in seconds: None when not sent; negative keeps the model loaded; 0
    unloads it after the request. Anything else, or longer than MAX_SECONDS, is a 400."""
    value = body.get("keep_alive")
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and _DURATION.fullmatch(value.strip()):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        parts = _PART.findall(text.lstrip("-"))
        seconds = sign * (sum(float(n) * _UNIT_S[u] for n, u in parts) if parts else float(text.lstrip("-")))
    else:
        raise GreenroomError("invalid_parameter", _WHAT, "keep_alive")
    if not math.isfinite(seconds) or seconds > MAX_SECONDS:
        raise GreenroomError("invalid_parameter", _WHAT, "keep_alive")
    return seconds
