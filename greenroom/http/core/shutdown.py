"""A requested shutdown (SIGTERM, SIGINT) as the front end lives it, draining as uvicorn and vLLM
do. From the signal on, a new request is answered 503 `server_shutting_down` (with `Connection:
close`) while the requests already running go on, for at most the graceful timeout
(`graceful_shutdown_timeout_s`). What is still running then ends with that same typed error in
its surface's form: a request not answering yet gets it as its response (its view is cancelled,
its engine request with it), an open stream as its last event — serve.py ends every engine
request with it (`Failed`), which each surface writes as its failure after a stream has started:
OpenAI's `error` event and [DONE], Anthropic's `error` event, the Responses API's `error` and
`response.failed`, Ollama's error line. Only then are the listeners closed, so hypercorn's own
cut (its graceful_timeout) finds nothing left to cut.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import trio

from greenroom.errors import GreenroomError

log = logging.getLogger("greenroom.http")

ENDING_S = 2.0  # for the last events to be written once the drain's end has ended their requests


class Shutdown:
    def __init__(self) -> None:
        self.draining = False  # a signal came: new requests are refused
        self.ended = False  # the drain is over: what still runs is ended
        self.closed = trio.Event()  # everything is answered: hypercorn may close (its shutdown_trigger)
        self._open = 0  # HTTP exchanges in flight, a stream's until its last byte
        self._idle = trio.Event()
        self._idle.set()
        self._views: set[trio.CancelScope] = set()  # of the views not returned yet
        self._waiting: trio.CancelScope | None = None  # the drain's wait: `hurry` ends it

    def counted(self, app):
        """`app` (ASGI) with its HTTP exchanges counted: the drain waits for them."""

        async def counting(scope, receive, send):
            if scope["type"] != "http":
                return await app(scope, receive, send)
            self._open += 1
            if self._idle.is_set():
                self._idle = trio.Event()
            try:
                return await app(scope, receive, send)
            finally:
                self._open -= 1
                if not self._open:
                    self._idle.set()

        return counting

    def refuse(self) -> None:
        """503 server_shutting_down for a request that comes once the drain has begun."""
        if self.draining:
            raise self._refused()

    def ending(self, view):
        """`view`, cancelled when the drain ends before it has returned: 503 server_shutting_down."""

        @functools.wraps(view)
        async def ended_on_shutdown(*args, **kwargs):
            with trio.CancelScope() as scope:
                if self.ended:
                    scope.cancel()
                self._views.add(scope)
                try:
                    return await view(*args, **kwargs)
                finally:
                    self._views.discard(scope)
            raise self._cut()

        return ended_on_shutdown

    async def drain(
        self, timeout_s: float, begun: Callable[[GreenroomError], None], end: Callable[[GreenroomError], None]
    ) -> None:
        """Refuse new requests (`begun` ends, with the refusal, what is no work to wait for: the
        monitoring subscriptions), wait up to `timeout_s` for the running ones, end the rest
        (`end`: the engine requests, with the error), wait for their last bytes, then set `closed`."""
        self.draining = True
        begun(self._refused())
        with trio.move_on_after(timeout_s) as self._waiting:
            await self._quiet()
        self.ended = True
        if self._open:
            log.info("drain over: the %d request(s) still running end with server_shutting_down", self._open)
        for scope in self._views:
            scope.cancel()
        end(self._cut())
        with trio.move_on_after(ENDING_S):
            await self._quiet()
        self.closed.set()

    def hurry(self) -> None:
        """End the drain's wait now (a second signal)."""
        if self._waiting is not None:
            self._waiting.cancel()

    async def _quiet(self) -> None:
        while self._open:
            await self._idle.wait()

    @staticmethod
    def _refused() -> GreenroomError:
        return GreenroomError("server_shutting_down", "the server is shutting down: it takes no new requests")

    @staticmethod
    def _cut() -> GreenroomError:
        return GreenroomError("server_shutting_down", "the server shut down before the request finished")
