"""The engine actor's outbox: events from both of its threads to the front end's stream,
as `Events` messages.

The worker thread writes its own events to the stream's socket (runtime.ThreadWriter): the
trio loop never wakes for them. Waking it cost the actor a loop turn per message — the
loop thread leaving epoll, taking the GIL from the worker, trio's timer and cancel scope,
the send, the GIL handed back — measured ~0.2 ms of loop CPU a poll beside ~0.08 ms for the
send itself; at one stream of the tiny demo (one message per ~6 tokens) that was 4–7 % of
the engine's own CPU per token, and at 32 streams 5–10 %. Written from the worker, a message
costs what encoding it and one `write` do (bench/throughput.py's figures: docs/architecture.md).

A running stream's tokens are held and sent together: the worker sends what is pending after a
step once `send_interval` has passed since its last message (`flush_due`) — SEND_INTERVAL_S, or
with many streams as long as the front end holds each stream's chunk anyway (its pacing:
streams / stream_chunks_per_s, http/core/pacing.py): each message costs the worker a `write`
that wakes the front end (50–90 µs) and the front end its receipt, whatever it carries, and a
text that came sooner would wait there for the stream's next chunk.
What starts, ends or fails a request is never held: `Failed` and every answer that is not a
stream go at once with everything before them (`put_from_thread`); a stream's first and last
text at the end of the step that made them (a step's 32 finals in one message, not 32); the
`Admitted` of the requests joining a batch together, before their prefill. Everything pending
goes too before the worker waits or starts other work (`flush`): no token waits behind a
prefill, an embedding or an idle wait.

The loop sends only its own answers (`put`: status, a full queue) and whatever the worker
could not write itself — while a trio task holds the socket, or once the stream is closing —
handed over in order: the worker writes directly only when nothing it handed over is still
unsent, so the stream carries the worker's events in the order they were put.

Each message costs the serving tree about 1 ms of CPU whatever it carries (mostly the front
end's chunk), so a longer interval buys a CPU-bound engine more: one tiny-demo stream on 2
cores ran at 0.83 of in-process at 10 ms, 0.86 at 25 and 0.88 at 50 (side by side, with the
loop's polls). 10 ms is kept for a few streams: it holds a token no longer than a reader or a
client measuring inter-token latency would notice; past 20 streams (at the default 2,000 chunks a
second) the front end's pacing holds each stream longer anyway, and the outbox's interval follows.
"""

from __future__ import annotations

import collections
import time

import trio

from greenroom.actors.runtime import ThreadWriter, send_now
from greenroom.protocol import EventBatch, Text, events_wire

SEND_INTERVAL_S = 0.01  # a running stream's tokens wait up to this long (and a decode step)…
MAX_SEND_INTERVAL_S = 0.05  # …or with many streams up to this (the front end's longest hold, pacing.MAX_HOLD_S)


def send_interval(streams: int, chunks_per_s: float) -> float:
    """How long a running stream's tokens may wait, with `streams` running: as long as the front
    end, pacing at `chunks_per_s` (0: not pacing), holds a stream's chunk."""
    paced = streams / chunks_per_s if chunks_per_s > 0 else 0.0
    return min(MAX_SEND_INTERVAL_S, max(SEND_INTERVAL_S, paced))


class Outbox:
    """Made in the trio loop that runs `send`, on the stream it sends to; `chunks_per_s`: the
    front end's pacing (config's stream_chunks_per_s)."""

    def __init__(self, stream, chunks_per_s: float = 0.0):
        self._stream = stream
        self._chunks_per_s = chunks_per_s
        self._writer = ThreadWriter(stream)
        self._token = trio.lowlevel.current_trio_token()
        self._wake = trio.Event()
        self._wake_pending = False
        self._events: collections.deque = collections.deque()  # for the loop to send
        self._sending: list | None = None  # taken off `_events` by the loop, not yet written
        self._pending = EventBatch()  # the worker's, not yet sent
        self._last = 0.0  # when the worker last sent
        self._due = False  # a first or last text is pending

    def put(self, event) -> None:
        """From the loop thread: sent at once."""
        self._events.append(event)
        self._wake.set()

    def put_from_thread(self, event, hold: bool = False) -> None:
        """From the worker thread: sent at once unless it is a stream's last text (running ones
        come by `put_text`), which goes at the end of the step that made it (`flush_due`), or
        `hold` (the caller flushes)."""
        self._pending.add(event)
        if hold:
            return
        if isinstance(event, Text):
            self._due = True
        else:
            self.flush()

    def put_text(
        self, rid: str, index: int, text: str, completion_tokens: int, logprobs: list | None, first: bool
    ) -> None:
        """From the worker: a running text (no ending, nothing on it but its words), as
        `put_from_thread` its Text would be, without the Text (protocol.EventBatch); `first`: the
        choice's first text, which goes at the end of its step even where its first tokens'
        text was held back (an incomplete character, a possible stop string)."""
        self._pending.text(rid, index, text, completion_tokens, logprobs)
        if first:
            self._due = True

    def flush_due(self, streams: int) -> None:
        """From the worker, after each step's texts: what is pending, if it holds a first or
        last text or `send_interval` (with `streams` running) has passed since the last message."""
        if self._pending and (self._due or time.monotonic() - self._last >= send_interval(streams, self._chunks_per_s)):
            self.flush()

    def flush(self) -> None:
        """From the worker: what is pending, now — written by the worker itself unless the
        socket is held or the loop still has some of its events to send; those go to the loop."""
        if not self._pending:
            return
        batch, self._pending, self._due = self._pending.items, EventBatch(), False
        self._last = time.monotonic()
        if self._writer.try_hold():
            if not self._events and self._sending is None:  # nothing handed to the loop is unsent
                self._writer.write(events_wire(batch))
                return
            self._writer.release()
        self._events.extend(batch)  # before `_wake_pending` is read; the sender clears it before it looks
        if not self._wake_pending:
            self._wake_pending = True
            self._token.run_sync_soon(self._wake_sender)

    def _wake_sender(self) -> None:  # runs in the loop thread: the sender's event as it is then
        self._wake.set()

    async def send(self) -> None:
        """The loop's sender: one message per wake-up, carrying everything queued for it."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._wake_pending = False
            if self._events:
                self._sending = batch = []  # set before `_events` empties: the worker sees one
                while self._events:  # one at a time: what the worker appends meanwhile is kept
                    batch.append(self._events.popleft())
                try:
                    await send_now(self._stream, events_wire(batch))
                finally:
                    self._sending = None

    async def close(self) -> None:
        """From the loop, as the stream ends: the worker writes no more."""
        await self._writer.close()
