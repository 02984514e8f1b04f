"""The model lifecycle: every transition of a placed model's state (placements.ModelState) —
load, unload with its grace period, keep_alive and idle expiry, the refusal (or the wait) of
requests while an unload runs, the on-demand actor a GGUF model loads in, and the swap: a load
that does not fit its device unloads models there to make room (eviction.py decides which; one
load at a time per device, in request order, so two models that do not fit together take turns
rather than thrash). One owner, as in Ollama's server/sched.go: nobody else changes a model's state.

Nothing here starts a process or asks a device: how an on-demand actor starts and stops and
how much memory a device has free are given to `Lifecycle` (the tree gives supervision's and
memory.py's), so the state machine runs in-process with stand-ins for the actors
(tests/unit/test_lifecycle_machine.py). Requests and lifecycle messages go over the actor's client
(`ActorSlot.client`), where Load and Unload queue FIFO with requests."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import attrs
import trio

from greenroom import metrics
from greenroom.config import Config, budget_bytes
from greenroom.engines.base import ModelInfo
from greenroom.errors import GreenroomError
from greenroom.protocol import Failed, Load, Loading, Unload
from greenroom.supervisor import eviction
from greenroom.supervisor.engine_client import EngineClient
from greenroom.supervisor.memory import check_fit, check_quantization, checkpoint_bytes
from greenroom.supervisor.placements import LoadState, ModelState, ModelTable, Placement, placed_on
from greenroom.supervisor.routing import route
from greenroom.supervisor.slots import ActorSlot, StartFailed

log = logging.getLogger("greenroom.lifecycle")
# what a load's long stage is, for the log
_STAGES = {
    "converting": "converting its GGUF file into the transformers engine's checkpoint, once "
    "(kept in the model cache; 25 s to a few minutes)"
}

# slack past the grace period for a waited-on unload's weights to go (Ollama surface)
UNLOAD_WAIT_MARGIN_S = 10.0
# a model handed to a request this recently is busy though the request is not in flight yet
# (between `client_for` and its submit: a steering resolution, a prompt render): not evicted under it
HANDOFF_S = 1.0
IDLE_POLL_S = 0.05  # how often a swap waiting for a busy model looks again


@attrs.frozen
class Serving:
    """Where a request for a model goes: the model's info, the actor holding it and why the
    router chose that placement (routing.py's reason)."""

    info: ModelInfo
    actor: str
    route_reason: str


class Lifecycle:
    """Loads and unloads the models of `table`.

    Injected: `spawn(slot)` starts an on-demand actor and returns once it is up, having
    reported its models through `started` (else raises StartFailed); `stop(slot)` stops one
    and returns once it has ended (`stopped` reported); `memory(slot)` is the free memory of
    the device a load on `slot` goes to ({"device", "free_bytes", "total_bytes"}, None when
    unknown); `loaded(m)` runs after each load made here (the steering relay's push; it must
    not raise); `candidates(m)` are the actors an auto placement may load on, preferred
    first."""

    def __init__(
        self,
        config: Config,
        table: ModelTable,
        *,
        spawn: Callable[[ActorSlot], Awaitable[None]],
        stop: Callable[[ActorSlot], Awaitable[None]],
        memory: Callable[[ActorSlot], Awaitable[dict | None]],
        loaded: Callable[[ModelState], Awaitable[None]],
        candidates: Callable[[ModelState], list[ActorSlot]] = lambda m: [m.slot],
    ):
        self.config = config
        self.table = table
        self._spawn, self._stop, self._memory, self._loaded = spawn, stop, memory, loaded
        self._candidates = candidates
        self._nursery: trio.Nursery | None = None  # the keep-alive timers'
        self._budget = budget_bytes(config)
        self._rooms: dict[tuple[str | None, str], trio.Lock] = {}  # (host, device) → its loads, one at a time

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Hold the keep-alive timers until cancelled (no deadline is armed before this runs)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # what supervision reports ------------------------------------------------------------
    def preloads(self, slot: ActorSlot) -> list[Placement]:
        """What `slot`'s actor loads as it starts: its preloaded models (an on-demand actor: its model)."""
        return [m.placement for m in self.table.on(slot) if m.preload or slot.on_demand]

    def started(self, slot: ActorSlot, infos: dict[str, ModelInfo]) -> list[ModelState]:
        """`slot`'s actor (re)started holding the models of `infos` (id → ModelInfo): those are
        loaded, and idle from now on; the others are unloaded until asked for. The loaded ones."""
        idle = self.config.idle_unload_s
        for m in self.table.on(slot):
            m.state, m.info = (LoadState.LOADED, infos[m.id]) if m.id in infos else (LoadState.UNLOADED, None)
            self._set_deadline(m, idle if m.id in infos and idle > 0 else None)
        return [m for m in self.table.on(slot) if m.state == LoadState.LOADED]

    def stopped(self, slot: ActorSlot) -> None:
        """`slot`'s actor has ended (an on-demand one, or with its worker host): its models are
        unloaded — but for one being loaded, whose load says how it ends (a previous life's
        end must not undo the next life's load)."""
        for m in self.table.on(slot):
            if m.state != LoadState.LOADING:
                m.state, m.info = LoadState.UNLOADED, None

    # requests ----------------------------------------------------------------------------
    async def client_for(self, model: str, wait_unload: bool = False) -> tuple[EngineClient, Serving]:
        """The engine client serving `model` (routed among its placements) and where it is
        served: waiting while its actor (re)starts,
        loading the model first when it is not loaded. While an unload runs on the actor,
        every request for it is refused with model_busy (the spec's /v1 rule: retry once it
        is done) — or, with `wait_unload` (the Ollama surface, whose clients never retry a
        503), waits for the unload, as Ollama's scheduler does, and loads the model again:
        for at most the grace period an unload gives its running requests, plus a margin
        for the weights to go, then model_busy as on /v1."""
        if not wait_unload:
            return await self._client_for(model)
        with trio.move_on_after(self.config.graceful_unload_timeout_s + UNLOAD_WAIT_MARGIN_S):
            while True:
                while busy := [slot for slot in self._actors_of(model) if slot.unloading]:
                    await busy[0].unloaded.wait()
                try:
                    return await self._client_for(model)
                except GreenroomError as exc:
                    if exc.code != "model_busy":
                        raise
        return await self._client_for(model)  # the wait ran out: answered as on /v1

    def _actors_of(self, model: str) -> list[ActorSlot]:
        """The actors a request for `model` may be served on: its placements', and the candidates
        of an auto placement that the request's load would choose among."""
        return [
            slot
            for m in self.table.replicas_of(model)
            for slot in (self._candidates(m) if m.auto is not None and m.state == LoadState.UNLOADED else [m.slot])
        ]

    async def _client_for(self, model: str) -> tuple[EngineClient, Serving]:
        replicas = self.table.replicas_of(model)
        m, reason = (replicas[0], "single_engine_runtime") if len(replicas) == 1 else route(replicas)
        _refuse_while_unloading(m.slot)  # before a load: an unloading on-demand actor is still stopping
        if self.config.idle_unload_s > 0:  # idle from now on; a later keep_alive replaces it
            self.keep_alive(model, self.config.idle_unload_s)
        unplaced = m.auto is not None and m.state in (LoadState.UNLOADED, LoadState.LOADING)
        if m.draining is not None:
            await m.draining.wait()
        if unplaced or (m.slot.on_demand and m.state == LoadState.UNLOADED):
            await self._load(m)  # an auto placement's actor is the one this load chooses
        if m.slot.client is None:  # its actor (re)starting: waited for
            await m.slot.wait_client(model, self.config.ready_timeout_s)
        while True:
            if m.draining is not None:  # making room for another model: queued behind that swap
                await m.draining.wait()
                continue
            _refuse_while_unloading(m.slot)
            if m.state == LoadState.LOADED:  # the client of its actor now: an auto placement may have moved
                client = m.slot.client
                if client is None:
                    client = await m.slot.wait_client(model, self.config.ready_timeout_s)
                m.last_used = trio.current_time()
                return client, Serving(m.info, m.slot.name, reason)
            if m.state == LoadState.UNLOADED:
                await self._load(m)
            else:
                await m.changed.wait()

    # load --------------------------------------------------------------------------------
    async def load(self, model: str) -> ModelInfo:
        """Load `model`'s preferred placement (waiting if a load is under way); its ModelInfo."""
        return await self._load(self.table.state_of(model))

    async def _load(self, m: ModelState) -> ModelInfo:
        while m.state in (LoadState.LOADING, LoadState.UNLOADING):
            await m.changed.wait()
        if m.state == LoadState.LOADED:
            return m.info
        # loading from here: a request arriving during the memory query waits for this load
        m.state, m.changed = LoadState.LOADING, trio.Event()
        try:
            if m.auto is not None:
                await self._place(m)
            async with self._room_lock(m):  # held until the load ends: the next one sees what it took
                # (re)starting: its actor is waited for, which answers the memory query
                client = None if m.slot.on_demand else await m.slot.wait_client(m.id, self.config.ready_timeout_s)
                if m.slot.host is None:  # a worker host's files are not on this disk
                    check_quantization(m.placement)  # before any weight moves
                    await self._make_room(m)
                m.holds_room = True
                await self._load_on_actor(m, client)
            metrics.MODEL_EVENTS.labels(m.id, "loaded").inc()
            return m.info
        finally:
            m.holds_room = False
            if m.state == LoadState.LOADING:
                m.state = LoadState.UNLOADED
            m.stage = None
            m.changed.set()

    async def _load_on_actor(self, m: ModelState, client: EngineClient | None) -> None:
        """Load `m` on its actor: an on-demand actor started for it, or a Load sent to the actor's `client`."""
        if m.slot.on_demand:  # its actor loads it as it starts (`started`)
            try:
                await self._spawn(m.slot)
            except StartFailed as exc:
                raise GreenroomError(
                    "model_load_failed", f"model {m.id!r} could not be loaded: {exc}", "model"
                ) from None
        else:
            async with client.submit(Load(f"load-{uuid.uuid4().hex[:12]}", m.placement.to_spec())) as events:
                done = await events.__anext__()
                while isinstance(done, Loading):
                    started = _stage(m, done.stage)
                    done = await events.__anext__()
            if m.stage is not None:
                log.info(
                    "model %s: %s %s in %.1f s",
                    m.id,
                    m.stage,
                    "failed" if isinstance(done, Failed) else "done",
                    time.monotonic() - started,
                )
            if isinstance(done, Failed):
                raise GreenroomError.from_wire(done.error)
            m.state, m.info = LoadState.LOADED, done.info
            await self._loaded(m)

    # room: the swap ---------------------------------------------------------------------
    def limits(self) -> dict:
        """The swap's settings, as `greenroom ps` shows them."""
        c = self.config
        return {
            "max_loaded_models": c.max_loaded_models,
            "memory_budget_bytes": self._budget,
            "evict_pinned": c.evict_pinned,
            "gguf_parallel": c.gguf_parallel,
            "max_queue": c.max_queue,
        }

    def devices(self) -> list[dict]:
        """Each device's loaded models and what they take (reported after loading, else estimated)."""
        held: dict[tuple[str | None, str], list[ModelState]] = {}
        for ms in self.table.replicas.values():
            for m in ms:
                if _holds_memory(m):
                    held.setdefault((m.slot.host, m.placement.device), []).append(m)
        return [
            {"host": host, "device": device, "models": [m.id for m in ms], "bytes": sum(map(_footprint, ms))}
            for (host, device), ms in held.items()
        ]

    def _room_lock(self, m: ModelState) -> trio.Lock:
        return self._rooms.setdefault((m.slot.host, m.placement.device), trio.Lock())

    def _residents(self, m: ModelState, slot: ActorSlot, device: str) -> list[ModelState]:
        """The models holding memory on `slot`'s host's `device`, besides `m`."""
        return [
            o
            for ms in self.table.replicas.values()
            for o in ms
            if o is not m and (o.slot.host, o.placement.device) == (slot.host, device) and _holds_memory(o)
        ]

    def _busy(self, m: ModelState) -> bool:
        """Requests run or are about to run on `m`: it is waited for, never cut."""
        serving = m.slot.client is not None and m.slot.client.serving(m.id)
        return serving or trio.current_time() - m.last_used < HANDOFF_S

    def _resident(self, m: ModelState) -> eviction.Resident:
        return eviction.Resident(
            m.id,
            _footprint(m),
            self._busy(m),
            m.pinned,
            m.last_used,
            loading=m.state != LoadState.LOADED,
        )

    async def _make_room(self, m: ModelState) -> None:
        """Under the device's lock: unload what eviction.plan says must go for `m` to fit —
        idle models at once; busy ones once their requests end, no new request being routed to
        them meanwhile (each waits for the swap, then loads its model in turn), for at most the
        request timeout (else the ready timeout), then 503 model_busy. Refusals keep the
        spec's shapes: 503 insufficient_memory with the figures when nothing that may go makes
        room."""
        bound = self.config.request_timeout_s or self.config.ready_timeout_s
        with trio.move_on_after(bound):
            while True:
                residents = self._residents(m, m.slot, m.placement.device)
                if going := [o for o in residents if o.state == LoadState.UNLOADING]:
                    await going[0].changed.wait()  # its memory is on its way back: plan after it
                    continue
                plan = await self._plan(m, m.slot, m.placement, residents)
                if isinstance(plan, eviction.Refuse):
                    raise GreenroomError("insufficient_memory", plan.message, "model")
                if isinstance(plan, eviction.Evict):
                    victims = [o for o in residents if o.id in plan.victims]
                    await self._evict(victims, m.placement.device)
                return  # the plan counted what they free: a load that fails now is model_load_failed
        raise GreenroomError(
            "model_busy",
            f"model {m.id!r} needs room on {m.placement.device}, and the models that must make it were still "
            f"answering requests after {bound:g} s; retry",
            "model",
        )

    async def _plan(
        self, m: ModelState, slot: ActorSlot, placement: Placement, residents: list[ModelState]
    ) -> eviction.Plan:
        """What loading `m` as `placement` on `slot` takes, beside `residents` (eviction.plan)."""
        memory = await self._memory(slot)
        device = eviction.Device(
            f"{slot.name} ({memory['device'] if memory else placement.device})",
            memory["free_bytes"] if memory else None,
            memory["total_bytes"] if memory else None,
            self._budget if placement.device == "cpu" else None,
            self.config.max_loaded_models,
        )
        return eviction.plan(
            m.id, checkpoint_bytes(placement), device, [self._resident(o) for o in residents], self.config.evict_pinned
        )

    async def _evict(self, victims: list[ModelState], device: str) -> None:
        """Unload `victims` for room, once none has a request running."""
        for v in victims:
            v.draining = trio.Event()
        try:
            if any(self._busy(v) for v in victims):
                metrics.SWAP_WAITS.labels(device).inc()
                while any(self._busy(v) for v in victims):
                    await trio.sleep(IDLE_POLL_S)
            with trio.CancelScope(shield=True):  # the wait may run out; an unload begun is not cut
                for v in victims:
                    log.info("model %s: unloaded to make room on %s", v.id, device)
                    await self._unload(v)
                    metrics.MODEL_EVENTS.labels(v.id, "evicted").inc()
        finally:
            for v in victims:
                v.draining.set()
                v.draining = None

    async def _place(self, m: ModelState) -> None:
        """Put an auto placement on the first of its candidate actors (this host's first
        engine actor, then the worker hosts' up now) that is up and whose device has room for
        it — on this host, with what may go unloaded (its load then makes the room) — measured
        there as a named actor's load is; else refuse with the first one's reason."""
        refusals = []
        for slot in self._candidates(m):
            placed = placed_on(m.auto, slot)
            try:
                await slot.wait_client(m.id, self.config.ready_timeout_s)
                _refuse_while_unloading(slot)
                if slot.host is None:  # a worker host's engine checks what it can load; the load makes room
                    check_quantization(placed)
                    plan = await self._plan(m, slot, placed, self._residents(m, slot, placed.device))
                    if isinstance(plan, eviction.Refuse):
                        raise GreenroomError("insufficient_memory", plan.message, "model")
                else:  # its size as this host sees the checkpoint; a worker host builds a demo model itself
                    check_fit(attrs.evolve(m.auto, device=placed.device), slot.name, await self._memory(slot))
            except GreenroomError as exc:
                refusals.append(exc)
                continue
            m.slot, m.placement = slot, placed
            return
        if refusals:
            raise refusals[0]
        raise GreenroomError(
            "model_not_loaded",
            f'model {m.id!r} (actor = "auto") has no engine actor to load on: this host has none, '
            "and no worker host offering one has joined",
            "model",
        )

    # unload ------------------------------------------------------------------------------
    async def unload(self, model: str) -> None:
        """Unload every placement of `model` gracefully: from now on requests for any model
        of its actor get model_busy; requests already running finish first — for up to
        graceful_unload_timeout_s, then they are cancelled — before the weights go. A GGUF
        model is unloading until its actor has ended: a load meanwhile would start the
        actor's next life while this one still runs."""
        for m in self.table.replicas_of(model):
            await self._unload(m)

    async def _unload(self, m: ModelState) -> None:
        while True:
            while m.state in (LoadState.LOADING, LoadState.UNLOADING):
                await m.changed.wait()
            if m.state != LoadState.LOADED:
                return
            if m.slot.client is not None:
                break
            try:  # its actor restarts, holding the model again: unloaded there
                await m.slot.wait_client(m.id, self.config.ready_timeout_s)
            except GreenroomError:
                return  # down: nothing is loaded
        client, grace = m.slot.client, self.config.graceful_unload_timeout_s
        m.state, m.changed, m.expires_at = LoadState.UNLOADING, trio.Event(), None
        m.slot.unloading += 1
        try:
            async with client.submit(Unload(f"unload-{uuid.uuid4().hex[:12]}", m.id)) as events:
                with trio.move_on_after(grace) as waited:
                    await events.__anext__()
                if waited.cancelled_caught:  # the running requests outlived the grace period
                    await client.cancel_model(
                        m.id,
                        GreenroomError(
                            "model_busy",
                            f"model {m.id!r} was unloaded before this request finished "
                            f"(graceful_unload_timeout_s = {grace:g})",
                        ),
                    )
                    await events.__anext__()
            if m.slot.on_demand:  # its actor goes with it
                await self._stop(m.slot)
            m.state, m.info = LoadState.UNLOADED, None
            metrics.MODEL_EVENTS.labels(m.id, "unloaded").inc()
        finally:
            m.slot.unloading -= 1
            if not m.slot.unloading:
                m.slot.unloaded.set()
                m.slot.unloaded = trio.Event()
            if m.state == LoadState.UNLOADING:
                m.state = LoadState.LOADED  # the actor went away mid-unload; its restart resets the state
            m.changed.set()

    # keep_alive --------------------------------------------------------------------------
    def keep_alive(self, model: str, seconds: float | None) -> None:
        """After a request: unload `model` once it has been idle `seconds` (0: now; None or
        negative: keep it loaded). A later request's keep_alive replaces this one."""
        for m in self.table.replicas_of(model):
            self._set_deadline(m, seconds)

    def _set_deadline(self, m: ModelState, seconds: float | None) -> None:
        m.pinned = seconds is not None and seconds < 0
        if seconds is None or seconds < 0 or self._nursery is None:
            m.expires_at = None
            m.moved.set()
            return
        m.expires_at, m.keep_alive_s = trio.current_time() + seconds, seconds
        m.moved.set()
        if not m.timer:
            m.timer = True
            self._nursery.start_soon(self._expire, m)

    async def _expire(self, m: ModelState) -> None:
        """One timer per placement, following its deadline as later requests move it
        (earlier or later). A model still answering a request is not idle: its deadline
        moves past the request's end."""
        try:
            while True:
                while m.expires_at is not None and trio.current_time() < m.expires_at:
                    m.moved = trio.Event()
                    with trio.move_on_at(m.expires_at):
                        await m.moved.wait()
                if m.expires_at is None or m.state != LoadState.LOADED:
                    return
                if m.slot.client is not None and m.slot.client.serving(m.id):
                    m.expires_at = trio.current_time() + max(m.keep_alive_s, 0.5)
                    continue
                await self._unload(m)
                return
        finally:
            m.timer = False


def _stage(m: ModelState, stage: str) -> float:
    """A load's engine reports a long stage (protocol.Loading): said in the log and in the model's
    state, since a request waits on it with nothing else to show. Its start, on the monotonic clock."""
    m.stage = stage
    log.info("model %s: %s", m.id, _STAGES.get(stage, stage))
    return time.monotonic()


def _holds_memory(m: ModelState) -> bool:
    """Loaded, being unloaded, or loading past its room check: its memory is taken."""
    return m.state in (LoadState.LOADED, LoadState.UNLOADING) or m.holds_room


def _footprint(m: ModelState) -> int:
    """What `m` takes on its device: its actor's report after loading, else the estimate."""
    reported = m.info.footprint_bytes if m.info is not None else None
    return reported or checkpoint_bytes(m.placement) or 0


def _refuse_while_unloading(slot: ActorSlot) -> None:
    """model_busy while an unload runs on `slot`'s actor (the spec's /v1 rule: retry after it)."""
    if slot.unloading:
        raise GreenroomError(
            "model_busy",
            f"a model is being unloaded from engine actor {slot.name!r}; retry once the unload finishes",
            "model",
        )
