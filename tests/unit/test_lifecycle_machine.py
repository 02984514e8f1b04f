"""The model lifecycle as a state machine (supervisor/lifecycle.py), in-process, no actor
started: each engine actor is a stand-in at the far end of a real EngineClient's session
stream, answering as the engine actor's worker does — Load and Unload run FIFO behind the
requests sent before them, a Cancel ends a request, a StatusQuery reports the device's memory.
An on-demand (GGUF) actor's start and stop stand in for supervision's. Time is trio's
MockClock, jumping whenever every task waits, so grace periods and deadlines pass at once."""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import pytest
import trio
import trio.testing

from greenroom.config import Config
from greenroom.engines.base import ModelInfo
from greenroom.errors import GreenroomError
from greenroom.protocol import (
    Cancel,
    Done,
    Embed,
    Embedded,
    Events,
    Failed,
    Load,
    Status,
    StatusQuery,
    Unload,
    from_wire,
    to_wire,
)
from greenroom.supervisor.engine_client import EngineClient
from greenroom.supervisor.lifecycle import Lifecycle, Serving
from greenroom.supervisor.memory import free_memory
from greenroom.supervisor.placements import LoadState, ModelState, ModelTable, Placement
from greenroom.supervisor.slots import ActorSlot, SlotState, StartFailed

GRACE_S = 5.0
GIB = 2**30


def info(model: str) -> ModelInfo:
    return ModelInfo(model, "transformers", 2048, "float32", "cpu", 1)


class FakeActor:
    """An engine actor's end of one session stream. A request (Embed) runs until `finish` or
    a Cancel ends it. Loads and Unloads run one at a time, in order, each once every request
    sent before it has ended; a Load of a model not held takes `load_s` and answers
    `load_error` when one is set (of a model held: its info at once)."""

    def __init__(self, name: str, nursery: trio.Nursery, free_bytes: int = 64 * GIB):
        self.client = EngineClient(name, self)
        self.load_s = 1.0
        self.load_error: GreenroomError | None = None
        self.free_bytes = free_bytes
        self.loads = 0
        self.loaded: set[str] = set()
        self._running: dict[str, tuple[str, trio.Event]] = {}  # rid → (model, ended)
        self._out, self._in = trio.open_memory_channel(math.inf)
        self._jobs, jobs = trio.open_memory_channel(math.inf)
        nursery.start_soon(self.client.run)
        nursery.start_soon(self._worker, jobs)

    # the stream, as EngineClient uses it
    def __aiter__(self):
        return self._in

    async def send(self, wire: dict) -> None:
        msg = from_wire(wire)
        if isinstance(msg, Embed):
            self._running[msg.rid] = (msg.model, trio.Event())
        elif isinstance(msg, Cancel):
            self._end(msg.rid)
        elif isinstance(msg, StatusQuery):
            self._answer(
                Status(msg.rid, {"memory": {"device": "cpu", "free_bytes": self.free_bytes, "total_bytes": 64 * GIB}})
            )
        elif isinstance(msg, (Load, Unload)):
            self._jobs.send_nowait((msg, [ended for _, ended in self._running.values()]))

    async def _worker(self, jobs: trio.MemoryReceiveChannel) -> None:
        async for msg, before in jobs:
            for ended in before:
                await ended.wait()
            if isinstance(msg, Unload):
                self.loaded.discard(msg.model)
                self._answer(Done(msg.rid))
                continue
            model = msg.spec["id"]
            if model not in self.loaded:
                self.loads += 1
                await trio.sleep(self.load_s)
                if self.load_error is not None:
                    self._answer(Failed(msg.rid, self.load_error.to_wire()))
                    continue
                self.loaded.add(model)
            self._answer(Done(msg.rid, info(model)))

    def finish(self, model: str) -> None:
        """Every request for `model` running now completes."""
        for rid, (m, _) in list(self._running.items()):
            if m == model:
                self._answer(Embedded(rid, [], 1))
                self._end(rid)

    def _end(self, rid: str) -> None:
        if (running := self._running.pop(rid, None)) is not None:
            running[1].set()

    def _answer(self, event) -> None:
        self._out.send_nowait(to_wire(Events([event])))


