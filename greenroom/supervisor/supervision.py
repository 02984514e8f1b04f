"""Supervision: one task per actor slot, which spawns the actor's process, opens its session
stream, watches the process, and on death fails the slot's in-flight requests with a typed
error and restarts it — at most `restart_limit` times within `restart_window_s`, with
exponential backoff. What an engine actor holds as it starts is the lifecycle's to say and
to record (`Lifecycle.preloads`, `started`, `stopped`)."""

from __future__ import annotations

import collections
import logging
import signal
import socket
import time
from collections.abc import Awaitable, Callable

import psutil
import trio

from greenroom import metrics
from greenroom.actors import runtime
from greenroom.actors.engine_actor import engine_session
from greenroom.actors.steering_actor import steering_session
from greenroom.config import Config
from greenroom.cpus import CpuPool
from greenroom.engines.base import ModelInfo
from greenroom.engines.loader import one_gil_thread
from greenroom.errors import GreenroomError
from greenroom.supervisor.engine_client import EngineClient
from greenroom.supervisor.lifecycle import Lifecycle
from greenroom.supervisor.placements import LoadState, ModelState, device_of
from greenroom.supervisor.slots import ActorSlot, SlotState, StartFailed
from greenroom.supervisor.workers import RemoteChild, WorkerHosts

log = logging.getLogger("greenroom.supervisor")

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 10.0
HEARTBEAT_S = 2.0  # how often a running actor is asked its status
UNRESPONSIVE_AFTER_S = 5.0  # an actor whose status has not come back by then is unresponsive
_ROOT_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # what stops `greenroom serve`
SHUTDOWN_GRACE_S = 1.0


