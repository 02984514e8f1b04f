"""The front end's side of one actor's multiplexed session stream.

One reader task routes every incoming event to its request's `RequestEvents` by `rid`;
any number of request tasks send on the same stream (tractor serialises sends).
"""

from __future__ import annotations

import collections
import math
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import trio

from greenroom.errors import GreenroomError
from greenroom.metrics import TokenClock
from greenroom.protocol import (
    Admitted,
    Cancel,
    Done,
    Embed,
    Embedded,
    Failed,
    FeaturesRead,
    Generate,
    ReadFeatures,
    Score,
    Scores,
    StartDashboards,
    Status,
    StatusQuery,
    Steered,
    SteeringReply,
    Text,
    Tokenize,
    Tokenized,
    from_wire,
    to_wire,
)

CANCEL_SEND_TIMEOUT_S = 1.0


class RequestEvents:
    """The events of one request, ending after a Failed, an Embedded, a Scores, a Tokenized, a
    FeaturesRead, a Done, a Steered, a SteeringReply, or as many finishing Texts (a finish_reason set) as the
    request has choices.

    Paced (`pace`: a streamed answer's, http/core/pacing.Pacer), a running text is handed on no
    sooner than the pacer's interval after the previous hand-out, and what comes meanwhile waits
    here for `ready`: the router does not wake the reader for it, the pacer's timer does at the
    hold's end — one wake-up a chunk, not one a token and one a hold. Anything else (a finishing
    text, a failure, every answer that is not text) ends a hold at once: a stream's first text
    and its last are never held, and a text that comes later than the interval goes as it comes."""

    def __init__(self, choices: int, clock: TokenClock | None = None):
        self._queue: collections.deque = collections.deque()
        self._unfinished = choices
        self._clock = clock  # one choice's token timing is what the metrics observe
        self._pacer = None
        self._handed = -math.inf  # when the previous event was handed on
        self._urgent = 0  # queued events that end a hold
        self._reader: trio.lowlevel.Task | None = None  # parked until an event goes
        self._waits = 0  # the reader's waits so far: a timer set for an earlier one wakes nothing
        self._timed = False  # the pacer's timer is set for this wait
        self.finished = False

    def pace(self, pacer) -> None:
        """Held by `pacer`: `interval()`; `wake_at(deadline, events, wait)`, which calls `wake(wait)`
        up to `slack` seconds before `deadline`, and a hold that close to its end is over."""
        self._pacer = pacer

    def put(self, event) -> None:
        """The router's: queue `event`, and wake the reader if it goes now."""
        self._queue.append(event)
        urgent = type(event) is not Text or event.finish_reason is not None  # it ends a hold
        self._urgent += urgent
        if self._reader is not None:
            if urgent or self._pacer is None:
                self.wake(self._waits)
            elif not self._held():  # a running text later than the interval goes as it comes
                self.wake(self._waits)
            elif not self._timed:  # or when the hold ends
                self._time()

    def wake(self, wait: int) -> None:
        if self._reader is not None and wait == self._waits:
            reader, self._reader = self._reader, None
            trio.lowlevel.reschedule(reader)

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.finished:
            raise StopAsyncIteration
        while not self._queue or self._held():
            self._waits += 1
            self._timed = False
            if self._queue:
                self._time()
            self._reader = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort)
        if self._pacer is not None:
            self._handed = trio.current_time()
        return self._take()

    def _time(self) -> None:
        self._timed = True
        self._pacer.wake_at(self._handed + self._pacer.interval(), self, self._waits)

    def _abort(self, _) -> trio.lowlevel.Abort:
        self._reader = None
        return trio.lowlevel.Abort.SUCCEEDED

    def ready(self) -> list:
        """The events that have already arrived, without waiting: a slow reader sends
        them as one chunk instead of falling further behind."""
        out = []
        while self._queue and not self.finished:
            out.append(self._take())
        return out

    def _held(self) -> bool:
        if self._pacer is None or self._urgent:
            return False
        return self._handed + self._pacer.interval() - self._pacer.slack > trio.current_time()

    def _take(self):
        event = self._queue.popleft()
        if type(event) is Text:
            if self._clock is not None and event.index == 0:
                self._clock.text(event.completion_tokens)
            if event.finish_reason is not None:
                self._urgent -= 1
                self._unfinished -= 1
                if self._unfinished == 0:
                    self.finished = True
            return event
        self._urgent -= 1
        if isinstance(event, ENDINGS) or self._unfinished == 0:
            self.finished = True
        return event


ENDINGS = (Failed, Embedded, Scores, Tokenized, FeaturesRead, Done, Steered, SteeringReply)  # a request's last event


# what a client's request asks of an engine: refused while the actor is unresponsive (lifecycle
# and steering messages wait for it: one may be what keeps it busy, as an SAE's first load
# importing torch holds the steering coordinator's GIL for seconds)
CLIENT_REQUESTS = (Generate, Embed, Score, Tokenize, ReadFeatures, StartDashboards)


