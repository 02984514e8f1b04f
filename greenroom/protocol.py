"""Every message that crosses a process boundary, in one place.

The front end holds one long-lived stream per engine actor and multiplexes
requests over it by request id (`rid`); the engine actor answers with at most one
`Events` message per decode step, carrying every request that advanced.
Messages travel as plain dicts (tractor encodes with msgpack); `to_wire` and
`from_wire` convert, tagged by `t`.
"""

from __future__ import annotations

from typing import Any

import attrs
import cattrs

from .engines.base import SamplingParams


# front end → engine actor
@attrs.frozen
class Generate:
    rid: str
    model: str
    params: SamplingParams
    prompt: str | None = None  # raw text, no template (/v1/completions)
    messages: list[dict] | None = None  # rendered with the model's chat template


@attrs.frozen
class Cancel:
    rid: str


@attrs.frozen
class StatusQuery:
    rid: str


# engine actor → front end
@attrs.frozen
class Admitted:
    """Validation passed and the prompt is tokenised; a stream may start."""

    rid: str
    prompt_tokens: int


@attrs.frozen
class Text:
    rid: str
    text: str
    completion_tokens: int
    finish_reason: str | None = None


@attrs.frozen
class Failed:
    rid: str
    error: dict  # GreenroomError.to_wire()


@attrs.frozen
class Status:
    rid: str
    status: dict


@attrs.frozen
class Events:
    events: list[Admitted | Text | Failed | Status]


_TAGS: dict[str, type] = {c.__name__: c for c in (Generate, Cancel, StatusQuery, Admitted, Text, Failed, Status)}
_conv = cattrs.Converter()


def to_wire(msg: Any) -> dict:
    if isinstance(msg, Events):
        return {"t": "Events", "events": [to_wire(e) for e in msg.events]}
    d = _conv.unstructure(msg)
    d["t"] = type(msg).__name__
    return d


def from_wire(d: dict) -> Any:
    tag = d["t"]
    if tag == "Events":
        return Events([from_wire(e) for e in d["events"]])
    body = {k: v for k, v in d.items() if k != "t"}
    return _conv.structure(body, _TAGS[tag])