class Machine:
    """A lifecycle over four models: "m" and "n" on engine actor "cpu" (up, holding
    nothing), "g" on on-demand actor "gguf:g" (stopped), whose start fails while `spawn_error`
    is set, and "a", placed with actor = "auto", whose candidates are "cpu" then a worker
    host's "hostb/gpu0" (up, holding nothing). `pushed`: the models the after-load hook ran for."""

    def __init__(self, nursery: trio.Nursery, config: Config, source: str):
        self.nursery = nursery
        self.table = ModelTable()
        self.lifecycle = Lifecycle(
            config,
            self.table,
            spawn=self._spawn,
            stop=self._stop,
            memory=free_memory,
            loaded=self._loaded,
            candidates=lambda m: [s for s in (self.cpu, self.gpu) if s.state == SlotState.READY or s is self.cpu],
        )
        self.actor = FakeActor("cpu", nursery)
        self.cpu = ActorSlot("cpu", "engine", state=SlotState.READY, client=self.actor.client)
        self.remote = FakeActor("hostb/gpu0", nursery)
        self.gpu = ActorSlot("hostb/gpu0", "engine", host="hostb", state=SlotState.READY, client=self.remote.client)
        self.gguf = ActorSlot.on_demand_slot("gguf:g")
        for slot, model, engine in (
            (self.cpu, "m", "transformers"),
            (self.cpu, "n", "transformers"),
            (self.gguf, "g", "llama.cpp"),
        ):
            self.table.add(ModelState(slot, Placement(model, source, engine, "cpu"), preload=False))
        auto = Placement("a", source, "transformers", "cpu", cache_dir=str(Path(source).parent))
        self.table.add(ModelState(self.cpu, auto, preload=False, auto=auto))
        for slot in (self.cpu, self.gpu):
            slot.ready.set()
            self.lifecycle.started(slot, {})  # as supervision reports the actor's start
        self.spawn_error: str | None = None
        self.spawns = 0
        self.pushed: list[str] = []

    def state(self, model: str) -> LoadState:
        return self.table.state_of(model).state

    async def request(self, model: str, results: list, **kwargs) -> None:
        """One request for `model`, as a route sends it: its final event lands in `results`."""
        client, _ = await self.lifecycle.client_for(model, **kwargs)
        async with client.submit(Embed(f"req-{uuid.uuid4().hex[:8]}", model, texts=["x"])) as events:
            results.append(await events.__anext__())

    async def _spawn(self, slot: ActorSlot) -> None:
        """As supervision starts one: after the previous life has ended, a life of 1 s's start."""
        await slot.stopped.wait()
        assert slot.client is None, "an on-demand actor started while its previous life runs"
        slot.state, slot.ready, slot.stopped = SlotState.STARTING, trio.Event(), trio.Event()  # this life's
        self.spawns += 1
        await trio.sleep(1.0)
        if self.spawn_error is not None:
            self._end(slot)
            raise StartFailed(self.spawn_error)
        slot.client, slot.state = FakeActor(slot.name, self.nursery).client, SlotState.READY
        self.lifecycle.started(slot, {p.id: info(p.id) for p in self.lifecycle.preloads(slot)})
        slot.ready.set()

    async def _stop(self, slot: ActorSlot) -> None:
        """As supervision stops one: its process takes 0.5 s to end, then its end is reported."""
        await trio.sleep(0.5)
        self._end(slot)

    def _end(self, slot: ActorSlot) -> None:
        slot.client, slot.state = None, SlotState.STOPPED
        self.lifecycle.stopped(slot)
        slot.ready.set()
        slot.stopped.set()

    async def _loaded(self, m: ModelState) -> None:
        self.pushed.append(m.id)