class Supervisor:
    """Supervises `slots` (an on-demand slot only between `start` and `stop`); `after_start(m)`
    runs for each model an engine actor holds once it is up (the steering relay's push)."""

    def __init__(
        self,
        config: Config,
        slots: dict[str, ActorSlot],
        lifecycle: Lifecycle,
        after_start: Callable[[ModelState], Awaitable[None]],
        workers: WorkerHosts | None = None,
    ):
        self.config = config
        self.workers = workers  # where actors of other hosts are spawned (slot.host set)
        self.slots = slots
        self.lifecycle = lifecycle
        self._after_start = after_start
        self._nursery: trio.Nursery | None = None  # every supervising task's
        self.cpus = CpuPool(config.pin_cpus)  # this host's engine actors' own CPUs (cpus.py)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Supervise every slot but the on-demand ones until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for slot in self.slots.values():
                if not slot.on_demand:
                    nursery.start_soon(self._supervise, slot)
            task_status.started()
            await trio.sleep_forever()  # on-demand actors start here later

    def adopt(self, slot: ActorSlot) -> None:
        """Supervise a slot added after the start (a worker host's actor)."""
        self._nursery.start_soon(self._supervise, slot)

    async def start(self, slot: ActorSlot) -> None:
        """Start an on-demand actor, which loads its model as it starts (its session's first
        answer); return once it is up. A load that fails stops the actor: StartFailed; one
        whose worker host is not connected: 503 model_not_loaded naming the host."""
        await slot.stopped.wait()  # a previous life is still shutting down
        if slot.host is not None and not self.workers.host(slot.host).connected:
            raise self._offline_error(slot)
        slot.state, slot.ready, slot.last_error = SlotState.STARTING, trio.Event(), None
        self._nursery.start_soon(self._supervise, slot)
        with trio.move_on_after(self.config.ready_timeout_s):
            await slot.ready.wait()
        if slot.state != SlotState.READY:
            if slot.scope is not None:
                slot.scope.cancel()
            raise StartFailed(slot.last_error or "its actor did not start in time")

    async def stop(self, slot: ActorSlot) -> None:
        """Stop an on-demand actor; return once its supervising task has ended."""
        slot.scope.cancel()
        await slot.stopped.wait()

    async def _supervise(self, slot: ActorSlot) -> None:
        slot.stopped = trio.Event()
        try:
            with trio.CancelScope() as slot.scope:
                await self._supervise_loop(slot)
        finally:
            slot.scope, slot.client, slot.pid = None, None, None
            self.cpus.give(slot.name)
            if slot.on_demand:
                slot.state = self.resting(slot)
                self.lifecycle.stopped(slot)
            slot.ready.set()  # waiters see the stopped state instead of hanging
            slot.stopped.set()

    def _own_cpu(self, slot: ActorSlot, specs: list[dict]) -> int | None:
        """A CPU of its own for a local actor that starts with models computing on one thread
        that holds the GIL (cpus.py); held until the actor stops."""
        if slot.host is None and specs and all(map(one_gil_thread, specs)):
            return self.cpus.take(slot.name)
        return None

    def resting(self, slot: ActorSlot) -> SlotState:
        """An on-demand actor's state while it is not running: stopped, or offline while its
        worker host is not connected (routing skips it then)."""
        gone = slot.host is not None and not self.workers.host(slot.host).connected
        return SlotState.OFFLINE if gone else SlotState.STOPPED

    def _offline_error(self, slot: ActorSlot) -> GreenroomError:
        host = self.workers.host(slot.host)
        return GreenroomError(
            "model_not_loaded",
            f"engine actor {slot.name!r} is on worker host {host.name!r}, which is not connected "
            f"({host.lost_reason or 'it has not joined'})",
            "model",
        )

    async def _host_up(self, slot: ActorSlot) -> bool:
        """Wait while a worker host's actor has no host (or one that does not offer it):
        `offline`, 503 naming the host, until it joins offering it. False for an on-demand
        actor, whose life ends with its host."""
        host = self.workers.host(slot.host)
        actor = slot.name.split("/", 1)[1]
        while not (host.connected and (slot.on_demand or actor in host.actors)):
            if slot.on_demand:
                slot.last_error = (
                    f"worker host {host.name!r} is not connected ({host.lost_reason or 'it never joined'})"
                )
                return False
            slot.state, slot.client, slot.pid = SlotState.OFFLINE, None, None
            slot.last_error = (
                f"it joined offering only {', '.join(host.actors)}"
                if host.connected
                else host.lost_reason or "it has not joined"
            )
            self.lifecycle.stopped(slot)  # its models went with it
            slot.ready.set()  # waiters see the offline state at once
            await (host.left if host.connected else host.joined).wait()
        if slot.state == SlotState.OFFLINE:
            slot.state, slot.ready = SlotState.STARTING, trio.Event()
        return True

    async def _supervise_loop(self, slot: ActorSlot) -> None:
        failures: collections.deque[float] = collections.deque()
        while True:
            if slot.host is not None and not await self._host_up(slot):
                return
            try:
                await self._run_once(slot)
                reason = "its session ended"
            except* Exception as group:  # with a shutdown's Cancelled beside them, that goes on up quietly
                reason = "; ".join(f"{type(exc).__name__}: {exc}" for exc in group.exceptions)
            slot.last_error = reason
            slot.pid = None
            metrics.ACTOR_EVENTS.labels(slot.name, "stopped").inc()
            if slot.host is not None and not self.workers.host(slot.host).connected:
                log.warning("actor %s stopped with its worker host: %s", slot.name, reason)
                continue  # the host is gone, not the actor: no restart counted, wait for it
            if slot.on_demand and slot.state == SlotState.STARTING:
                log.error("actor %s could not load its model: %s", slot.name, reason)
                return  # a load that failed is the request's error, not a restart loop
            now = time.monotonic()
            failures.append(now)
            while failures and now - failures[0] > self.config.restart_window_s:
                failures.popleft()
            if len(failures) > self.config.restart_limit:
                log.error(
                    "actor %s failed %d times in %.0f s, giving up: %s",
                    slot.name,
                    len(failures),
                    self.config.restart_window_s,
                    reason,
                )
                slot.state = SlotState.FAILED
                slot.ready.set()  # waiters see the failed state instead of hanging
                metrics.ACTOR_EVENTS.labels(slot.name, "failed").inc()
                return
            delay = min(BACKOFF_BASE_S * 2 ** (len(failures) - 1), BACKOFF_MAX_S)
            log.warning("actor %s stopped (%s); restarting in %.1f s", slot.name, reason, delay)
            slot.state, slot.ready = SlotState.RESTARTING, trio.Event()  # `ready` is the current life's
            slot.restarts += 1
            await trio.sleep(delay)

    async def _run_once(self, slot: ActorSlot) -> None:
        if slot.role == "engine":
            fn = engine_session
            specs = [p.to_spec() for p in self.lifecycle.preloads(slot)]
            kwargs = {
                "models": specs,
                "device": specs[0]["device"] if slot.on_demand else device_of(slot.name),
                "max_queue": self.config.max_queue,
                "default_max_tokens": self.config.default_max_tokens,
                "continuous_batching": self.config.continuous_batching,
                "cpu": self._own_cpu(slot, specs),
                "chunks_per_s": self.config.stream_chunks_per_s,  # how long its outbox may hold a text
            }
        else:  # the steering coordinator
            fn, kwargs = (
                steering_session,
                {
                    "cache_dir": self.config.cache_dir,
                    "limits": {
                        "cluster_min": self.config.cluster_intensity_min,
                        "circuit_min": self.config.circuit_intensity_min,
                        "max": self.config.intensity_max,
                    },
                },
            )
        module = fn.__module__
        spawner = (
            runtime.spawn(slot.name, module, loglevel=runtime.tractor_loglevel(self.config.log_level))
            if slot.host is None
            else self.workers.spawn(slot.name, slot.host, module)
        )
        async with spawner as child:
            slot.pid = child.pid
            log.info("actor %s started, pid %d", slot.name, child.pid)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, slot, child)
                async with runtime.open_session(child, fn, parent_pid=child.parent_pid, **kwargs) as (first, stream):
                    if not first["ok"]:
                        raise RuntimeError(f"load failed: {first['error']}")
                    slot.client = EngineClient(slot.name, stream)
                    # a (re)started actor holds its preloaded models only
                    held = self.lifecycle.started(slot, {info["id"]: ModelInfo(**info) for info in first["models"]})
                    slot.state = SlotState.READY
                    slot.ready.set()
                    metrics.ACTOR_EVENTS.labels(slot.name, "started").inc()
                    for m in held:  # a (re)started engine holds no steering until pushed
                        nursery.start_soon(self._after_start, m)
                    nursery.start_soon(self._heartbeat, slot, slot.client)
                    try:
                        await slot.client.run()
                    finally:
                        slot.client.fail_all(
                            GreenroomError(
                                "engine_crashed",
                                f"engine actor {slot.name!r} stopped during the request; "
                                "it is being restarted, retry the request",
                            )
                        )
                        slot.client = None
                nursery.cancel_scope.cancel()

    async def _heartbeat(self, slot: ActorSlot, client: EngineClient) -> None:
        """Ask the actor its status every HEARTBEAT_S: one that has not answered within
        UNRESPONSIVE_AFTER_S is alive to its process watch (SIGSTOP, a deadlock) but serves
        nothing, so it is shown unresponsive and the requests it has not started get the
        timeout error (`EngineClient.hung`) instead of waiting on it; its next answer makes it
        ready again. An actor computing answers in milliseconds: its loop thread answers status."""
        while True:
            await trio.sleep(HEARTBEAT_S)
            answered = await client.status(UNRESPONSIVE_AFTER_S) is not None
            if not answered and slot.state == SlotState.READY:
                slot.state = SlotState.UNRESPONSIVE
                log.warning(
                    "actor %s (pid %s) has not answered its status for %g s: unresponsive",
                    slot.name,
                    slot.pid,
                    UNRESPONSIVE_AFTER_S,
                )
                client.hung(
                    GreenroomError(
                        "request_timeout",
                        f"{slot.role} actor {slot.name!r} has not answered for {UNRESPONSIVE_AFTER_S:g} s "
                        "(unresponsive); the request was not started",
                    )
                )
            elif answered and slot.state == SlotState.UNRESPONSIVE:
                slot.state = SlotState.READY
                client.answers()
                log.info("actor %s answers again: ready", slot.name)

    async def _watch(self, slot: ActorSlot, child: runtime.Child | RemoteChild) -> None:
        """Raise once the child's process is gone, or its worker host: tractor would wait on it
        forever. A child ended by SIGTERM or SIGINT got what the root got (a signal to the process
        group, before the child left such signals to the root): a moment for the root's shutdown
        to cancel this quietly before the death is one."""
        how = await child.wait_death()
        if getattr(child, "process", None) is not None and -child.process.returncode in _ROOT_SIGNALS:
            await trio.sleep(SHUTDOWN_GRACE_S)
        log.error("actor %s (pid %d) %s", slot.name, child.pid, how)
        if slot.client is not None:
            slot.client.fail_all(
                GreenroomError(
                    "engine_crashed",
                    f"engine actor {slot.name!r} {how} during the request; "
                    + ("it is being restarted, retry the request" if slot.host is None else "retry the request"),
                )
            )
        raise RuntimeError(f"the actor {how}")

    async def actors(self) -> list[dict]:
        """/api/actors' rows: the supervisor itself, then every actor up or given up (an
        on-demand actor while its model is loaded)."""
        me, here = psutil.Process(), socket.gethostname()
        rows = [
            {
                "name": "supervisor",
                "role": "supervisor",
                "host": here,
                "pid": me.pid,
                "state": "ready",
                "models": [],
                "queue_depth": 0,
                "rss_bytes": me.memory_info().rss,
                "restarts": 0,
            }
        ]
        for slot in self.slots.values():
            if slot.on_demand and slot.state in (SlotState.STOPPED, SlotState.OFFLINE):
                continue  # a GGUF model's actor exists while the model is loaded
            answers = slot.client is not None and slot.state != SlotState.UNRESPONSIVE  # none to wait for
            status = await slot.client.status() if answers else None
            metrics.engine_status(slot.name, status)
            rows.append(
                {
                    "name": slot.name,
                    "role": slot.role,
                    "host": slot.host or here,
                    "pid": slot.pid,
                    "state": slot.state,
                    "models": [m.id for m in self.lifecycle.table.on(slot) if m.state == LoadState.LOADED],
                    "queue_depth": (status or {}).get("queue_depth", 0) + (status or {}).get("active", 0),
                    # a worker host's pid is not this host's: its actor reports its own memory
                    "rss_bytes": _rss(slot.pid) if slot.host is None else (status or {}).get("rss_bytes"),
                    "restarts": slot.restarts,
                    "last_error": slot.last_error,
                    "counters": status,
                }
            )
        return rows


def _rss(pid: int | None) -> int | None:
    try:
        return psutil.Process(pid).memory_info().rss if pid else None
    except psutil.Error:
        return None
