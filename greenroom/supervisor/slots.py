"""An actor slot: one actor's process and session as supervision keeps them
(supervision.py writes them), and the wait for its client that the lifecycle and the
steering relay share."""

from __future__ import annotations

import enum

import attrs
import trio

from greenroom.errors import GreenroomError
from greenroom.supervisor.engine_client import EngineClient


class SlotState(enum.StrEnum):
    """An actor's state as /api/actors and `greenroom ps` show it (the values are the wire's)."""

    STARTING = "starting"
    READY = "ready"
    # up, but its status went unanswered for UNRESPONSIVE_AFTER_S (frozen, stopped): requests it
    # has not started end with 504 request_timeout, new ones are refused so; ready at its next answer
    UNRESPONSIVE = "unresponsive"
    RESTARTING = "restarting"
    FAILED = "failed"  # restarted too often: left down, its last error kept
    STOPPED = "stopped"  # an on-demand actor while its model is not loaded
    OFFLINE = "offline"  # its worker host is not connected: back when the host joins again


DOWN = (SlotState.FAILED, SlotState.OFFLINE)  # no client to wait for: refused at once


class StartFailed(Exception):
    """An on-demand actor did not come up: its load failed, or it did not start in time (the reason)."""


@attrs.define(eq=False)
class ActorSlot:
    name: str
    role: str  # "engine" | "steering"
    host: str | None = None  # the worker host it runs on (supervisor/workers.py); None: this one
    state: SlotState = SlotState.STARTING
    pid: int | None = None
    restarts: int = 0
    last_error: str | None = None
    client: EngineClient | None = None
    ready: trio.Event = attrs.Factory(trio.Event)  # the current life's: set once it is up (or given up)
    unloading: int = 0  # unloads running: every request for this actor is refused (or waits) meanwhile
    unloaded: trio.Event = attrs.Factory(trio.Event)  # set each time `unloading` falls back to 0
    # one actor per GGUF model: spawned to load it, stopped once it is unloaded
    on_demand: bool = False
    scope: trio.CancelScope | None = None  # cancels its supervising task (on-demand slots)
    stopped: trio.Event = attrs.Factory(trio.Event)  # set when that task has ended

    @classmethod
    def on_demand_slot(cls, name: str, host: str | None = None) -> ActorSlot:
        """A GGUF model's actor before its first start: stopped as after a life, `ready` and
        `stopped` set — a request that finds its first start under way waits for that start's
        `ready`, not for one nobody sets."""
        slot = cls(name, "engine", host=host, state=SlotState.STOPPED, on_demand=True)
        slot.ready.set()
        slot.stopped.set()
        return slot

    async def wait_client(self, model: str, timeout_s: float) -> EngineClient:
        """The actor's client, waiting up to `timeout_s` while it (re)starts; else 503
        model_not_loaded with the actor's state and last error (`model`: the one asked for)."""
        with trio.move_on_after(timeout_s):
            while self.client is None and self.state not in DOWN:
                await self.ready.wait()
                if self.client is None and self.state not in DOWN:
                    await trio.sleep(0.05)  # ready was set by a previous life; wait for the next
        if self.client is None and self.state == SlotState.OFFLINE:
            raise GreenroomError(
                "model_not_loaded",
                f"model {model!r} is not available: its engine actor {self.name!r} is on worker host "
                f"{self.host!r}, which is not serving it ({self.last_error or 'it has not joined'})",
                "model",
            )
        if self.client is None:
            raise GreenroomError(
                "model_not_loaded",
                f"model {model!r} is not loaded: its engine actor "
                f"{self.name!r} is {self.state} ({self.last_error or 'not ready'})",
                "model",
            )
        return self.client
