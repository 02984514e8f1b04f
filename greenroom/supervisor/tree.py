"""The actor tree: the actor slots and the models placed on them, composed from the parts
that own each concern — supervision.py (one task per actor, restarts), lifecycle.py (every
model state transition), routing.py (which replica a request goes to), memory.py (whether a
load fits), steering_relay.py (steering to the coordinator and the engines) — over the data
in slots.py and placements.py. The front end (http/, store/) talks to the tree only."""

from __future__ import annotations

import logging
import os
import time

import trio

from greenroom import __version__
from greenroom.config import Config, ModelConfig, detect_engine_actors, detect_npu_actors
from greenroom.engines.llama_cpp import gguf_files
from greenroom.errors import GreenroomError
from greenroom.hosts.tls import token_from_env
from greenroom.store.dashboards import DashboardStore
from greenroom.supervisor import memory
from greenroom.supervisor.lifecycle import Lifecycle
from greenroom.supervisor.monitoring import Monitoring
from greenroom.supervisor.placements import LoadState, ModelState, ModelTable, Placement, device_of
from greenroom.supervisor.slots import DOWN, ActorSlot, SlotState
from greenroom.supervisor.steering_relay import SteeringRelay
from greenroom.supervisor.supervision import Supervisor
from greenroom.supervisor.workers import WorkerHosts

log = logging.getLogger("greenroom.supervisor")


