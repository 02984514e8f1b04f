"""How often one stream is sent a chunk: vLLM's stream interval, set by the load.

Every streamed chunk costs the front end about the same whatever it carries: framed, sent
through quart and hypercorn, written to its socket (http/core/chunked.py), a trio scheduler pass
(bench/throughput.py prints chunks per token beside the front end's CPU per token; at 64 streams
the chunk path was ~60 % of the front end's CPU before chunked.py, ~0.1 ms a chunk). One chunk per
token is what a client wants while the front end keeps up; past `stream_chunks_per_s` chunks a
second in all it does not, and the cores it takes are the engines'. So each stream is held to
one chunk per streams / stream_chunks_per_s seconds (never more than MAX_HOLD_S), and what its
engine produced meanwhile goes out as that one chunk: the front end's cost per token falls as
the load rises. Below that rate nothing waits: a stream's first text and its last are never
held, and a token that comes later than the interval goes at once.

The hold lives in the request's supervisor/engine_client.RequestEvents, which does not wake its
reader for a running text that comes during it; the pacer's one timer task ends the holds,
every stream due within TIMER_SLACK_S in one wake-up. A trio.sleep per held chunk (the earlier
wrapper) cost its cancel scope, its deadline and the Cancelled it raises, and the reader was
woken first by the text that began the hold: at 64 streams the front end's CPU per token fell
0.107 → 0.084 ms (/v1) and 0.098 → 0.074 ms (Ollama) with the timer.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools

import trio

MAX_HOLD_S = 0.05  # 20 updates a second per stream at the most loaded
TIMER_SLACK_S = 0.002  # a hold ends up to this early: one wake-up of the timer serves the streams due together


class Pacer:
    """The front end's one pacer: counts the streams open now, and ends their holds — one
    timer task for them all (engine_client.RequestEvents parks its reader on nothing else), where
    a trio.sleep per held chunk cost its cancel scope's setup, deadline and Cancelled raised."""

    def __init__(self, chunks_per_s: float):
        self.chunks_per_s = chunks_per_s
        self.streams = 0
        self._due: list = []  # (deadline, n, events, wait): a heap
        self._order = itertools.count()
        self._timer: trio.lowlevel.Task | None = None  # parked: nothing is due
        self._sleep: trio.CancelScope | None = None  # the timer's, until the first deadline
        self._started = False
        self.slack = TIMER_SLACK_S

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
        events.pace(self)

    def _leave(self) -> None:
        self.streams -= 1

    def wake_at(self, deadline: float, events, wait: int) -> None:
        """`events.wake(wait)` once `deadline` has passed."""
        heapq.heappush(self._due, (deadline, next(self._order), events, wait))
        if not self._started:
            self._started = True
            trio.lowlevel.spawn_system_task(self._run)
        elif self._timer is not None:
            timer, self._timer = self._timer, None
            trio.lowlevel.reschedule(timer)
        elif self._sleep is not None:
            self._sleep.deadline = min(self._sleep.deadline, deadline)

    async def _run(self) -> None:
        while True:
            if not self._due:
                self._timer = trio.lowlevel.current_task()
                await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.SUCCEEDED)
                continue
            with trio.CancelScope(deadline=self._due[0][0]) as self._sleep:
                await trio.sleep_forever()
            self._sleep = None
            soon = trio.current_time() + TIMER_SLACK_S
            while self._due and self._due[0][0] <= soon:
                _, _, events, wait = heapq.heappop(self._due)
                events.wake(wait)
