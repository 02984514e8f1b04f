"""The actor tree: one supervising task per actor, restarts with backoff, routing.

Each actor slot is owned by exactly one task (`_supervise`), which spawns the
process, opens its session stream, watches the process, and on death fails the
slot's in-flight requests with a typed error and restarts it — at most
`restart_limit` times within `restart_window_s`, with exponential backoff.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import logging
import os
import time
import uuid

import attrs
import psutil
import trio

from greenroom import metrics
from greenroom.actors import runtime
from greenroom.actors.engine_actor import engine_session
from greenroom.actors.service_actors import service_session
from greenroom.actors.steering_actor import steering_session
from greenroom.config import Config, detect_engine_actors, detect_npu_actors
from greenroom.engines import gguf_files
from greenroom.engines.capabilities import ENGINES, Capabilities, capabilities_of, common
from greenroom.engines.loader import source_path
from greenroom.errors import GreenroomError
from greenroom.protocol import (
    AttachDefaultSAE, AttachSAE, Dialled, Failed, GetLock, GetSteering, Load, ModelRequest, SteeringAnswer,
    SteeringCall, SteeringLock, SteeringRequest, SteeringState, SteerUpdate, Unload,
)
from greenroom.supervisor.engine_client import EngineClient
from greenroom.supervisor.monitoring import Monitoring

log = logging.getLogger("greenroom.supervisor")

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 10.0


@attrs.define(eq=False)
class ActorSlot:
    name: str
    role: str  # "engine" | "scheduler" | "steering"
    placements: list[dict] = attrs.Factory(list)  # models this actor loads
    state: str = "starting"  # starting | ready | restarting | failed | stopped
    pid: int | None = None
    restarts: int = 0
    last_error: str | None = None
    client: EngineClient | None = None
    ready: trio.Event = attrs.Factory(trio.Event)
    unloading: int = 0  # unloads running: every request for this actor is refused (or waits) meanwhile
    unloaded: trio.Event = attrs.Factory(trio.Event)  # set each time `unloading` falls back to 0
    # one actor per GGUF model: spawned to load it, stopped once it is unloaded
    on_demand: bool = False
    scope: trio.CancelScope | None = None  # cancels its supervising task (on-demand slots)
    stopped: trio.Event = attrs.Factory(trio.Event)  # set when that task has ended


@attrs.define(eq=False)
class ModelState:
    """One placed model's lifecycle, owned by the tree: loaded ⇄ unloaded, through
    loading / unloading. `changed` is set when a transition ends."""

    id: str
    slot: ActorSlot
    placement: dict
    preload: bool
    state: str = "unloaded"  # unloaded | loading | loaded | unloading
    info: dict | None = None  # ModelInfo, while loaded
    changed: trio.Event = attrs.Factory(trio.Event)
    expires_at: float | None = None  # keep_alive: unload at this trio time
    timer: bool = False  # a keep-alive timer task is watching expires_at
    keep_alive_s: float = 0.0  # the idle time expires_at was last set from
    moved: trio.Event = attrs.Factory(trio.Event)  # wakes the timer when expires_at changes


class Tree:
    def __init__(self, config: Config):
        self.config = config
        names = detect_engine_actors() if config.engine_actors == "auto" else list(config.engine_actors)
        names += detect_npu_actors() if config.npu_actors == "auto" else list(config.npu_actors)
        self.model_states: dict[str, ModelState] = {}  # each model's preferred placement
        self.replicas: dict[str, list[ModelState]] = {}  # each model's placements, preferred first
        self._nursery: trio.Nursery | None = None
        self.slots: dict[str, ActorSlot] = {
            "scheduler": ActorSlot("scheduler", "scheduler"),
            "steering": ActorSlot("steering", "steering"),
        }
        self._engine_actors = names
        self._default_saes = {model.id: model.sae for model in config.models if model.sae}
        # The steering coordinator's last state answer per model, the front end's one cache of it:
        # written only by `steering`, through which every steering write goes (so it is current).
        # It exists so that a request with no profile or dial reads its circuit rung
        # (steering_api.live_headers) without a round trip to the coordinator.
        self.last_steering_states: dict[str, SteeringState] = {}
        self.locked_model: str | None = None  # locked for steering: /v1/models lists it alone
        self.monitoring = Monitoring(config.cache_dir)  # SAE monitoring: configuration and records
        for name in names:
            self.slots[name] = ActorSlot(name, "engine")
        for model in config.models:  # the same id on several actors: replicas, preferred first
            self.add_model(model.id, model.source, model.engine, model.actor, model.dtype, model.preload,
                           n_ctx=model.n_ctx, threads=model.threads, replica=model.id in self.model_states,
                           chat_template=model.chat_template)
        for model_id, path in gguf_files.discover(config.model_dirs):
            if model_id not in self.model_states:
                self.add_model(model_id, str(path), "llama.cpp")

    def add_model(self, model_id: str, source: str, engine: str = "transformers", actor: str = "auto",
                  dtype: str | None = None, preload: bool = False, n_ctx: int | None = None,
                  threads: int | None = None, replica: bool = False, chat_template: str | None = None) -> ModelState:
        """Place a model: on an engine actor (transformers), or on an actor of its own that
        is spawned when it loads (llama.cpp). Loaded on demand unless `preload` (which only
        an actor's start honours). `replica`: one more placement of a placed model, on
        another actor; requests are routed among them (`route`)."""
        if (model_id in self.model_states) != replica:
            raise GreenroomError("invalid_parameter", f"model {model_id!r} already exists" if not replica
                                 else f"model {model_id!r} has no first placement", "model")
        placement = {"id": model_id, "source": source, "engine": engine, "dtype": dtype,
                     "cache_dir": self.config.cache_dir, "chat_template": chat_template}
        if engine == "llama.cpp":
            name = f"gguf:{model_id}" + (f"#{len(self.replicas[model_id])}" if replica else "")
            slot = ActorSlot(name, "engine", on_demand=True, state="stopped")
            slot.stopped.set()
            self.slots[slot.name] = slot
            placement.update(device="cpu", n_ctx=self.config.gguf_n_ctx if n_ctx is None else n_ctx,
                             threads=threads or self.config.gguf_threads or None, parallel=self.config.gguf_parallel)
            preload = False
        else:
            actor = self._engine_actors[0] if actor == "auto" else actor
            if actor not in self.slots or self.slots[actor].role != "engine" or self.slots[actor].on_demand:
                raise ValueError(f"model {model_id!r} is placed on unknown engine actor {actor!r}")
            slot = self.slots[actor]
            if any(r.slot is slot for r in self.replicas.get(model_id, ())):
                raise ValueError(f"model {model_id!r} is placed twice on engine actor {actor!r}")
            placement["device"] = _device_of(actor)
        slot.placements.append(placement)
        m = ModelState(model_id, slot, placement, preload)
        self.replicas.setdefault(model_id, []).append(m)
        self.model_states.setdefault(model_id, m)
        return m

    async def remove_model(self, model_id: str) -> None:
        """Unload (gracefully) and forget a model; its own actor, if it had one, goes too."""
        await self.unload(model_id)
        for m in self.replicas.pop(model_id):
            m.slot.placements.remove(m.placement)
            if m.slot.on_demand:
                del self.slots[m.slot.name]
        del self.model_states[model_id]

    # lifecycle ----------------------------------------------------------------------
    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery  # keep-alive timers and on-demand actors live here
            for slot in self.slots.values():
                if not slot.on_demand:
                    nursery.start_soon(self._supervise, slot)
            nursery.start_soon(self._attach_default_saes)
            task_status.started()

    async def _supervise(self, slot: ActorSlot) -> None:
        slot.stopped = trio.Event()
        try:
            with trio.CancelScope() as slot.scope:
                await self._supervise_loop(slot)
        finally:
            slot.scope, slot.client, slot.pid = None, None, None
            if slot.on_demand:
                slot.state = "stopped"
                for m in self._placed(slot):
                    m.state, m.info = "unloaded", None
            slot.ready.set()  # waiters see the stopped state instead of hanging
            slot.stopped.set()

    async def _supervise_loop(self, slot: ActorSlot) -> None:
        failures: collections.deque[float] = collections.deque()
        while True:
            try:
                await self._run_once(slot)
                reason = "its session ended"
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
            slot.last_error = reason
            slot.pid = None
            metrics.ACTOR_EVENTS.labels(slot.name, "stopped").inc()
            if slot.on_demand and slot.state == "starting":
                log.error("actor %s could not load its model: %s", slot.name, reason)
                return  # a load that failed is the request's error, not a restart loop
            now = time.monotonic()
            failures.append(now)
            while failures and now - failures[0] > self.config.restart_window_s:
                failures.popleft()
            if len(failures) > self.config.restart_limit:
                log.error("actor %s failed %d times in %.0f s, giving up: %s", slot.name, len(failures),
                          self.config.restart_window_s, reason)
                slot.state = "failed"
                slot.ready.set()  # waiters see the failed state instead of hanging
                metrics.ACTOR_EVENTS.labels(slot.name, "failed").inc()
                return
            delay = min(BACKOFF_BASE_S * 2 ** (len(failures) - 1), BACKOFF_MAX_S)
            log.warning("actor %s stopped (%s); restarting in %.1f s", slot.name, reason, delay)
            slot.state, slot.ready = "restarting", trio.Event()  # `ready` is the current life's
            slot.restarts += 1
            await trio.sleep(delay)

    async def _run_once(self, slot: ActorSlot) -> None:
        if slot.role == "engine":
            fn = engine_session
            kwargs = {"models": [m.placement for m in self._placed(slot) if m.preload or slot.on_demand],
                      "device": slot.placements[0]["device"] if slot.on_demand else _device_of(slot.name),
                      "max_queue": self.config.max_queue, "default_max_tokens": self.config.default_max_tokens,
                      "continuous_batching": self.config.continuous_batching}
        elif slot.role == "steering":
            fn, kwargs = steering_session, {"cache_dir": self.config.cache_dir, "limits": {
                "cluster_min": self.config.cluster_intensity_min, "circuit_min": self.config.circuit_intensity_min,
                "max": self.config.intensity_max}}
        else:
            fn, kwargs = service_session, {"role": slot.role}
        module = fn.__module__
        async with runtime.spawn(slot.name, module, loglevel=runtime.tractor_loglevel(self.config.log_level)) as child:
            slot.pid = child.pid
            log.info("actor %s started, pid %d", slot.name, child.pid)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, slot, child)
                async with runtime.open_session(child, fn, parent_pid=os.getpid(), **kwargs) as (first, stream):
                    if not first["ok"]:
                        raise RuntimeError(f"load failed: {first['error']}")
                    slot.client = EngineClient(slot.name, stream)
                    loaded = {info["id"]: info for info in first["models"]}
                    for m in self._placed(slot):  # a (re)started actor holds its preloaded models only
                        m.state, m.info = ("loaded", loaded[m.id]) if m.id in loaded else ("unloaded", None)
                        # a model loaded at start is idle from now on
                        self._set_deadline(m, self.config.idle_unload_s if m.id in loaded and
                                           self.config.idle_unload_s > 0 else None)
                    slot.state = "ready"
                    slot.ready.set()
                    metrics.ACTOR_EVENTS.labels(slot.name, "started").inc()
                    for m in self._placed(slot):  # a (re)started engine holds no steering until pushed
                        if m.state == "loaded":
                            nursery.start_soon(self._push_steering_quietly, m)
                    try:
                        await slot.client.run()
                    finally:
                        slot.client.fail_all(GreenroomError(
                            "engine_crashed", f"engine actor {slot.name!r} stopped during the request; "
                            "it is being restarted, retry the request"))
                        slot.client = None
                nursery.cancel_scope.cancel()

    async def _watch(self, slot: ActorSlot, child: runtime.Child) -> None:
        """Raise once the child's process is gone: tractor would wait on it forever."""
        code = await runtime.watch_death(child)
        log.error("actor %s (pid %d) died with exit code %s", slot.name, child.pid, code)
        if slot.client is not None:
            slot.client.fail_all(GreenroomError(
                "engine_crashed", f"engine actor {slot.name!r} died (exit code {code}) during the request; "
                "it is being restarted, retry the request"))
        raise RuntimeError(f"process exited with code {code}")

    # queries --------------------------------------------------------------------------
    @property
    def loading(self) -> bool:
        return any(s.state == "starting" and not s.on_demand for s in self.slots.values())

    def model_ids(self) -> list[str]:
        return list(self.model_states)

    def _placed(self, slot: ActorSlot) -> list[ModelState]:
        return [m for ms in self.replicas.values() for m in ms if m.slot is slot]

    def models(self) -> list[dict]:
        """The available models — loaded, loading, or ready to load on demand — with the
        preferred placement's actor and state; a model none of whose actors is running or
        able to start is not listed. `replicas` lists every placement when there are several."""
        out = []
        for model_id, replicas in self.replicas.items():
            rows = [{"actor": m.slot.name, "engine": m.placement["engine"], "device": m.placement["device"],
                     "state": m.state if m.slot.state in ("ready", "stopped") else "loading"}
                    for m in replicas if m.slot.state != "failed"]
            if rows:
                out.append({"id": model_id, **rows[0], **({"replicas": rows} if len(replicas) > 1 else {})})
        return out

    def route(self, model: str) -> tuple[ModelState, str]:
        """The placement the next request for `model` goes to, and why: the preferred one
        (the first configured) while it is idle; else the first idle one, else the least
        loaded — so a busy or missing device falls back to another that holds the model.
        Decided here, in the front end's process: an extra actor hop per request would cost
        a tractor round trip (~4 ms measured)."""
        replicas = self.replicas_of(model)
        if len(replicas) == 1:
            return replicas[0], "single_engine_runtime"
        up = [m for m in replicas if m.slot.state == "ready" or (m.slot.on_demand and m.slot.state == "stopped")]
        if not up:
            return replicas[0], "preferred_device"  # nothing else to try: wait for it, or its error
        load = [m.slot.client.in_flight if m.slot.client is not None else 0 for m in up]
        chosen = up[load.index(0)] if 0 in load else up[load.index(min(load))]
        if chosen is replicas[0]:
            return chosen, "preferred_device"
        return chosen, "fallback_unavailable" if replicas[0] not in up else "fallback_busy"

    def capabilities(self, model: str) -> tuple[str, Capabilities]:
        """The engine(s) `model` is placed on (`a/b` for several) and what all of them honour."""
        engines = list(dict.fromkeys(m.placement["engine"] for m in self.replicas_of(model)))
        return "/".join(engines), common(engines)

    def replicas_of(self, model: str) -> list[ModelState]:
        self.state_of(model)  # 404 for an unknown name
        return self.replicas[model]

    def resolve(self, name: str) -> str:
        """The served id for a request's model name: the id itself, or a bare GGUF
        repository name while only one quantization of it is served (else 400
        AMBIGUOUS_MODEL_NAME naming the tags; 404 when nothing matches)."""
        if name in self.model_states:
            return name
        tags = [m.id for m in self.model_states.values()
                if m.placement["engine"] == "llama.cpp" and m.id.rpartition(":")[0] == name]
        if len(tags) == 1:
            return tags[0]
        if tags:
            raise GreenroomError("AMBIGUOUS_MODEL_NAME", f"model {name!r} names several quantizations: "
                                 f"{', '.join(tags)}; name one of them", "model")
        raise GreenroomError("model_not_found", f"The model '{name}' does not exist", "model")

    def placement(self, model: str) -> tuple[ActorSlot, dict]:
        """The actor slot and placement serving `model`, or 404 model_not_found."""
        m = self.state_of(model)
        return m.slot, m.placement

    def state_of(self, model: str) -> ModelState:
        m = self.model_states.get(model)
        if m is None:
            raise GreenroomError("model_not_found", f"The model '{model}' does not exist", "model")
        return m

    async def _actor_client(self, slot: ActorSlot, model: str) -> EngineClient:
        """The actor's client, waiting while it (re)starts."""
        with trio.move_on_after(self.config.ready_timeout_s):
            while slot.client is None and slot.state != "failed":
                await slot.ready.wait()
                if slot.client is None and slot.state != "failed":
                    await trio.sleep(0.05)  # ready was set by a previous life; wait for the next
        if slot.client is None:
            raise GreenroomError("model_not_loaded", f"model {model!r} is not loaded: its engine actor "
                                 f"{slot.name!r} is {slot.state} ({slot.last_error or 'not ready'})", "model")
        return slot.client

    async def client_for(self, model: str, wait_unload: bool = False) -> tuple[EngineClient, dict]:
        """The engine client serving `model` (routed among its placements) and the model's
        info, with `actor` and `route_reason` added: waiting while its actor (re)starts,
        loading the model first when it is not loaded. While an unload runs on the actor,
        every request for it is refused with model_busy (the spec's /v1 rule: retry once it
        is done) — or, with `wait_unload` (the Ollama surface, whose clients never retry a
        503), waits for the unload, as Ollama's scheduler does, and loads the model again:
        for at most the grace period an unload gives its running requests, plus a margin
        for the weights to go, then model_busy as on /v1."""
        if not wait_unload:
            return await self._client_for(model)
        with trio.move_on_after(self.config.graceful_unload_timeout_s + 10.0):
            while True:
                while busy := [m.slot for m in self.replicas_of(model) if m.slot.unloading]:
                    await busy[0].unloaded.wait()
                try:
                    return await self._client_for(model)
                except GreenroomError as exc:
                    if exc.code != "model_busy":
                        raise
        return await self._client_for(model)  # the wait ran out: answered as on /v1

    async def _client_for(self, model: str) -> tuple[EngineClient, dict]:
        m, reason = self.route(model)
        if self.config.idle_unload_s > 0:  # idle from now on; a later keep_alive replaces it
            self.keep_alive(model, self.config.idle_unload_s)
        if m.slot.on_demand and m.state == "unloaded":
            await self._load(m)
        client = await self._actor_client(m.slot, model)
        while True:
            if m.slot.unloading:
                raise GreenroomError("model_busy", f"a model is being unloaded from engine actor {m.slot.name!r}; "
                                     "retry once the unload finishes", "model")
            if m.state == "loaded":
                return client, {**m.info, "actor": m.slot.name, "route_reason": reason}
            if m.state == "unloaded":
                await self._load(m)
            else:
                await m.changed.wait()

    async def load(self, model: str) -> dict:
        """Load `model`'s preferred placement (waiting if a load is under way); its ModelInfo."""
        return await self._load(self.replicas_of(model)[0])

    async def _load(self, m: ModelState) -> dict:
        model = m.id
        client = None if m.slot.on_demand else await self._actor_client(m.slot, model)
        while m.state in ("loading", "unloading"):
            await m.changed.wait()
        if m.state == "loaded":
            return m.info
        _check_quantization(m)
        await self._check_memory(m, (await client.status() or {}).get("memory") if client else _host_memory())
        m.state, m.changed = "loading", trio.Event()
        try:
            if m.slot.on_demand:
                await self._spawn_for(m)
            else:
                async with client.submit(Load(f"load-{uuid.uuid4().hex[:12]}", m.placement)) as events:
                    done = await events.__anext__()
                if isinstance(done, Failed):
                    raise GreenroomError.from_wire(done.error)
                m.state, m.info = "loaded", done.info
                await self._push_steering_quietly(m)
            metrics.MODEL_EVENTS.labels(model, "loaded").inc()
            return m.info
        finally:
            if m.state == "loading":
                m.state = "unloaded"
            m.changed.set()

    async def _spawn_for(self, m: ModelState) -> None:
        """Start the model's own actor, which loads it as it starts (its session's first
        answer); a load that fails stops the actor and is the request's error."""
        slot = m.slot
        await slot.stopped.wait()  # a previous life is still shutting down
        slot.state, slot.ready, slot.last_error = "starting", trio.Event(), None
        self._nursery.start_soon(self._supervise, slot)
        with trio.move_on_after(self.config.ready_timeout_s):
            await slot.ready.wait()
        if slot.state != "ready":
            if slot.scope is not None:
                slot.scope.cancel()
            raise GreenroomError("model_load_failed", f"model {m.id!r} could not be loaded: "
                                 f"{slot.last_error or 'its actor did not start in time'}", "model")

    async def _check_memory(self, m: ModelState, memory: dict | None) -> None:
        """Refuse a load that cannot fit the actor's card, with the figures, before any
        weight moves (503 insufficient_memory)."""
        need = checkpoint_bytes(m.placement)
        if need is None or memory is None or need <= memory["free_bytes"]:
            return
        gib = 2**30
        raise GreenroomError("insufficient_memory", (
            f"model {m.id!r} needs about {need / gib:.1f} GiB; {m.slot.name} ({memory['device']}) has "
            f"{memory['free_bytes'] / gib:.1f} GiB free of {memory['total_bytes'] / gib:.1f} GiB"), "model")

    async def unload(self, model: str) -> None:
        """Unload every placement of `model` gracefully: from now on requests for any model
        of its actor get model_busy; requests already running finish first — for up to
        graceful_unload_timeout_s, then they are cancelled — before the weights go."""
        for m in self.replicas_of(model):
            await self._unload(m)

    async def _unload(self, m: ModelState) -> None:
        model = m.id
        while m.state in ("loading", "unloading"):
            await m.changed.wait()
        if m.state != "loaded" or m.slot.client is None:
            return
        client = m.slot.client
        m.state, m.changed, m.expires_at = "unloading", trio.Event(), None
        m.slot.unloading += 1
        try:
            async with client.submit(Unload(f"unload-{uuid.uuid4().hex[:12]}", model)) as events:
                with trio.move_on_after(self.config.graceful_unload_timeout_s):
                    await events.__anext__()
                    m.state, m.info = "unloaded", None
                if m.state == "unloading":  # the running requests outlived the grace period
                    await client.cancel_model(model, GreenroomError(
                        "model_busy", f"model {model!r} was unloaded before this request finished "
                        f"(graceful_unload_timeout_s = {self.config.graceful_unload_timeout_s:g})"))
                    await events.__anext__()
                    m.state, m.info = "unloaded", None
            if m.slot.on_demand:  # its actor goes with it
                m.slot.scope.cancel()
                await m.slot.stopped.wait()
            metrics.MODEL_EVENTS.labels(model, "unloaded").inc()
        finally:
            m.slot.unloading -= 1
            if not m.slot.unloading:
                m.slot.unloaded.set()
                m.slot.unloaded = trio.Event()
            if m.state == "unloading":
                m.state = "loaded"  # the actor went away mid-unload; its restart resets the state
            m.changed.set()

    # steering -------------------------------------------------------------------------
    async def steering(self, request: SteeringRequest) -> SteeringAnswer:
        """Send `request` to the steering coordinator (the only writer of steering state) and
        return its answer. A `ModelRequest` for a model that cannot steer is refused here, before
        it is sent. Every model state answered is kept in `last_steering_states`."""
        if isinstance(request, ModelRequest):
            self.require_steering(request.model)
            if isinstance(request, (AttachSAE, AttachDefaultSAE)):  # the coordinator checks the SAE fits the model
                request = attrs.evolve(request, placement=self.replicas_of(request.model)[0].placement)
        elif isinstance(request, GetSteering):
            self.state_of(request.model)  # 404 for an unknown name; a read for any engine
        model = request.model if isinstance(request, (ModelRequest, GetSteering)) else "steering"
        client = await self._actor_client(self.slots["steering"], model)
        async with client.submit(SteeringCall(f"steer-{uuid.uuid4().hex[:12]}", request)) as events:
            reply = await events.__anext__()
        if isinstance(reply, Failed):
            raise GreenroomError.from_wire(reply.error)
        state = reply.answer.state if isinstance(reply.answer, Dialled) else reply.answer
        if isinstance(state, SteeringState):
            self.last_steering_states[state.model] = state
        if isinstance(reply.answer, SteeringLock):
            self.locked_model = reply.answer.model
        return reply.answer

    def steers(self, model: str) -> bool:
        """Whether `model` can steer: every engine it is placed on has the `steering` capability
        (engines/capabilities.py, the one place that says which engines have SAE hooks)."""
        return self.capabilities(model)[1].steering

    def require_steering(self, model: str, done: str = "steered") -> None:
        """400 steering_unsupported unless `model` can steer; `done`: what the refusal says only
        steering engines' models are (steered, monitored)."""
        if not self.steers(model):
            engines = "/".join(e for e, caps in ENGINES.items() if caps.steering)
            raise GreenroomError("steering_unsupported", f"model {model!r} runs on {self.capabilities(model)[0]}, "
                                 f"which has no SAE hooks: only {engines} models are {done}", "model")

    def steerable(self) -> list[str]:
        """The models that can steer (`steers`)."""
        return [model for model in self.replicas if self.steers(model)]

    async def push_steering(self, m: ModelState, state: SteeringState) -> bool:
        """Send `state` to the engine actor holding placement `m`; whether it is live there
        (a placement not loaded, or not steerable, holds none)."""
        if not capabilities_of(m.placement["engine"]).steering or m.state != "loaded" or m.slot.client is None:
            return False
        if state.version == 0:
            return True  # nothing was ever set: the engine's unsteered start is the state
        update = SteerUpdate(f"steer-{uuid.uuid4().hex[:12]}", m.id, state.version, state.enabled,
                             [{"sae_id": s["sae_id"], "path": s["path"]} for s in state.saes], state.strengths)
        async with m.slot.client.submit(update) as events:
            reply = await events.__anext__()
        if isinstance(reply, Failed):
            log.warning("steering of %s (version %d) not applied on %s: %s", m.id, state.version, m.slot.name,
                        reply.error["message"])
            return False
        return reply.version >= state.version

    async def push_model_steering(self, model: str, state: SteeringState) -> bool:
        """`state` to every placement of `model`; whether each loaded one now holds it."""
        live = True
        for m in self.replicas_of(model):
            live = await self.push_steering(m, state) and live
        return live

    async def steering_live(self, model: str, state: SteeringState) -> bool:
        """Whether every loaded placement of `model` holds `state`'s version (from the actors' status)."""
        for m in self.replicas_of(model):
            status = await m.slot.client.status() if m.state == "loaded" and m.slot.client is not None else None
            held = ((status or {}).get("steering") or {}).get(model)
            if held is None or held["version"] < state.version:
                return False
        return True

    async def _push_steering_quietly(self, m: ModelState) -> None:
        """After an engine (re)start or a load: the model's current state. A failure is
        logged, never the load's or the actor's: the model then runs as the engine holds it."""
        if not capabilities_of(m.placement["engine"]).steering:
            return
        try:
            await self.push_steering(m, await self.steering(GetSteering(m.id)))
        except Exception as exc:
            log.warning("steering of %s not pushed to %s: %s", m.id, m.slot.name, exc)

    async def _attach_default_saes(self) -> None:
        """A model's configured `sae`, attached on its first start (while nothing was ever set
        for it): later starts restore what the store holds, detached or not. Then the steering
        lock and every steerable model's state, as the store holds them."""
        try:
            await self.steering(GetLock())
        except Exception as exc:
            log.error("the steering lock was not read: %s", exc)
        for model, sae in self._default_saes.items():
            try:
                await self.push_model_steering(model, await self.steering(AttachDefaultSAE(model, sae)))
            except Exception as exc:
                log.error("default SAE %r of model %s not attached: %s", sae, model, exc)
        for model in self.steerable():
            if model not in self.last_steering_states:
                try:
                    await self.steering(GetSteering(model))
                except Exception as exc:
                    log.error("steering state of model %s not read: %s", model, exc)

    def keep_alive(self, model: str, seconds: float | None) -> None:
        """After a request: unload `model` once it has been idle `seconds` (0: now; None or
        negative: keep it loaded). A later request's keep_alive replaces this one."""
        for m in self.replicas_of(model):
            self._set_deadline(m, seconds)

    def _set_deadline(self, m: ModelState, seconds: float | None) -> None:
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
                if m.expires_at is None or m.state != "loaded":
                    return
                if m.slot.client is not None and m.slot.client.serving(m.id):
                    m.expires_at = trio.current_time() + max(m.keep_alive_s, 0.5)
                    continue
                await self._unload(m)
                return
        finally:
            m.timer = False

    async def actors(self) -> list[dict]:
        me = psutil.Process()
        rows = [{"name": "supervisor", "role": "supervisor", "pid": me.pid, "state": "ready", "models": [],
                 "queue_depth": 0, "rss_bytes": me.memory_info().rss, "restarts": 0}]
        for slot in self.slots.values():
            if slot.on_demand and slot.state == "stopped":
                continue  # a GGUF model's actor exists while the model is loaded
            status = await slot.client.status() if slot.client is not None else None
            rows.append({
                "name": slot.name, "role": slot.role, "pid": slot.pid, "state": slot.state,
                "models": [m.id for m in self._placed(slot) if m.state == "loaded"],
                "queue_depth": (status or {}).get("queue_depth", 0) + (status or {}).get("active", 0),
                "rss_bytes": _rss(slot.pid), "restarts": slot.restarts, "last_error": slot.last_error,
                "counters": status,
            })
        return rows


# transformers quantization methods, by the package that must be installed to load them
QUANTIZATION_PACKAGES = {"bitsandbytes": "bitsandbytes", "gptq": "gptqmodel", "awq": "awq", "hqq": "hqq",
                         "quanto": "optimum.quanto", "fp8": "torch", "compressed-tensors": "compressed_tensors"}


def _check_quantization(m: ModelState) -> None:
    """Refuse, before any weight moves, a checkpoint whose quantization this server cannot
    load (400 unsupported_quantization): an unknown method, or one whose package is absent."""
    config = _checkpoint_config(m.placement)
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return
    method = str(quant.get("quant_method", "unknown"))
    package = QUANTIZATION_PACKAGES.get(method)
    if package is None or importlib.util.find_spec(package.split(".")[0]) is None:
        raise GreenroomError("unsupported_quantization", f"model {m.id!r} is quantized with {method!r}, which this "
                             "server cannot load" + (f" (install {package})" if package else ""), "model")


def _checkpoint_config(placement: dict) -> dict:
    try:
        return json.loads((source_path(placement["source"], placement.get("cache_dir")) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def checkpoint_bytes(placement: dict) -> int | None:
    """About what a checkpoint takes once loaded: its weight files' size, halved when a
    float32 checkpoint is loaded in bfloat16 (on CUDA). None when it is not on disk yet (a
    demo model is built at its first load)."""
    path = source_path(placement["source"], placement.get("cache_dir"))
    if path.suffix == ".gguf":
        return path.stat().st_size if path.exists() else None
    files = [*path.glob("*.safetensors"), *path.glob("*.bin")]
    if not files:
        return None
    size = sum(f.stat().st_size for f in files)
    config = _checkpoint_config(placement)
    stored = str(config.get("dtype") or config.get("torch_dtype") or "")
    halved = placement["device"].startswith("cuda") and stored == "float32" and not placement.get("dtype")
    return size // 2 if halved else size


def _host_memory() -> dict:
    vm = psutil.virtual_memory()
    return {"device": "cpu", "free_bytes": vm.available, "total_bytes": vm.total}


def _device_of(actor: str) -> str:
    """gpuN → cuda:N, npuN → npu:N (OpenVINO's NPU pipeline), anything else → cpu."""
    for prefix, device in (("gpu", "cuda"), ("npu", "npu")):
        if actor.startswith(prefix) and actor[len(prefix):].isdigit():
            return f"{device}:{actor[len(prefix):]}"
    return "cpu"


def _rss(pid: int | None) -> int | None:
    try:
        return psutil.Process(pid).memory_info().rss if pid else None
    except psutil.Error:
        return None