class Tree:
    def __init__(self, config: Config):
        self.config = config
        self.started_at = time.time()
        self.listening: list[str] = []  # the front end's URLs, once it listens (serve.py)
        names = detect_engine_actors() if config.engine_actors == "auto" else list(config.engine_actors)
        names += detect_npu_actors() if config.npu_actors == "auto" else list(config.npu_actors)
        self.slots: dict[str, ActorSlot] = {"steering": ActorSlot("steering", "steering")}
        for name in names:
            self.slots[name] = ActorSlot(name, "engine")
        self._engine_actors = names
        # where an auto placement is while no load has chosen an actor and this host has none
        self._unplaced = ActorSlot(
            "auto", "engine", state=SlotState.OFFLINE, last_error="it loads where a worker host has room"
        )
        self.workers = (
            WorkerHosts(config.workers_listen, token_from_env(), config.worker_timeout_s, self._adopt, self._rest)
            if config.workers_listen
            else None
        )
        self.table = ModelTable()
        self.replicas = self.table.replicas  # each model's placements, preferred first
        self.relay = SteeringRelay(
            self.table,
            self.slots["steering"],
            config.ready_timeout_s,
            {model.id: model.sae for model in config.models if model.sae},
        )
        # supervision reports each actor's start to the lifecycle, which starts on-demand actors through it
        self.lifecycle = Lifecycle(
            config,
            self.table,
            spawn=lambda slot: self.supervisor.start(slot),
            stop=lambda slot: self.supervisor.stop(slot),
            memory=memory.free_memory,
            loaded=self.relay.push_steering_quietly,
            candidates=self._auto_candidates,
        )
        self.supervisor = Supervisor(config, self.slots, self.lifecycle, self.relay.push_steering_quietly, self.workers)
        self.monitoring = Monitoring(config.cache_dir, self.relay.steers)  # SAE monitoring: its configuration, records
        # The parts' own methods, reached through the tree (the front end talks to the tree only)
        # without a forwarding layer in between: a request runs no code of the tree's.
        self.resolve, self.capabilities = self.table.resolve, self.table.capabilities
        self.replicas_of, self.state_of = self.table.replicas_of, self.table.state_of
        self.client_for, self.load, self.unload = self.lifecycle.client_for, self.lifecycle.load, self.lifecycle.unload
        self.keep_alive, self.actors = self.lifecycle.keep_alive, self.supervisor.actors
        self.last_steering_states = self.relay.last_steering_states  # the relay's one cache, not a copy
        self.steering, self.steers, self.steerable = self.relay.steering, self.relay.steers, self.relay.steerable
        self.require_steering, self.push_model_steering = self.relay.require_steering, self.relay.push_model_steering
        self.steering_live = self.relay.steering_live
        self.dashboards = DashboardStore(config.cache_dir)  # feature dashboards, their jobs, labels
        for model in config.models:  # the same id on several actors: replicas, preferred first
            if model.source is not None:  # else a file model_dirs holds: placed once found (_discover)
                self._place(model, model.source)
        # model_dirs' GGUF files are placed by run(), after the front end listens (_discover)
        self.discovered = trio.Event()

    def _place(self, model: ModelConfig, source: str) -> None:
        self.add_model(
            model.id,
            source,
            model.engine,
            model.actor,
            model.dtype,
            model.preload,
            n_ctx=model.n_ctx,
            threads=model.threads,
            replica=model.id in self.replicas,
            chat_template=model.chat_template,
        )

    def add_model(
        self,
        model_id: str,
        source: str,
        engine: str = "transformers",
        actor: str = "auto",
        dtype: str | None = None,
        preload: bool = False,
        n_ctx: int | None = None,
        threads: int | None = None,
        replica: bool = False,
        chat_template: str | None = None,
        defaults: dict | None = None,
    ) -> ModelState:
        """Place a model: on an engine actor (transformers), or on an actor of its own that
        is spawned when it loads (llama.cpp). Loaded on demand unless `preload` (which only
        an actor's start honours). `replica`: one more placement of a placed model, on
        another actor; requests are routed among them (routing.py). `defaults`: a created
        model's (http/ollama/ollama_defaults.py)."""
        if (model_id in self.replicas) != replica:
            raise GreenroomError(
                "invalid_parameter",
                f"model {model_id!r} already exists" if not replica else f"model {model_id!r} has no first placement",
                "model",
            )
        common = {
            "id": model_id,
            "source": source,
            "engine": engine,
            "dtype": dtype,
            "cache_dir": self.config.cache_dir,
            "chat_template": chat_template,
            "defaults": defaults,
        }
        auto = actor == "auto" and engine != "llama.cpp"  # llama.cpp's "auto" is this host
        if engine == "llama.cpp":
            host = None if actor == "auto" else actor  # a worker host's name: its actor is spawned there
            if host is not None:
                self._require_workers(model_id, host)
                common["cache_dir"] = None  # the worker's own cache
            name = f"gguf:{model_id}" + (f"#{len(self.replicas[model_id])}" if replica else "")
            name = f"{host}/{name}" if host else name
            slot = ActorSlot.on_demand_slot(name, host)
            slot.state = self.supervisor.resting(slot)
            self.slots[slot.name] = slot
            placement = Placement(
                **common,
                device="cpu",
                n_ctx=self.config.gguf_n_ctx if n_ctx is None else n_ctx,
                threads=threads or self.config.gguf_threads or None,
                parallel=self.config.gguf_parallel,
                cache_ram=None if self.config.gguf_cache_ram_mib is None else self.config.gguf_cache_ram_mib * 2**20,
            )
            preload = False
        else:
            if auto:
                self._check_auto(model_id, replica)
                # on this host's first engine actor until its first load chooses (Lifecycle._place);
                # with none here, no actor starts holding it: loaded on demand, as a GGUF model is
                actor = self._engine_actors[0] if self._engine_actors else self._unplaced.name
                preload = preload and bool(self._engine_actors)
            elif "/" in actor:  # a worker host's actor: its slot waits for the host to join
                host = actor.split("/", 1)[0]
                self._require_workers(model_id, host)
                self.slots.setdefault(actor, ActorSlot(actor, "engine", host=host, state=SlotState.OFFLINE))
                common["cache_dir"] = None
            slot = self._unplaced if actor == self._unplaced.name else self.slots.get(actor)
            if slot is None or slot.role != "engine" or slot.on_demand:
                raise ValueError(f"model {model_id!r} is placed on unknown engine actor {actor!r}")
            if any(r.slot is slot for r in self.replicas.get(model_id, ())):
                raise ValueError(f"model {model_id!r} is placed twice on engine actor {actor!r}")
            transformers = (
                {
                    "prefix_cache_tokens": self.config.prefix_cache_tokens,
                    "fixed_shape": self.config.fixed_shape,
                    "fixed_shape_slots": self.config.fixed_shape_slots,
                    "fixed_shape_length": self.config.fixed_shape_length,
                }
                if engine == "transformers"
                else {}
            )
            placement = Placement(**common, device=device_of(slot.name), **transformers)
        m = ModelState(slot, placement, preload, auto=placement if auto else None)
        self.table.add(m)
        return m

    def _check_auto(self, model_id: str, replica: bool) -> None:
        if replica:
            raise ValueError(f'model {model_id!r}: a replica names its actor ("cpu", "hostb/gpu0"), not "auto"')
        if not self._engine_actors and self.workers is None:
            raise ValueError(
                f'model {model_id!r}: actor = "auto" loads on this host\'s first engine actor or on a worker '
                "host's, and this host has none (engine_actors = []) and takes no workers (workers_listen)"
            )

    def _auto_candidates(self, m: ModelState) -> list[ActorSlot]:
        """Where an auto placement may load, preferred first: this host's first engine actor,
        then the worker hosts' engine actors up now, cards first — less those holding another
        placement of the model."""
        local = [self.slots[self._engine_actors[0]]] if self._engine_actors else []
        remote = [
            s
            for s in self.slots.values()
            if s.host is not None
            and not s.on_demand
            and s.state == SlotState.READY
            and not device_of(s.name).startswith("npu")
        ]
        remote.sort(key=lambda s: not device_of(s.name).startswith("cuda"))
        taken = {r.slot.name for r in self.replicas.get(m.id, ()) if r is not m}
        return [s for s in local + remote if s.name not in taken]

    def _require_workers(self, model_id: str, host: str) -> None:
        if self.workers is None:
            raise ValueError(f"model {model_id!r} is placed on worker host {host!r}, but workers_listen is not set")
        if "/" in host or not host:
            raise ValueError(f"model {model_id!r}: {host!r} is not a worker host's name")

    def _adopt(self, host: str, actors: list[str]) -> None:
        """A worker host joined offering `actors`: the ones no model named yet get slots,
        supervised from now; its GGUF models' actors can start again."""
        for actor in actors:
            name = f"{host}/{actor}"
            if name not in self.slots:
                self.slots[name] = ActorSlot(name, "engine", host=host, state=SlotState.OFFLINE)
                self.supervisor.adopt(self.slots[name])
        self._rest(host)

    def _rest(self, host: str) -> None:
        """A worker host joined or was lost: its GGUF models' actors that are not running are
        stopped or offline by it (supervision sets the running ones' as they end)."""
        for slot in self.slots.values():
            if slot.host == host and slot.on_demand and slot.state in (SlotState.STOPPED, SlotState.OFFLINE):
                slot.state = self.supervisor.resting(slot)

    async def remove_model(self, model_id: str) -> None:
        """Unload (gracefully) and forget a model; its own actor, if it had one, goes too."""
        await self.lifecycle.unload(model_id)
        for m in self.table.remove(model_id):
            if m.slot.on_demand:
                del self.slots[m.slot.name]

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.lifecycle.run)  # keep-alive timers
            await nursery.start(self.supervisor.run)  # one task per actor; on-demand ones later
            if self.workers is not None:
                await nursery.start(self.workers.serve)
            nursery.start_soon(self.relay.attach_default_saes)
            nursery.start_soon(self._discover)
            task_status.started()

    async def _discover(self) -> None:
        """Place the GGUF files below model_dirs, their headers read in a worker thread: no
        file delays listening (/health says loading until they are placed)."""
        try:
            found = await trio.to_thread.run_sync(gguf_files.discover, self.config.model_dirs)
            # a file some model already serves is not served again under its found name
            served = {m.placement.path().resolve() for ms in self.replicas.values() for m in ms}
            entries = [m for m in self.config.models if m.source is None]  # each configures a found file
            for model_id, path in found:
                configured = [m for m in entries if m.id == model_id]
                for model in configured:
                    self._place(model, str(path))
                if not configured and model_id not in self.replicas and path.resolve() not in served:
                    self.add_model(model_id, str(path), "llama.cpp")
            for model_id in dict.fromkeys(m.id for m in entries if m.id not in self.replicas):
                log.error("model %r has no source and no GGUF file below model_dirs is named so: not served", model_id)
        finally:
            self.discovered.set()

    # queries ----------------------------------------------------------------------------
    @property
    def model_states(self) -> dict[str, ModelState]:
        """Each model's preferred placement."""
        return self.table.preferred()

    @property
    def loading(self) -> bool:
        return not self.discovered.is_set() or any(
            s.state == SlotState.STARTING and not s.on_demand and s.host is None for s in self.slots.values()
        )

    @property
    def locked_model(self) -> str | None:
        """The model locked for steering (steering_relay.py): /v1/models lists it alone."""
        return self.relay.locked_model

    def model_ids(self) -> list[str]:
        return list(self.replicas)

    def models(self) -> list[dict]:
        """The available models — loaded, loading, or ready to load on demand — with the
        preferred placement's actor and state; a model none of whose actors is running or
        able to start is not listed. `replicas` lists every placement when there are several."""
        out = []
        for model_id, replicas in self.replicas.items():
            rows = []
            for m in replicas:
                choosing = m.auto is not None and m.state == LoadState.UNLOADED  # its next load picks the actor
                if all(s.state in DOWN for s in (self._auto_candidates(m) if choosing else [m.slot])):
                    continue
                up = choosing or m.slot.state in (SlotState.READY, SlotState.UNRESPONSIVE, SlotState.STOPPED)
                rows.append(
                    {
                        "actor": m.slot.name,  # an auto placement's: where it last loaded ("auto": nowhere yet)
                        "engine": m.placement.engine,
                        "device": m.placement.device,
                        "state": m.shown if up else "loading",
                        # what it takes on its device, as its actor reported after loading it
                        "footprint_bytes": m.info.footprint_bytes if m.info is not None else None,
                    }
                )
            if rows:
                out.append({"id": model_id, **rows[0], **({"replicas": rows} if len(replicas) > 1 else {})})
        return out

    def placement(self, model: str) -> tuple[ActorSlot, Placement]:
        """The actor slot and placement serving `model`, or 404 model_not_found."""
        m = self.table.state_of(model)
        return m.slot, m.placement

    def server(self) -> dict:
        """What `greenroom ps` says of the server itself."""
        return {
            "version": __version__,
            "pid": os.getpid(),
            "listening": self.listening,
            "started_at": self.started_at,
            "uptime_s": round(time.time() - self.started_at, 1),
            "limits": self.lifecycle.limits(),
            "devices": self.lifecycle.devices(),
        }
