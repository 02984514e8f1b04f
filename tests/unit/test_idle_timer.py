"""Hypercorn's keep-alive idle timer as greenroom runs it (http/core/idle_timer.py), on trio's
virtual clock: one timer at a time, a restart ends the running one, a stop ends it — also when it
comes before the restarted timer's task has run (a request that follows a response at once)."""

from __future__ import annotations

import trio
import trio.testing
from hypercorn.trio import tcp_server
from hypercorn.trio.task_group import TaskGroup

from greenroom.http.core import idle_timer
from greenroom.http.core.idle_timer import IdleTask

TIMEOUT_S = 5.0


def timeline(steps) -> list[tuple[float, str]]:
    """`steps(task, task_group, timer)` run against an IdleTask whose action is hypercorn's own
    shape (wait out the timeout, then close): when each timer started and closed."""
    out: list[tuple[float, str]] = []

    async def timer() -> None:
        out.append((trio.current_time(), "started"))
        await trio.sleep(TIMEOUT_S)
        with trio.CancelScope(shield=True):
            out.append((trio.current_time(), "closed"))

    async def main():
        async with TaskGroup() as task_group:
            await steps(IdleTask(), task_group, timer)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return out


def test_a_timer_left_alone_closes_after_its_timeout():
    async def steps(task, task_group, timer):
        await task.restart(task_group, timer)

    assert timeline(steps) == [(0, "started"), (TIMEOUT_S, "closed")]


def test_a_restart_ends_the_running_timer():
    async def steps(task, task_group, timer):
        await task.restart(task_group, timer)
        await trio.sleep(3)
        await task.restart(task_group, timer)

    assert timeline(steps) == [(0, "started"), (3, "started"), (3 + TIMEOUT_S, "closed")]


def test_a_stop_ends_it_even_before_its_task_has_run():
    async def steps(task, task_group, timer):
        await task.restart(task_group, timer)
        await task.stop()  # no checkpoint between: the timer's task has not started
        await trio.sleep(2 * TIMEOUT_S)
        await task.restart(task_group, timer)
        await trio.sleep(1)
        await task.stop()

    # the first runs to its first checkpoint, cancelled there (as under hypercorn's own timer); none closes
    assert timeline(steps) == [(0, "started"), (2 * TIMEOUT_S, "started")]


def test_install_replaces_hypercorns_timer():
    before = tcp_server.TrioSingleTask
    try:
        idle_timer.install()
        assert tcp_server.TrioSingleTask is IdleTask
    finally:
        tcp_server.TrioSingleTask = before
