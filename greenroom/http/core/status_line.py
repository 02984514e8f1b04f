"""HTTP/1.1 status lines with their reason phrase: `HTTP/1.1 400 Bad Request`.

ASGI carries a status code only, and hypercorn 0.18 hands h11 a `Response` without a reason, so
every status line went out as `HTTP/1.1 400 ` — clients that print the status line print a
blank where the phrase belongs: Go's net/http keeps it as `resp.Status` ("400 "), and the
`ollama` CLI shows a streamed request's failure as `Error: <Status>: <message>`. `install()`
gives every HTTP/1.1 response hypercorn writes the standard phrase of its code (RFC 9110, as
Python's `http.HTTPStatus` names them); a code without one keeps an empty phrase. HTTP/2 has
no reason phrase.
"""

from __future__ import annotations

import dataclasses
import http
import logging

import h11
from hypercorn.protocol.h11 import H11Protocol

_PHRASES = {s.value: s.phrase.encode("ascii") for s in http.HTTPStatus}


def with_phrase(event):
    """An h11 response event with its code's reason phrase, when it has none."""
    if isinstance(event, (h11.Response, h11.InformationalResponse)) and not event.reason:
        phrase = _PHRASES.get(event.status_code)
        if phrase:
            return dataclasses.replace(event, reason=phrase)
    return event


def install() -> None:
    """Wrap hypercorn's one door to h11 for a response (`H11Protocol._send_h11_event`) once.
    A hypercorn without that private door serves as it is (phrases are cosmetic), and says so."""
    send = getattr(H11Protocol, "_send_h11_event", None)
    if send is None:
        logging.getLogger("greenroom.http").warning(
            "this hypercorn has no _send_h11_event: status lines go without reason phrases"
        )
        return
    if getattr(send, "with_phrases", False):
        return

    async def send_with_phrase(self, event) -> None:
        await send(self, with_phrase(event))

    send_with_phrase.with_phrases = True
    H11Protocol._send_h11_event = send_with_phrase
