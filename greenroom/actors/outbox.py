"""The engine actor's outbox: events from both of its threads to the front end's stream,
as `Events` messages.

A wake-up of the trio loop from the worker thread is a write to trio's wake-up socket, and
the loop thread it wakes takes the GIL at once: the worker then waits out the loop's whole
turn. Once per decode step, that cost a third of a step for one stream of the tiny demo
(bench/throughput.py). So a running stream's tokens do not wake the loop: while events keep
coming, the sender polls the queue every SEND_INTERVAL_S on its own timer, its turn then
overlapping the worker's compute (torch and llama.cpp release the GIL), and sends everything
produced since the last message as one. What starts, ends or fails a request — `Admitted`, a
stream's first and last text, `Failed`, every answer that is not a stream — wakes it at once,
as does the first event after a lull; the sender stops polling once IDLE_POLLS polls in a row
found nothing. A process kept to one CPU (cpus.py) stops at the first: there the loop's turn
runs on the worker's core either way, so a poll that finds nothing costs what a wake-up does
(one 100m stream, ~52 ms a token: the loop's CPU 1.6 → 1.1 ms a token).

Each message costs the serving tree about 1.2 ms of CPU whatever it carries (the loop's turn,
the GIL handed to it and back, the front end's chunk), so a longer interval buys a CPU-bound
engine more: one tiny-demo stream on 2 cores ran at 0.83 of in-process at 10 ms, 0.86 at 25
and 0.88 at 50 (side by side). 10 ms is kept: it holds a token no longer than a reader or a
client measuring inter-token latency would notice.
"""

from __future__ import annotations

import collections
import os

import trio

from greenroom.actors.runtime import send_now
from greenroom.protocol import Events, Text, to_wire

SEND_INTERVAL_S = 0.01  # a running stream's tokens wait at most this long: 100 messages/s per actor
IDLE_POLLS = 5  # 50 ms without an event: stop polling until the next wake-up


def _urgent(event) -> bool:
    return not isinstance(event, Text) or event.finish_reason is not None or event.completion_tokens <= 1


class Outbox:
    """Made in the trio loop that runs `send`."""

    def __init__(self):
        self._token = trio.lowlevel.current_trio_token()
        self._wake = trio.Event()
        self._wake_pending = False
        self._polling = False
        self._events: collections.deque = collections.deque()
        self._idle_polls = 1 if len(os.sched_getaffinity(0)) == 1 else IDLE_POLLS

    def put(self, event) -> None:
        """From the loop thread: sent at once."""
        self._events.append(event)
        self._wake.set()

    def put_from_thread(self, event) -> None:
        """From the worker thread. The append comes before the reads of `_polling` and
        `_wake_pending`, and the sender clears each before it looks at the queue: no event is
        left behind without a wake-up or a poll to come."""
        self._events.append(event)
        if (_urgent(event) or not self._polling) and not self._wake_pending:
            self._wake_pending = True
            self._token.run_sync_soon(self._wake_sender)

    def _wake_sender(self) -> None:  # runs in the loop thread: the sender's event as it is then
        self._wake.set()

    async def send(self, stream) -> None:
        """One message per wake-up or poll that finds events, carrying all of them."""
        while True:
            await self._wake.wait()
            self._polling = True
            idle = 0
            while idle < self._idle_polls:
                self._wake = trio.Event()
                self._wake_pending = False
                if self._events:
                    batch = []
                    while self._events:
                        batch.append(self._events.popleft())
                    await send_now(stream, to_wire(Events.merged(batch)))
                    idle = 0
                else:
                    idle += 1
                with trio.move_on_after(SEND_INTERVAL_S):
                    await self._wake.wait()
            self._polling = False
            if self._events:  # appended while `_polling` was still read as set
                self._wake.set()
