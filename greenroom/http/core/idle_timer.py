"""Hypercorn's keep-alive idle timer, without a lock and a `nursery.start` twice per request.

Hypercorn 0.18 (trio) times each connection's idle spells with a `TrioSingleTask`: a request's
start stops the timer and its response's end restarts it, each under a lock, and each restart
starts the idle-timeout task through `nursery.start` (a nursery of its own, and a wait for the
task to say it started). `IdleTask` keeps the contract — one action at a time, `restart` ends the
running one and starts it anew, `stop` ends it — with the action's cancel scope made before its
task starts (a scope cancelled before it is entered cancels what runs in it at its first
checkpoint): nothing in it waits, so it needs no lock, and `start_soon` does.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio
from hypercorn.trio import tcp_server


class IdleTask:
    """hypercorn's `SingleTask` (`hypercorn.typing`): one task, restarted or stopped."""

    def __init__(self) -> None:
        self._scope: trio.CancelScope | None = None

    async def restart(self, task_group, action: Callable[[], Awaitable[None]]) -> None:
        if self._scope is not None:
            self._scope.cancel()
        self._scope = trio.CancelScope()
        task_group._nursery.start_soon(_run, self._scope, action)

    async def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None


async def _run(scope: trio.CancelScope, action: Callable[[], Awaitable[None]]) -> None:
    with scope:
        await action()


def install() -> None:
    """Hypercorn's trio connections (`TCPServer`) time their idle spells with `IdleTask`. A
    hypercorn whose connections make theirs otherwise serves as it is, and says so."""
    if getattr(tcp_server, "TrioSingleTask", None) is None:
        logging.getLogger("greenroom.http").warning("this hypercorn's connections have no TrioSingleTask to replace")
        return
    tcp_server.TrioSingleTask = IdleTask