def run(scenario, tmp_path, **settings) -> None:
    """`scenario(machine)` under a MockClock, with the lifecycle running."""
    config = Config(graceful_unload_timeout_s=GRACE_S, ready_timeout_s=30.0, **settings)

    async def main():
        async with trio.open_nursery() as nursery:
            machine = Machine(nursery, config, str(tmp_path / "checkpoint"))
            await nursery.start(machine.lifecycle.run)
            await scenario(machine)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_request_loads_the_model(tmp_path):
    async def scenario(mc: Machine):
        assert mc.state("m") == LoadState.UNLOADED
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mc.lifecycle.client_for, "m")
            await trio.sleep(0.5)
            assert mc.state("m") == LoadState.LOADING
        client, got = await mc.lifecycle.client_for("m")
        assert client is mc.actor.client and mc.state("m") == LoadState.LOADED
        assert got == Serving(info("m"), "cpu", "single_engine_runtime")
        assert mc.actor.loaded == {"m"} and mc.pushed == ["m"]

    run(scenario, tmp_path)


def test_concurrent_requests_wait_for_one_load(tmp_path):
    async def scenario(mc: Machine):
        results = []
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(mc.request, "m", results)
            await trio.sleep(2.0)
            mc.actor.finish("m")
        assert len(results) == 5 and all(isinstance(r, Embedded) for r in results)
        assert mc.actor.loads == 1 and mc.pushed == ["m"]

    run(scenario, tmp_path)


def test_a_failed_load_returns_to_unloaded_with_its_error(tmp_path):
    async def scenario(mc: Machine):
        mc.actor.load_error = GreenroomError(
            "model_load_failed", "model 'm' could not be loaded: OSError: gone", "model"
        )
        errors = []

        async def ask():
            with pytest.raises(GreenroomError) as caught:
                await mc.lifecycle.client_for("m")
            errors.append(caught.value)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            nursery.start_soon(ask)
        assert [(e.code, e.message) for e in errors] == [
            ("model_load_failed", "model 'm' could not be loaded: OSError: gone")
        ] * 2
        assert mc.state("m") == LoadState.UNLOADED and mc.pushed == []
        mc.actor.load_error = None  # the next request loads it again
        await mc.lifecycle.client_for("m")
        assert mc.state("m") == LoadState.LOADED

    run(scenario, tmp_path)


def test_a_load_that_does_not_fit_is_refused_before_it_is_sent(tmp_path):
    async def scenario(mc: Machine):
        (tmp_path / "checkpoint").mkdir()
        (tmp_path / "checkpoint" / "model.safetensors").write_bytes(b"\0" * 4096)
        mc.actor.free_bytes = 1024
        with pytest.raises(GreenroomError) as caught:
            await mc.lifecycle.load("m")
        assert caught.value.code == "insufficient_memory" and "cpu (cpu) has 0.0 GiB free" in caught.value.message
        assert mc.actor.loads == 0 and mc.state("m") == LoadState.UNLOADED

    run(scenario, tmp_path)


def test_an_unload_waits_for_the_running_requests(tmp_path):
    async def scenario(mc: Machine):
        await mc.lifecycle.load("m")
        results = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mc.request, "m", results)
            await trio.sleep(0.1)
            nursery.start_soon(mc.lifecycle.unload, "m")
            await trio.sleep(2.0)
            assert mc.state("m") == LoadState.UNLOADING and results == [] and "m" in mc.actor.loaded
            mc.actor.finish("m")
            finished = trio.current_time()
        assert trio.current_time() == finished  # the unload ended with the request, before the grace period
        assert isinstance(results[0], Embedded)
        assert mc.state("m") == LoadState.UNLOADED and mc.actor.loaded == set()

    run(scenario, tmp_path)


def test_an_unload_cancels_requests_past_the_grace_period(tmp_path):
    async def scenario(mc: Machine):
        await mc.lifecycle.load("m")
        results = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mc.request, "m", results)
            await trio.sleep(0.1)
            started = trio.current_time()
            nursery.start_soon(mc.lifecycle.unload, "m")
            await trio.sleep(GRACE_S - 0.1)
            assert results == [] and mc.state("m") == LoadState.UNLOADING
        assert trio.current_time() - started == pytest.approx(GRACE_S)
        error = GreenroomError.from_wire(results[0].error)
        assert error.code == "model_busy"
        assert error.message == "model 'm' was unloaded before this request finished (graceful_unload_timeout_s = 5)"
        assert mc.state("m") == LoadState.UNLOADED and mc.actor.loaded == set()

    run(scenario, tmp_path)


