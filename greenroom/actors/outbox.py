"""The engine actor's outbox: events from both of its threads to the front end's stream,
as `Events` messages.

A wake-up of the trio loop from the worker thread is a write to trio's wake-up socket, and
the loop thread it wakes takes the GIL at once: the worker then waits for the loop's whole
turn, once per decode step — a third of the step's time for one stream of the tiny demo
(bench/throughput.py). So the worker wakes the loop only for the first event after a lull;
while events keep coming the sender polls the queue every SEND_INTERVAL_S on its own timer,
which lets its turn overlap the worker's compute (torch and llama.cpp release the GIL), and
goes back to sleep once IDLE_POLLS polls in a row found nothing. Each message carries
everything produced since the last one: a fast engine's steps are coalesced.
"""

from __future__ import annotations

import collections

import trio

from greenroom.protocol import Events, to_wire

SEND_INTERVAL_S = 0.002  # ≤ 500 messages/s per actor, and an event waits at most this long
IDLE_POLLS = 25  # 50 ms without an event: stop polling until the next wake-up


class Outbox:
    """Made in the trio loop that runs `send`."""

    def __init__(self):
        self._token = trio.lowlevel.current_trio_token()
        self._wake = trio.Event()
        self._wake_pending = False
        self._polling = False
        self._events: collections.deque = collections.deque()

    def put(self, event) -> None:
        """From the loop thread."""
        self._events.append(event)
        self._wake.set()

    def put_from_thread(self, event) -> None:
        """From the worker thread. The append comes before the read of `_polling`, and the
        sender clears `_polling` before it looks at the queue a last time: no event is left
        behind without a wake-up."""
        self._events.append(event)
        if not self._polling and not self._wake_pending:
            self._wake_pending = True
            self._token.run_sync_soon(self._wake_sender)

    def _wake_sender(self) -> None:  # runs in the loop thread: the sender's event as it is then
        self._wake.set()

    async def send(self, stream) -> None:
        """One message at once for the first event after a lull, then one per poll that
        finds events, until IDLE_POLLS polls find none."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._polling = True
            self._wake_pending = False
            idle = 0
            while idle < IDLE_POLLS:
                if self._events:
                    batch = []
                    while self._events:
                        batch.append(self._events.popleft())
                    await stream.send(to_wire(Events(batch)))
                    idle = 0
                else:
                    idle += 1
                await trio.sleep(SEND_INTERVAL_S)
            self._polling = False
            if self._events:  # appended while `_polling` was still read as set
                self._wake.set()
