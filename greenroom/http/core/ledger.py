"""The field ledger: every request field is honoured, reported or refused — one
mechanism, driven by the engine's declared capabilities (engines/capabilities.py).

Each endpoint's request Shape (contracts.py) declares the fields it knows, each with its
ledger rule (`contracts.Rule`, written beside the field's type and description). A field is
- used (the default): read and honoured;
- reported (`contracts.reported`): accepted but not read; named in X-miLLM-Ignored-Fields
  (unknown fields too) — one with listed no-op values only when its value asks for something
  (not null, not a no-op: the `ollama` CLI sends an empty `system` and `template` on every
  /api/show);
- refused (`contracts.refused`, or `contracts.needs` a capability) with 400
  field_not_honoured, unless its value means "no change" (an explicit null, or the field's
  listed no-op value) or the engine has the capability that honours it.
Nested objects the request path reads are walked down their declarations (the message,
content part and stream_options Shapes marked `ledger=True`, each key's rule its own; the
response format's by its type), so an unread key is reported with its location, e.g.
"messages[2].name" or "response_format.schema". The surfaces translated onto chat completions
(Responses, Anthropic's Messages) have their top-level fields here; their translations
(responses_api.py, messages_api.py) report the nested keys they do not read, and the typed
request they make goes through `constrained_choice` (its `Output`'s tool fields).
"""

from __future__ import annotations

import json
import logging

from greenroom import structured_fields as sf
from greenroom.engines.capabilities import Capabilities
from greenroom.errors import GreenroomError
from greenroom.http.core import contracts
from greenroom.http.core.contracts import Shape
from greenroom.http.core.headers import IGNORED_FIELDS_HEADER, STRICT_HEADER
from greenroom.http.pipeline import structured

log = logging.getLogger("greenroom.http")

IGNORED_FIELDS_HEADER_MAX_BYTES = 1024


# Images, audio and files, on every surface (chat's content parts, the Responses API's, Anthropic's
# blocks, Ollama's `images`): one code and one reason. The spec's field_not_honoured is "an
# output-changing field this endpoint or engine cannot honour" — not a malformed request.
TEXT_ONLY = "greenroom serves text-only models"
MEDIA_PARTS = frozenset({"image_url", "input_audio", "file", "input_image", "input_file", "image", "document"})


def is_media(kind) -> bool:
    """A content part's `type` names an image, audio or file (any JSON value may arrive there)."""
    return isinstance(kind, str) and kind in MEDIA_PARTS


def media_refused(where: str) -> GreenroomError:
    """The refusal of an image, audio or file at `where` (the content part's location)."""
    return GreenroomError("field_not_honoured", f"'{where}' cannot be honoured: {TEXT_ONLY}", where)


def serves(caps: Capabilities, sent_model, what: str) -> None:
    """Refuse, as Ollama refuses it, a request that `what`s (chat, generate) on a model that
    generates nothing (an embedding model), naming the model as it was sent."""
    if not caps.generation:
        raise GreenroomError("unsupported_capability", f'"{sent_model}" does not support {what}', "model")


def check(shape: Shape, body: dict, caps: Capabilities, where: str, translated: bool = False) -> list[str]:
    """Refuse what cannot be honoured; return the locations of every field not read. Each field's
    rule is its declaration's (`shape`'s); a field it does not declare is reported.
    `translated`: a surface translated onto chat completions — its top-level fields only (its
    translation reports its nested keys; `constrained_choice` checks the request it makes)."""
    ignored: list[str] = []
    for field, value in body.items():
        rule = shape.fields[field].rule if field in shape.fields else None
        if rule is None or (rule.report and not (rule.needs and getattr(caps, rule.needs))):
            if rule is None or not (rule.noop and (value is None or _is_noop(value, rule.noop))):
                ignored.append(field)
            continue
        if (
            rule.refuse
            and value is not None
            and not _is_noop(value, rule.noop)
            and not (rule.needs and getattr(caps, rule.needs))
        ):
            reason = f": {rule.why}" if rule.why else ""
            raise GreenroomError("field_not_honoured", f"'{field}' cannot be honoured {where}{reason}", field)
    if translated:
        return ignored
    constrained_choice(body, caps, where)
    return ignored + _nested(shape, body)