def test_requests_during_an_unload_get_model_busy_or_wait(tmp_path):
    async def scenario(mc: Machine):
        await mc.lifecycle.load("m")
        await mc.lifecycle.load("n")
        results, waited = [], []

        async def wait_then_load():
            await mc.lifecycle.client_for("m", wait_unload=True)
            waited.append((trio.current_time(), mc.state("m")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(mc.request, "m", results)
            await trio.sleep(0.1)
            nursery.start_soon(mc.lifecycle.unload, "m")
            await trio.sleep(0.1)
            for model in ("m", "n"):  # every model of the actor: its unload runs in the engine's queue
                with pytest.raises(GreenroomError) as caught:
                    await mc.lifecycle.client_for(model)
                assert caught.value.code == "model_busy"
                assert caught.value.message == (
                    "a model is being unloaded from engine actor 'cpu'; retry once the unload finishes"
                )
            nursery.start_soon(wait_then_load)
            await trio.sleep(1.0)
            assert waited == []
            done = trio.current_time()
            mc.actor.finish("m")
        assert waited == [(done + 1.0, LoadState.LOADED)]  # after the unload, loaded again (one load's time)
        assert mc.actor.loads == 3

    run(scenario, tmp_path)


def test_a_keep_alive_deadline_unloads_an_idle_model(tmp_path):
    async def scenario(mc: Machine):
        await mc.lifecycle.load("m")
        mc.lifecycle.keep_alive("m", 5.0)
        await trio.sleep(4.9)
        assert mc.state("m") == LoadState.LOADED
        await trio.sleep(0.2)
        assert mc.state("m") == LoadState.UNLOADED and mc.actor.loaded == set()
        await mc.lifecycle.load("m")
        mc.lifecycle.keep_alive("m", -1)  # negative: kept loaded
        await trio.sleep(1000)
        assert mc.state("m") == LoadState.LOADED

    run(scenario, tmp_path)


def test_a_keep_alive_deadline_moves_past_a_running_request(tmp_path):
    async def scenario(mc: Machine):
        await mc.lifecycle.load("m")
        results = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mc.request, "m", results)
            await trio.sleep(0.1)
            start = trio.current_time()
            mc.lifecycle.keep_alive("m", 2.0)
            await trio.sleep(3.0)  # past the deadline: the request still runs, so the model is not idle
            assert mc.state("m") == LoadState.LOADED and results == []
            mc.actor.finish("m")
        await trio.sleep(start + 4.0 - trio.current_time() - 0.1)  # the deadline moved 2 s on at 2 s
        assert mc.state("m") == LoadState.LOADED
        await trio.sleep(0.2)
        assert mc.state("m") == LoadState.UNLOADED

    run(scenario, tmp_path)


@pytest.mark.parametrize(("first", "then", "unloaded_at"), [(10.0, 2.0, 2.0), (2.0, 10.0, 10.0), (2.0, None, None)])
def test_a_later_keep_alive_moves_the_deadline(tmp_path, first, then, unloaded_at):
    async def scenario(mc: Machine):
        await mc.lifecycle.load("m")
        mc.lifecycle.keep_alive("m", first)
        mc.lifecycle.keep_alive("m", then)
        await trio.sleep((unloaded_at or 1000.0) - 0.1)
        assert mc.state("m") == LoadState.LOADED
        await trio.sleep(0.2)
        assert mc.state("m") == (LoadState.LOADED if unloaded_at is None else LoadState.UNLOADED)

    run(scenario, tmp_path)


def test_idle_unload_counts_from_the_last_request(tmp_path):
    async def scenario(mc: Machine):
        await mc.lifecycle.client_for("m")  # loads it (1 s)
        await trio.sleep(1.0)
        await mc.lifecycle.client_for("m")  # idle from now on: 3 s
        await trio.sleep(2.9)
        assert mc.state("m") == LoadState.LOADED
        await trio.sleep(0.2)
        assert mc.state("m") == LoadState.UNLOADED

    run(scenario, tmp_path, idle_unload_s=3.0)


def test_an_on_demand_actor_starts_with_its_model_and_stops_with_it(tmp_path):
    async def scenario(mc: Machine):
        client, got = await mc.lifecycle.client_for("g")
        assert mc.spawns == 1 and mc.gguf.client is client and got.actor == "gguf:g"
        assert mc.state("g") == LoadState.LOADED
        await mc.lifecycle.client_for("g")
        assert mc.spawns == 1
        await mc.lifecycle.unload("g")
        assert mc.state("g") == LoadState.UNLOADED and mc.gguf.state == SlotState.STOPPED and mc.gguf.client is None

    run(scenario, tmp_path)


def test_an_on_demand_actor_failing_to_start_is_model_load_failed(tmp_path):
    async def scenario(mc: Machine):
        mc.spawn_error = "RuntimeError: load failed: the file is not a GGUF file"
        with pytest.raises(GreenroomError) as caught:
            await mc.lifecycle.client_for("g")
        assert caught.value.code == "model_load_failed"
        assert caught.value.message == (
            "model 'g' could not be loaded: RuntimeError: load failed: the file is not a GGUF file"
        )
        assert mc.state("g") == LoadState.UNLOADED
        mc.spawn_error = None  # the next request starts it again
        await mc.lifecycle.client_for("g")
        assert mc.spawns == 2 and mc.state("g") == LoadState.LOADED

    run(scenario, tmp_path)


def test_an_auto_placement_loads_where_it_fits_and_moves_when_that_host_is_lost(tmp_path):
    """actor = "auto": this host's actor while the model fits there, else a worker host's
    actor with room, measured there; that host lost, the next load chooses again."""

    async def scenario(mc: Machine):
        (tmp_path / "checkpoint").mkdir()
        (tmp_path / "checkpoint" / "model.safetensors").write_bytes(b"\0" * 4096)
        client, got = await mc.lifecycle.client_for("a")
        assert client is mc.actor.client and got.actor == "cpu" and mc.actor.loaded == {"a"}
        placed = mc.table.state_of("a").placement
        assert placed.device == "cpu" and placed.cache_dir == str(tmp_path)
        await mc.lifecycle.unload("a")
        mc.actor.free_bytes = 1024  # this host is full now: the next load goes to the worker host
        client, got = await mc.lifecycle.client_for("a")
        assert client is mc.remote.client and got.actor == "hostb/gpu0" and mc.remote.loaded == {"a"}
        placed = mc.table.state_of("a").placement
        assert placed.device == "cuda:0" and placed.cache_dir is None  # the worker host's own cache
        assert mc.pushed == ["a", "a"] and mc.actor.loads == 1
        # the worker host is lost (supervision reports its actor stopped): back here once it fits
        mc.gpu.state, mc.gpu.client = SlotState.OFFLINE, None
        mc.lifecycle.stopped(mc.gpu)
        with pytest.raises(GreenroomError) as caught:
            await mc.lifecycle.client_for("a")
        assert caught.value.code == "insufficient_memory" and "cpu (cpu) has 0.0 GiB free" in caught.value.message
        assert mc.state("a") == LoadState.UNLOADED
        mc.actor.free_bytes = 64 * GIB
        client, got = await mc.lifecycle.client_for("a")
        assert client is mc.actor.client and got.actor == "cpu"
        assert mc.table.state_of("a").placement.cache_dir == str(tmp_path)

    run(scenario, tmp_path)


def test_concurrent_requests_for_an_auto_placement_wait_for_one_choice(tmp_path):
    async def scenario(mc: Machine):
        mc.actor.free_bytes = 0
        (tmp_path / "checkpoint").mkdir()
        (tmp_path / "checkpoint" / "model.safetensors").write_bytes(b"\0" * 4096)
        results = []
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(mc.request, "a", results)
            await trio.sleep(0.5)
            assert mc.state("a") == LoadState.LOADING
            await trio.sleep(1.0)  # the load (1 s) is done
            mc.remote.finish("a")
        assert len(results) == 3 and mc.remote.loads == 1 and mc.actor.loads == 0

    run(scenario, tmp_path)


@pytest.mark.parametrize("model", ["g", "m"])
def test_requests_racing_an_unload_are_each_answered(tmp_path, model):
    """Issue 28 item 0: while clients loop requests for a model, keep_alive 0 unloads it — a
    GGUF model ("g") with its actor, which takes 0.5 s to stop; a transformers one ("m") on
    its engine actor. A request arriving in the GGUF actor's stop used to start its next life
    at once, and the old life's end then marked the model unloaded under that load, so the
    next request started the actor a second time and waited for ever. Every request gets an
    answer now, within a bound: the model (loaded again once per unload), or model_busy on /v1."""

    async def scenario(mc: Machine):
        await mc.lifecycle.client_for(model)
        answers: list[str] = []

        async def ask(wait_unload: bool) -> None:
            with trio.fail_after(5.0):  # a load takes 1 s, a stop 0.5 s
                try:
                    await mc.lifecycle.client_for(model, wait_unload=wait_unload)
                    answers.append("served")
                except GreenroomError as exc:
                    assert exc.code == "model_busy" and not wait_unload, exc
                    answers.append("busy")

        async def loop(wait_unload: bool) -> None:
            while True:
                await ask(wait_unload)
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(loop, False)  # an OpenAI client, retrying model_busy
            nursery.start_soon(loop, True)  # an Ollama client
            for _ in range(3):
                await trio.sleep(0.3)
                await mc.lifecycle.unload(model)
                assert mc.state(model) == LoadState.UNLOADED and mc.gguf.state == SlotState.STOPPED
                await ask(True)
                await ask(False)
            nursery.cancel_scope.cancel()
        assert (mc.spawns if model == "g" else mc.actor.loads) == 4 and mc.state(model) == LoadState.LOADED
        assert answers.count("served") > 20

    run(scenario, tmp_path)


def test_two_unloads_at_once_and_an_unload_while_the_load_starts(tmp_path):
    """Two unloads of a GGUF model at once stop its actor once; an unload that arrives while
    its actor starts waits for the load, then unloads it; the next request loads it again."""

    async def scenario(mc: Machine):
        await mc.lifecycle.client_for("g")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mc.lifecycle.unload, "g")
            nursery.start_soon(mc.lifecycle.unload, "g")
        assert mc.state("g") == LoadState.UNLOADED and mc.spawns == 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mc.lifecycle.client_for, "g")
            await trio.sleep(0.5)
            assert mc.state("g") == LoadState.LOADING
            with trio.fail_after(3.0):
                await mc.lifecycle.unload("g")
        assert mc.state("g") == LoadState.UNLOADED and mc.gguf.client is None
        with trio.fail_after(3.0):
            await mc.lifecycle.client_for("g")
        assert mc.spawns == 3 and mc.state("g") == LoadState.LOADED

    run(scenario, tmp_path)


