"""Every request's id: the client's X-Request-ID when it is a sane token, else one made here.
Every response carries it (app.py), and the error envelopes that name a request use it."""

from __future__ import annotations

import re
import secrets

from quart import g, request

from greenroom.http.core.headers import REQUEST_ID_HEADER

_REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def new_rid(prefix: str) -> str:
    """A fresh id: `prefix`, then 24 random hex digits (a fifth of uuid4().hex's cost)."""
    return f"{prefix}-{secrets.token_hex(12)}"


def request_id() -> str:
    """This request's id, made once per request."""
    rid = g.get("greenroom_request_id")
    if rid is None:
        sent = request.headers.get(REQUEST_ID_HEADER)
        rid = sent if sent is not None and _REQUEST_ID_OK.fullmatch(sent) else new_rid("req")
        g.greenroom_request_id = rid
    return rid
