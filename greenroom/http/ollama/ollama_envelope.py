"""The Ollama surface's envelope: request ids and the flat error body.

Errors are Ollama's flat envelope, `{"error": "<message> (request id: <id>)", "code"}`, with
greenroom's codes and statuses (errors.py), on the routes whose surface is Ollama's
(routes.py); every response carries X-Request-ID (the
client's, echoed, or one made here). A stream that fails after it started ends with that
envelope as its last line.
"""

from __future__ import annotations

import re
import uuid

from quart import g, request

from greenroom.errors import GreenroomError
from greenroom.http.core.headers import REQUEST_ID_HEADER

_REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def request_id() -> str:
    """This request's id: the client's X-Request-ID when it is a sane token, else a new one."""
    rid = g.get("greenroom_request_id")
    if rid is None:
        sent = request.headers.get(REQUEST_ID_HEADER)
        rid = sent if sent is not None and _REQUEST_ID_OK.fullmatch(sent) else f"req-{uuid.uuid4().hex[:24]}"
        g.greenroom_request_id = rid
    return rid


def error_body(err: GreenroomError, rid: str | None = None) -> dict:
    return {"error": f"{err.message} (request id: {rid or request_id()})", "code": err.code}