def test_concurrent_first_requests_start_an_on_demand_actor_once(tmp_path):
    """Requests that find a GGUF model's first load under way wait for that start (1 s), not
    for the ready timeout: a resting actor's `ready` is set, as after each life."""

    async def scenario(mc: Machine):
        answered = []

        async def ask():
            with trio.fail_after(2.0):
                answered.append(await mc.lifecycle.client_for("g"))

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(ask)
        assert len(answered) == 3 and mc.spawns == 1

    run(scenario, tmp_path)


def test_an_unload_during_its_actors_restart_unloads_what_the_restart_loads(tmp_path):
    """keep_alive 0 while a GGUF model's actor restarts (it crashed; supervision starts it
    again, holding its model): the unload waits for the restart and unloads the model there,
    rather than answering "unloaded" for a model its next life holds."""

    async def scenario(mc: Machine):
        await mc.lifecycle.client_for("g")
        mc.gguf.client, mc.gguf.state, mc.gguf.ready = None, SlotState.RESTARTING, trio.Event()  # crashed
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mc.lifecycle.unload, "g")
            await trio.sleep(1.0)  # the restart (supervision's): its model again
            mc.gguf.client, mc.gguf.state = FakeActor("gguf:g", mc.nursery).client, SlotState.READY
            mc.lifecycle.started(mc.gguf, {"g": info("g")})
            mc.gguf.ready.set()
        assert mc.state("g") == LoadState.UNLOADED and mc.gguf.state == SlotState.STOPPED

    run(scenario, tmp_path)