def constrained_choice(body: dict, caps: Capabilities, where: str) -> None:
    """tool_choice "required" or a named function is enforced by constrained decoding: an
    engine with tools but without it (OpenVINO, for now) serves "auto" and "none" only."""
    for field in ("tool_choice", "function_call"):
        choice = body.get(field)
        if (
            choice not in (None, "none", "auto")
            and body.get("tools" if field == "tool_choice" else "functions")
            and caps.tools
            and not caps.response_format
        ):
            raise GreenroomError(
                "field_not_honoured",
                f"'{field}' {json.dumps(choice)[:80]} cannot be honoured "
                f"{where}: a required or named call is enforced by constrained decoding, which "
                'this engine does not have yet; send "auto" or "none"',
                field,
            )


def _is_noop(value, noop: tuple) -> bool:
    # by type too: logprobs 0 asks for scoring, only logprobs false is "no change"
    return any(type(value) is type(n) and value == n for n in noop)


def _nested(shape: Shape, body: dict) -> list[str]:
    out = _unread(shape.fields.get("messages"), body.get("messages"), "messages")
    out += _unread(shape.fields.get("extra_messages"), body.get("extra_messages"), "extra_messages")
    out += structured.unread_in_format(body.get("response_format"), "response_format")
    options = body.get("stream_options")
    if "stream_options" in shape.fields and isinstance(options, dict):
        if body.get("stream") is True:
            out += _unread(shape.fields["stream_options"], options, "stream_options")
        else:  # only a stream reads them
            out.append("stream_options")
    return out


def _unread(field, value, where: str) -> list[str]:
    """The locations under `where` of the keys `field`'s declaration does not read: lists are
    walked item by item, and objects declared `ledger=True` key by key (`Shape.unread`), down
    through the keys they read. Other objects (a tool call's, whose other keys go to the chat
    template) are not walked."""
    item = contracts.element(field)
    if item is not None and isinstance(value, list):
        return [loc for i, v in enumerate(value) for loc in _unread(item, v, f"{where}[{i}]")]
    obj = contracts.shape(field)
    if obj is None or not obj.ledger or not isinstance(value, dict):
        return []
    unread = obj.unread(value)
    out = [f"{where}.{k}" for k in unread]
    for k, v in value.items():
        if k not in unread:
            out += _unread(obj.fields[k], v, f"{where}.{k}")
    return out


def strict_mode(value: str | None) -> bool:
    """X-miLLM-Strict: true/1 → refuse unused fields; false/0/absent → report them."""
    if value is None:
        return False
    v = value.strip().lower()
    if v in ("true", "1"):
        return True
    if v in ("false", "0"):
        return False
    raise GreenroomError(
        "invalid_parameter", f"{STRICT_HEADER} must be true, 1, false or 0, got {value!r}", STRICT_HEADER
    )


def settle(ignored: list[str], strict: bool) -> str | None:
    """Refuse under strict mode, else log once and return the X-miLLM-Ignored-Fields value."""
    if not ignored:
        return None
    if strict:
        raise GreenroomError(
            "unused_fields_refused",
            f"{STRICT_HEADER} is set and these fields would be ignored: " + ", ".join(ignored),
            ignored[0],
        )
    log.warning("request_fields_unused locations=%s", ignored)
    return ignored_fields_header(ignored)


def report_headers(ignored: list[str], strict: bool) -> dict[str, str]:
    """The response headers of a request's unread fields (or its refusal under strict mode)."""
    header = settle(ignored, strict)
    return {IGNORED_FIELDS_HEADER: header} if header else {}


def ignored_fields_header(locations: list[str]) -> str:
    """An RFC 8941 list of strings, at most IGNORED_FIELDS_HEADER_MAX_BYTES; when the
    locations do not fit, as many as fit and a last entry "+N more"."""
    items = [sf.string(loc) for loc in locations]
    whole = ", ".join(items)
    if len(whole) <= IGNORED_FIELDS_HEADER_MAX_BYTES:
        return whole
    for keep in range(len(items) - 1, -1, -1):
        value = ", ".join(items[:keep] + [sf.string(f"+{len(items) - keep} more")])
        if len(value) <= IGNORED_FIELDS_HEADER_MAX_BYTES:
            return value
    raise AssertionError("unreachable: '+N more' alone always fits")