class EngineClient:
    def __init__(self, name: str, stream):
        self.name = name
        self._stream = stream
        self._inbox: dict[str, RequestEvents] = {}  # the requests'
        self._status_queries: dict[str, trio.MemorySendChannel] = {}  # not requests: never failed
        self._model_of: dict[str, str] = {}  # rid → model, for the requests in flight
        self._unstarted: set[str] = set()  # Generate rids the engine has not answered yet (no Admitted)
        self._cut: set[str] = set()  # rids ended here, not by the engine: still to cancel there
        self.unresponsive: GreenroomError | None = None  # set while the actor does not answer (`hung`)

    @property
    def in_flight(self) -> int:
        return len(self._inbox)

    def serving(self, model: str) -> bool:
        """Whether a request for `model` is in flight on this actor."""
        return model in self._model_of.values()

    async def run(self) -> None:
        """Route events until the stream ends."""
        inbox, unstarted = self._inbox, self._unstarted
        async for raw in self._stream:
            for event in from_wire(raw).events:
                if unstarted:
                    unstarted.discard(event.rid)
                events = inbox.get(event.rid)
                if events is not None:
                    events.put(event)
                elif (query := self._status_queries.get(event.rid)) is not None:
                    query.send_nowait(event)

    @asynccontextmanager
    async def submit(self, request) -> AsyncIterator[RequestEvents]:
        """Send a request; leaving the block before it finished cancels it in the engine. While
        the actor is unresponsive, a client's request (`CLIENT_REQUESTS`) is refused with its error."""
        events = self._open(request)
        try:
            await self._send(request, events)
            yield events
        finally:
            await self._close(request, events)

    def _open(self, request) -> RequestEvents:
        """`request`'s events, routed to from now on (`_close` ends that)."""
        if self.unresponsive is not None and isinstance(request, CLIENT_REQUESTS):
            raise self.unresponsive
        generate = isinstance(request, Generate)
        events = RequestEvents(request.choices if generate else 1, TokenClock(request.model) if generate else None)
        self._inbox[request.rid] = events
        if isinstance(request, CLIENT_REQUESTS):
            self._model_of[request.rid] = request.model
        if generate:
            self._unstarted.add(request.rid)
        return events

    async def _send(self, request, events: RequestEvents) -> None:
        try:
            await self._stream.send(to_wire(request))
        except OverflowError:  # msgpack carries integers of at most 64 bits
            events.finished = True
            raise GreenroomError(
                "invalid_parameter", "a number in the request is too large: integers must fit in 64 bits"
            ) from None

    async def _close(self, request, events: RequestEvents) -> None:
        """Route no more; cancel the request in the engine unless it finished there."""
        del self._inbox[request.rid]
        self._model_of.pop(request.rid, None)
        self._unstarted.discard(request.rid)
        cut = request.rid in self._cut
        self._cut.discard(request.rid)
        if not events.finished or cut:
            with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_SEND_TIMEOUT_S):
                try:
                    await self._stream.send(to_wire(Cancel(request.rid)))
                except Exception:  # the actor is gone; nothing left to cancel
                    pass

    async def status(self, timeout_s: float = 2.0) -> dict | None:
        rid = f"status-{uuid.uuid4().hex}"
        send, recv = trio.open_memory_channel(math.inf)
        self._status_queries[rid] = send
        try:
            with trio.move_on_after(timeout_s):
                await self._stream.send(to_wire(StatusQuery(rid)))
                reply = await recv.receive()
                return reply.status if isinstance(reply, Status) else None
            return None
        finally:
            del self._status_queries[rid]

    async def cancel_model(self, model: str, error: GreenroomError) -> None:
        """Cancel every request of `model` in flight in the engine and end it with `error`
        (an unload whose grace period ran out). The error is queued before the Cancel goes, so
        it is the request's end whatever the engine sends for it while the Cancel is on its way."""
        for rid, m in list(self._model_of.items()):
            if m == model:
                self._inbox[rid].put(Failed(rid, error.to_wire()))
                await self._stream.send(to_wire(Cancel(rid)))

    def hung(self, error: GreenroomError) -> None:
        """The actor stopped answering: every Generate it has not started ends with `error` (and
        is cancelled there, for when it answers again), and new requests are refused with it
        until `answers`. Requests it has started keep waiting: they resume with it."""
        self.unresponsive = error
        for rid in self._unstarted:
            self._cut.add(rid)
            self._inbox[rid].put(Failed(rid, error.to_wire()))
        self._unstarted.clear()

    def answers(self) -> None:
        """The actor answers again: requests are sent to it again."""
        self.unresponsive = None

    def fail_all(self, error: GreenroomError) -> None:
        """Every request still waiting gets `error` as its last event."""
        for rid, events in list(self._inbox.items()):
            events.put(Failed(rid, error.to_wire()))


async def admit(stack: AsyncExitStack, client: EngineClient, request: Generate) -> tuple[RequestEvents, Admitted]:
    """Submit inside `stack` (closing it cancels the request) and wait for the engine's
    verdict: Admitted, or its refusal raised as the typed error — before any byte of a
    response is sent. `submit`'s steps, without its context manager's generator per request."""
    events = client._open(request)
    stack.push_async_callback(client._close, request, events)
    await client._send(request, events)
    first = await events.__anext__()
    if isinstance(first, Failed):
        raise GreenroomError.from_wire(first.error)
    return events, first
