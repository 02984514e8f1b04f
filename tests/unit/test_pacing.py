"""Stream pacing where it happens (http/core/pacing.py's interval and timer, held in the request's
supervisor/engine_client.RequestEvents), on trio's virtual clock: a running text waits for its
stream's interval and what comes meanwhile joins it; a stream's first text, its last, a failure
and a text later than the interval go at once."""

from __future__ import annotations

import contextlib

import trio
import trio.testing

from greenroom.http.core.pacing import MAX_HOLD_S, Pacer
from greenroom.protocol import Failed, Text
from greenroom.supervisor.engine_client import RequestEvents


def paced_run(arrivals: list[tuple[float, object]], choices: int = 1) -> list[tuple[float, list[str]]]:
    """`arrivals` (time, event) routed into one paced stream (one stream open: the interval is
    MAX_HOLD_S); each hand-out's time and the texts it carried (the first event and `ready`)."""
    out = []

    async def main():
        events = RequestEvents(choices)
        async with contextlib.AsyncExitStack() as stack, trio.open_nursery() as nursery:
            Pacer(chunks_per_s=1).pace(events, stack)

            async def route():
                for at, event in arrivals:
                    await trio.sleep_until(at)
                    events.put(event)

            nursery.start_soon(route)
            async for first in events:
                out.append(
                    (
                        round(trio.current_time(), 3),
                        [e.text if isinstance(e, Text) else "!" for e in [first, *events.ready()]],
                    )
                )

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return out


def text(n: int, finish: str | None = None) -> Text:
    return Text("r", 0, f"t{n}", n, finish)


def test_running_text_waits_for_the_interval_and_joins_one_chunk():
    handed = paced_run([(0.0, text(1)), (0.01, text(2)), (0.02, text(3)), (0.08, text(4, "stop"))])
    assert handed == [(0.0, ["t1"]), (MAX_HOLD_S, ["t2", "t3"]), (0.08, ["t4"])]


def test_the_last_text_a_failure_and_a_late_text_are_never_held():
    handed = paced_run([(0.0, text(1)), (0.2, text(2)), (0.21, text(3)), (0.22, text(4, "stop"))])
    # t2 came after the interval: at once; t3 is held, and the finishing t4 ends the hold
    assert handed == [(0.0, ["t1"]), (0.2, ["t2"]), (0.22, ["t3", "t4"])]
    handed = paced_run([(0.0, text(1)), (0.01, text(2)), (0.02, Failed("r", {"code": "x"}))])
    assert handed == [(0.0, ["t1"]), (0.02, ["t2", "!"])]


def test_streams_held_together_share_the_timer_and_each_goes_at_its_own_hold():
    """Streams held at once (the interval: MAX_HOLD_S), their holds ending at different times:
    each is woken at its own, not another's (a stale timer wakes nothing), and holds ending
    within TIMER_SLACK_S of each other end together."""
    out: dict[str, list] = {"a": [], "b": [], "c": [], "d": []}

    async def main():
        pacer = Pacer(chunks_per_s=1)
        async with contextlib.AsyncExitStack() as stack, trio.open_nursery() as nursery:
            streams = {name: RequestEvents(1) for name in out}
            for events in streams.values():
                pacer.pace(events, stack)

            async def read(name):
                async for first in streams[name]:
                    out[name].append((round(trio.current_time(), 3), [e.text for e in [first, *streams[name].ready()]]))

            for name in out:
                nursery.start_soon(read, name)
            for at, name, event in [
                (0.0, "a", text(1)),
                (0.02, "b", text(1)),
                (0.03, "a", text(2)),
                (0.04, "b", text(2)),
                (0.045, "a", text(3, "stop")),
                (0.1, "b", text(3, "stop")),
                (0.2, "c", text(1)),
                (0.201, "d", text(1)),
                (0.22, "c", text(2)),
                (0.23, "d", text(2)),
                (0.3, "c", text(3, "stop")),
                (0.3, "d", text(3, "stop")),
            ]:
                await trio.sleep_until(at)
                streams[name].put(event)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert out == {
        "a": [(0.0, ["t1"]), (0.045, ["t2", "t3"])],
        "b": [(0.02, ["t1"]), (0.07, ["t2"]), (0.1, ["t3"])],
        # holds ending within TIMER_SLACK_S of each other: one wake-up of the timer ends both
        "c": [(0.2, ["t1"]), (0.25, ["t2"]), (0.3, ["t3"])],
        "d": [(0.201, ["t1"]), (0.25, ["t2"]), (0.3, ["t3"])],
    }
