"""The engine actor's outbox: events from both of its threads to the front end's stream,
as `Events` messages.

The worker thread queues its events and wakes the trio loop only when no wake-up is pending
(every hand-off of the GIL to the loop thread delays the decode step); the sender sends at
most one message per SEND_INTERVAL_S, carrying everything produced since the last one.
"""

from __future__ import annotations

import collections
import math

import trio

from greenroom.protocol import Events, to_wire

SEND_INTERVAL_S = 0.002  # ≤ 500 messages/s per actor; below that rate nothing waits


class Outbox:
    """Made in the trio loop that runs `send`."""

    def __init__(self):
        self._token = trio.lowlevel.current_trio_token()
        self._wake = trio.Event()
        self._wake_pending = False
        self._events: collections.deque = collections.deque()

    def put(self, event) -> None:
        """From the loop thread."""
        self._events.append(event)
        self._wake.set()

    def put_from_thread(self, event) -> None:
        """From the worker thread."""
        self._events.append(event)
        if not self._wake_pending:
            self._wake_pending = True
            self._token.run_sync_soon(self._wake_sender)

    def _wake_sender(self) -> None:  # runs in the loop thread: the sender's event as it is then
        self._wake.set()

    async def send(self, stream) -> None:
        """One message per wake-up carrying everything produced since the last one, and
        at most one per SEND_INTERVAL_S: a fast engine's steps are coalesced instead of
        each paying the trip, while the first event after a lull goes at once."""
        last = -math.inf
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            wait = last + SEND_INTERVAL_S - trio.current_time()
            if wait > 0:
                await trio.sleep(wait)
            self._wake_pending = False
            batch = []
            while self._events:
                batch.append(self._events.popleft())
            if batch:
                await stream.send(to_wire(Events(batch)))
                last = trio.current_time()
