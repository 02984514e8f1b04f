"""Which CPU an engine actor that computes on one thread keeps to itself.

An engine actor's two threads take turns at the GIL: the worker computing, the trio loop
answering the front end (a request, status, cancel; the worker sends its own events,
actors/outbox.py). Handed from one core to the other, each turn costs the
worker far more than the loop's own work: on the 2-core VM, a thread that takes the GIL for
0.2 ms every 10 ms slowed a tiny-demo decode in the other thread by 18 % when the two floated,
by 8 % on two fixed cores, and by 3 % on one shared core; through `greenroom serve`, one
stream ran 485 tok/s with the actor's threads on one core against 290–440 floating (when the
loop still sent the events). With the loop asleep through a stream, pinned still measured the
leaner: the engine actor's CPU per token 1.03 and 1.30 × in process floating, at 1 and 32
streams, against 1.00 and 1.12 pinned (side by side, a loaded VM). So an
actor whose engine computes on one thread holding the GIL between short ops (transformers on
one CPU thread: engines/loader.one_gil_thread) is pinned, all its threads, to a CPU of its own
when one is free. Every greenroom server on a machine picks the same (highest) CPU: servers
computing at once share it. The first CPU of the server's own set is never given: the front end runs
there. Left to the kernel's scheduler: an actor computing on more threads (its OpenMP threads would
share its cores with the loop); a llama.cpp actor, whose step is one call without the GIL that
the loop's turns overlap from the other core (pinned, 4 streams of SmolLM2 ran 0.94 of
llama-server against 0.97 floating); an actor of another host; one that finds no CPU free.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


class CpuPool:
    """The CPUs the front end hands out, one actor each."""

    def __init__(self, enabled: bool = True, cpus: Iterable[int] | None = None):
        cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
        self._free = cpus[1:] if enabled else []
        self._held: dict[str, int] = {}

    def take(self, owner: str) -> int | None:
        """A free CPU for `owner` (the highest), or None when none is."""
        if owner in self._held:
            return self._held[owner]
        if not self._free:
            return None
        self._held[owner] = self._free.pop()
        return self._held[owner]

    def give(self, owner: str) -> None:
        cpu = self._held.pop(owner, None)
        if cpu is not None:
            self._free = sorted([*self._free, cpu])

    @property
    def held(self) -> dict[str, int]:
        return dict(self._held)


def pin_process(cpu: int) -> None:
    """Every thread of this process on `cpu`; threads started later inherit it."""
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), {cpu})
        except ProcessLookupError:  # a thread that just ended
            pass
