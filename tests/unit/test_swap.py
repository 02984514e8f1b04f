"""The swap, on the lifecycle state machine (test_lifecycle_machine.py's stand-ins: a real
EngineClient, fake actors, trio's MockClock): each model's checkpoint is 1 GiB on paper, and
the device's memory_budget or max_loaded_models decide how many fit. "m" and "n" are on the
`cpu` engine actor; "g" is a GGUF model in an on-demand actor, on the same memory."""

from __future__ import annotations

import pytest
import trio

from greenroom import metrics
from greenroom.errors import GreenroomError
from greenroom.protocol import Embedded
from greenroom.supervisor.placements import LoadState

from .test_lifecycle_machine import GIB, Machine, run


@pytest.fixture
def one_gib_models(tmp_path):
    (tmp_path / "checkpoint").mkdir()
    with open(tmp_path / "checkpoint" / "model.safetensors", "wb") as f:
        f.truncate(GIB)  # sparse: 1 GiB on paper
    return tmp_path


def evictions(model: str) -> float:
    return metrics.REGISTRY.get_sample_value("greenroom_model_events_total", {"model": model, "event": "evicted"}) or 0


async def use(mc: Machine, model: str) -> None:
    """A request for `model` (on the `cpu` actor) that completes, then time enough for it to count as idle."""
    results = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mc.request, model, results)
        await trio.sleep(1.5)
        mc.actor.finish(model)
    await trio.sleep(2.0)


def test_a_load_that_does_not_fit_unloads_the_least_recently_used_idle_model(tmp_path):
    async def scenario(mc: Machine):
        before = evictions("m")
        await use(mc, "m")
        await use(mc, "n")
        assert {mc.state("m"), mc.state("n")} == {LoadState.LOADED}
        await mc.lifecycle.client_for("g")  # a third model on the device: m, used longest ago, goes
        assert (mc.state("m"), mc.state("n"), mc.state("g")) == (LoadState.UNLOADED, LoadState.LOADED, LoadState.LOADED)
        assert mc.actor.loaded == {"n"} and evictions("m") == before + 1

    run(scenario, tmp_path, max_loaded_models=2)


def test_a_busy_model_is_waited_for_never_cut(one_gib_models):
    async def scenario(mc: Machine):
        waits = metrics.REGISTRY.get_sample_value("greenroom_swap_waits_total", {"device": "cpu"}) or 0
        results = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mc.request, "m", results)  # loads m, then runs until finished
            await trio.sleep(3.0)
            nursery.start_soon(mc.lifecycle.client_for, "n")
            await trio.sleep(20.0)
            assert mc.state("m") == LoadState.LOADED and mc.state("n") == LoadState.LOADING and results == []
            mc.actor.finish("m")
        assert isinstance(results[0], Embedded)  # answered, not cancelled
        assert (mc.state("m"), mc.state("n")) == (LoadState.UNLOADED, LoadState.LOADED)
        assert metrics.REGISTRY.get_sample_value("greenroom_swap_waits_total", {"device": "cpu"}) == waits + 1

    run(scenario, one_gib_models, memory_budget="1.5GiB")


def test_the_wait_for_a_busy_model_is_bounded_by_the_request_timeout(one_gib_models):
    async def scenario(mc: Machine):
        results = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mc.request, "m", results)
            await trio.sleep(3.0)
            with pytest.raises(GreenroomError) as caught:
                await mc.lifecycle.client_for("n")
            assert caught.value.code == "model_busy" and "after 10 s" in caught.value.message
            assert (mc.state("m"), mc.state("n")) == (LoadState.LOADED, LoadState.UNLOADED)
            mc.actor.finish("m")
        await use(mc, "m")  # m is served again: the swap given up left nothing behind
        assert isinstance(results[0], Embedded) and mc.actor.loads == 1

    run(scenario, one_gib_models, memory_budget="1.5GiB", request_timeout_s=10.0)


def test_max_loaded_models_caps_the_device_whatever_its_memory(tmp_path):
    async def scenario(mc: Machine):
        await use(mc, "m")
        await use(mc, "n")
        assert (mc.state("m"), mc.state("n")) == (LoadState.UNLOADED, LoadState.LOADED)

    run(scenario, tmp_path, max_loaded_models=1)  # no checkpoint on disk: the size is unknown, the count decides


def test_nothing_that_may_go_makes_room_refused_with_the_figures(one_gib_models):
    async def scenario(mc: Machine):
        await use(mc, "m")
        mc.lifecycle.keep_alive("m", -1)  # pinned, and evict_pinned = false keeps it
        with pytest.raises(GreenroomError) as caught:
            await mc.lifecycle.client_for("n")
        assert caught.value.code == "insufficient_memory"
        assert caught.value.message == (
            "model 'n' needs about 1.0 GiB; cpu (cpu) has 0.5 GiB free of 64.0 GiB (memory_budget 1.5 GiB); "
            "kept loaded: m"
        )
        assert (mc.state("m"), mc.state("n"), mc.actor.loads) == (LoadState.LOADED, LoadState.UNLOADED, 1)

    run(scenario, one_gib_models, memory_budget="1.5GiB", evict_pinned=False)


def test_a_pinned_model_goes_last_but_goes_by_default(one_gib_models):
    async def scenario(mc: Machine):
        await use(mc, "m")
        mc.lifecycle.keep_alive("m", -1)
        await use(mc, "n")  # m makes room though pinned: nothing else could
        assert (mc.state("m"), mc.state("n")) == (LoadState.UNLOADED, LoadState.LOADED)

    run(scenario, one_gib_models, memory_budget="1.5GiB")


def test_a_load_failing_after_the_unload_is_model_load_failed(one_gib_models):
    async def scenario(mc: Machine):
        await use(mc, "m")
        mc.actor.load_error = GreenroomError(
            "model_load_failed", "model 'n' could not be loaded: out of memory", "model"
        )
        with pytest.raises(GreenroomError) as caught:
            await mc.lifecycle.client_for("n")
        assert (caught.value.code, caught.value.status) == ("model_load_failed", 500)
        assert (mc.state("m"), mc.state("n")) == (LoadState.UNLOADED, LoadState.UNLOADED)

    run(scenario, one_gib_models, memory_budget="1.5GiB")


def test_two_models_that_do_not_fit_together_take_turns_without_thrashing(one_gib_models):
    async def scenario(mc: Machine):
        results = {"m": [], "n": []}

        async def finisher():  # each request runs half a second
            while True:
                await trio.sleep(0.5)
                mc.actor.finish("m")
                mc.actor.finish("n")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(finisher)
            async with trio.open_nursery() as requests:
                for i in range(20):
                    model = "mn"[i % 2]
                    requests.start_soon(mc.request, model, results[model])
                    await trio.sleep(0.1)  # arriving interleaved
            nursery.cancel_scope.cancel()
        assert [len(results["m"]), len(results["n"])] == [10, 10]
        assert all(isinstance(r, Embedded) for r in results["m"] + results["n"])
        assert mc.actor.loads <= 4  # each swap serves every request queued for its model

    run(scenario, one_gib_models, memory_budget="1.5GiB")


def test_an_auto_placement_makes_room_on_this_host_too(tmp_path):
    async def scenario(mc: Machine):
        await use(mc, "m")
        await mc.lifecycle.client_for("a")  # placed on this host's `cpu`, where m makes room
        assert (mc.state("m"), mc.state("a"), mc.table.state_of("a").slot) == (
            LoadState.UNLOADED,
            LoadState.LOADED,
            mc.cpu,
        )

    run(scenario, tmp_path, max_loaded_models=1)
