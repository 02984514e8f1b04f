"""How often one stream is sent a chunk: vLLM's stream interval, set by the load.

Every streamed chunk costs the front end about the same whatever it carries: framed, sent
through quart, hypercorn and h11, written to its socket — about a quarter of a millisecond of
CPU on this machine (bench/throughput.py profiles it). One chunk per token is what a client
wants while the front end keeps up; past `stream_chunks_per_s` chunks a second in all it does
not, and the cores it takes are the engines'. So each stream is held to one chunk per
streams / stream_chunks_per_s seconds (never more than MAX_HOLD_S), and what its engine
produced meanwhile goes out as that one chunk: the front end's cost per token falls as the
load rises. Below that rate nothing waits: a stream's first text and its last are never held,
and a token that comes later than the interval goes at once.
"""

from __future__ import annotations

import contextlib

MAX_HOLD_S = 0.05  # 20 updates a second per stream at the most loaded


class Pacer:
    """The front end's one pacer: counts the streams open now."""

    def __init__(self, chunks_per_s: float):
        self.chunks_per_s = chunks_per_s
        self.streams = 0

    def interval(self) -> float:
        """The least time between two chunks of one stream, now."""
        return min(MAX_HOLD_S, self.streams / self.chunks_per_s)

    def pace(self, events, stack: contextlib.AsyncExitStack) -> None:
        """Pace `events` (an engine_client.RequestEvents) while `stack` is open; nothing when
        pacing is off (`stream_chunks_per_s = 0`)."""
        if self.chunks_per_s <= 0:
            return
        self.streams += 1
        stack.callback(self._leave)
        events.pace(self.interval)

    def _leave(self) -> None:
        self.streams -= 1
