"""Parsing /v1 request bodies into engine requests, with typed refusals.

Each check raises GreenroomError naming the offending parameter; nothing a client
sent is silently dropped or half-applied.
"""

from __future__ import annotations

import json
import uuid

from greenroom.engines.base import SamplingParams
from greenroom.errors import GreenroomError
from greenroom.protocol import Generate

ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def parse_json(body: bytes) -> dict:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GreenroomError("invalid_json", f"The request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise GreenroomError("invalid_json", "The request body must be a JSON object")
    return data


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GreenroomError("invalid_parameter", f"'{name}' must be a number", name)
    if not lo <= value <= hi:
        raise GreenroomError("invalid_parameter", f"'{name}' must be between {lo:g} and {hi:g}, got {value}", name)
    return float(value)


def _int(body: dict, name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise GreenroomError("invalid_parameter", f"'{name}' must be an integer", name)
    if not lo <= value <= hi:
        raise GreenroomError("invalid_parameter", f"'{name}' must be between {lo} and {hi}, got {value}", name)
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise GreenroomError("invalid_parameter", "'stop' must be a string or a list of strings", "stop")


def sampling(body: dict) -> SamplingParams:
    max_tokens = _int(body, "max_tokens", 0, 2**31 - 1)
    max_completion = _int(body, "max_completion_tokens", 0, 2**31 - 1)
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise GreenroomError("invalid_parameter", "'max_tokens' and 'max_completion_tokens' were both sent with "
                             "different values; send one of them", "max_completion_tokens")
    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else max_completion,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        stop=_stop(body),
        seed=_int(body, "seed", 0, 2**32 - 1),
    )


def model_name(body: dict) -> str:
    model = body.get("model")
    if model is None:
        raise GreenroomError("missing_parameter", "you must provide a model parameter", "model")
    if not isinstance(model, str) or not model:
        raise GreenroomError("invalid_parameter", "'model' must be a non-empty string", "model")
    return model


def stream_flag(body: dict) -> bool:
    stream = body.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise GreenroomError("invalid_parameter", "'stream' must be a boolean", "stream")
    return stream


def messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise GreenroomError("missing_parameter", "'messages' is a required property", "messages")
    if not isinstance(msgs, list) or not msgs:
        raise GreenroomError("invalid_parameter", "'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise GreenroomError("invalid_parameter", f"'{where}' must be an object", where)
        role = m.get("role")
        if role not in ROLES:
            raise GreenroomError("invalid_parameter", f"'{where}.role' must be one of {', '.join(ROLES)}",
                                 f"{where}.role")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: text only
            parts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise GreenroomError("invalid_parameter", f"'{where}.content[{j}]' must be a text part",
                                         f"{where}.content[{j}]")
                parts.append(part["text"])
            content = "".join(parts)
        elif content is not None and not isinstance(content, str):
            raise GreenroomError("invalid_parameter", f"'{where}.content' must be a string, an array of text "
                                 "parts or null", f"{where}.content")
        out.append({**m, "role": "system" if role == "developer" else role, "content": content})
    return out


def new_rid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def chat_request(body: dict) -> tuple[Generate, bool]:
    model = model_name(body)
    return Generate(new_rid("chatcmpl"), model, sampling(body), messages=messages(body)), stream_flag(body)


def completion_request(body: dict) -> tuple[Generate, bool]:
    model = model_name(body)
    prompt = body.get("prompt")
    if prompt is None:
        raise GreenroomError("missing_parameter", "'prompt' is a required property", "prompt")
    if not isinstance(prompt, str):
        raise GreenroomError("invalid_parameter", "'prompt' must be a string", "prompt")
    return Generate(new_rid("cmpl"), model, sampling(body), prompt=prompt), stream_flag(body)
