"""Keep-alive connections stay usable after a response that left its request body unread.

404, 405, 401, 403 and too-large bodies are answered without the body being read. On HTTP/1.1
the unread body sits in the connection in front of the next request, so h11 lets the
connection start its next cycle only once the server has read the body to its end; otherwise
the connection must be closed. Hypercorn 0.18 (`protocol/h11.py`, `H11Protocol._maybe_recycle`)
does one or the other when the response ends, inside the app's last `send`, with awaits in it:
`_close_stream` hands the app `http.disconnect` (`HTTPStream.handle(StreamClosed)` →
`app_put`), then comes `TCPServer._close` → `send_eof` (body unread) or `idle_task.restart`
(body read). Quart-trio runs that `send` in a nursery whose other task returns on that very
`http.disconnect` and cancels the nursery (`quart_trio/asgi.py`, `handle_messages`). Trio runs
the two woken tasks in random order (it reverses half its batches), so the cancellation lands
at a later checkpoint of `_maybe_recycle`:
- body unread (about half the time): the close is skipped. The socket stays open, h11 sits in
  DONE with no `start_next_cycle` to come, the next request's bytes make `next_event` return
  PAUSED and `_handle_events` waits on `can_read` for ever: the client hangs;
- body read (nearly always: the restart has several checkpoints): the keep-alive idle timer
  is never restarted, so an idle connection is never closed.
The response ends before the body has been parsed only when the body comes after the headers
(httpx and the OpenAI SDK write them separately) and the route answers in between: rare on an
idle server, common while generations keep both processes and the cores busy.

`DrainBody` reads the rest of the body (discarding it) before a response starts while its
body is incomplete (Quart sends the start only once the view has returned, so the body is no
longer wanted), so h11 can recycle the connection; and it shields the response's last `send`,
so hypercorn's bookkeeping runs to its end. A body too big or too slow to drain within the
bounds is not waited for: the response then says `Connection: close`, and hypercorn closes the
connection after sending it. Hypercorn's queue to the app holds ten messages and its reader
waits while it is full; it puts `http.disconnect` there before it closes, so while the last
`send` runs, `_discard` takes what still comes (else a paced body that nobody takes fills the
queue, and neither the close nor the response's end ever comes: the client's write times out).

A streamed body (an upload, `streamed(method, path)`) is paced: Quart's reader appends every
message it receives to one buffer whatever the view has taken of it, so a client faster than
the view's disk would have the whole body in memory. Its exchange receives the next message only
while less than PACE_BYTES of what came is still untaken; the view takes the body through
`Paced`, which says what it took.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

DRAIN_MAX_BYTES = 1 << 20  # an unread remainder past this is not worth keeping the connection for
DRAIN_TIMEOUT_S = 2.0  # a client this slow to send a body nobody reads gets its answer and a close
PACE_BYTES = 1 << 20  # a streamed body's bytes received and not yet taken by its view, at most (+ one message)
_PACE = "greenroom.pace"  # the scope's key of a streamed body's pace


class DrainBody:
    """The ASGI app hypercorn serves: `app` with every HTTP exchange wrapped in an `_Exchange`;
    `streamed(method, path)`: whether the view streams that request's body (paced)."""

    def __init__(self, app, streamed: Callable[[str, str], bool] = lambda method, path: False):
        self.app = app
        self.streamed = streamed

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        exchange = _Exchange(scope, receive, send)
        if self.streamed(scope["method"], scope["path"]):
            exchange.pace = scope[_PACE] = _Pace()
        return await self.app(scope, exchange.receive, exchange.send)


class _Pace:
    """How much of a streamed body came and is not yet taken by its view."""

    def __init__(self):
        self.held = 0
        self._taken = trio.Event()

    async def room(self) -> None:
        while self.held >= PACE_BYTES:
            self._taken = trio.Event()
            await self._taken.wait()

    def took(self, n: int) -> None:
        self.held -= n
        self._taken.set()


class Paced:
    """A request's body, chunk by chunk (Quart's `request.body`), telling the exchange's pace
    what the view took. `scope`: the request's ASGI scope."""

    def __init__(self, scope, body):
        self._pace: _Pace | None = scope.get(_PACE)
        self._body = body

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._body.__anext__()
        if self._pace is not None:
            self._pace.took(len(chunk))
        return chunk


class _Exchange:
    """One request and its response: how much of the body is still to come."""

    def __init__(self, scope, receive, send):
        self._receive = receive
        self._send = send
        self.unread = _content_length(scope)  # None: chunked
        self.complete = False
        self._draining: trio.CancelScope | None = None
        self.pace: _Pace | None = None  # a streamed body's

    async def receive(self):
        if self.pace is not None:
            await self.pace.room()
        message = await self._receive()
        self._note(message)
        return message

    def _note(self, message) -> None:
        if message["type"] == "http.request":
            if self.unread is not None:
                self.unread -= len(message.get("body", b""))
            if self.pace is not None:
                self.pace.held += len(message.get("body", b""))
            if message.get("more_body", False):
                return
        self.complete = True  # the body's last message, or http.disconnect
        if self._draining is not None:  # the app's own reader took the last message
            self._draining.cancel()

    async def send(self, message) -> None:
        if message["type"] == "http.response.start" and not self.complete and not await self._drain():
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            with trio.CancelScope(shield=True):  # hypercorn recycles or closes the connection in here
                if self.complete:
                    return await self._send(message)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._discard)
                    await self._send(message)
                    nursery.cancel_scope.cancel()
                return
        await self._send(message)

    async def _discard(self) -> None:
        """Take what is still coming until hypercorn's `http.disconnect`: its queue to the app
        is bounded and, for a paced body, nobody else takes from it, so a full queue would block
        the `http.disconnect` hypercorn puts before it closes, and the close with it."""
        while not self.complete:
            self._note(await self._receive())

    async def _drain(self) -> bool:
        """Read and discard the rest of the body, within the bounds; whether it all came.
        Quart's own reader may be receiving at the same time: whichever gets the last
        message, `_note` ends the drain."""
        if self.unread is not None and self.unread > DRAIN_MAX_BYTES:
            return False
        budget = DRAIN_MAX_BYTES
        with trio.move_on_after(DRAIN_TIMEOUT_S) as self._draining:
            while not self.complete and budget >= 0:
                message = await self._receive()
                self._note(message)
                budget -= len(message.get("body", b""))
        self._draining = None
        return self.complete


def _content_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            return int(value)  # h11 has validated it
    return None
