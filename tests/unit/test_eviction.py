"""The swap's policy (supervisor/eviction.py) as a table: a device's figures and what is loaded
there → load now, unload these first (waiting for the busy ones), or refuse with figures."""

from __future__ import annotations

import pytest

from greenroom.supervisor.eviction import Device, Evict, Fits, Refuse, Resident, plan

GIB = 2**30


def resident(id, gib=1.0, busy=False, pinned=False, used=0.0, loading=False) -> Resident:
    return Resident(id, int(gib * GIB), busy, pinned, used, loading)


CPU = Device("cpu (cpu)", free=None, total=None, budget=int(2.5 * GIB))


@pytest.mark.parametrize(
    ("device", "residents", "expected"),
    [
        (CPU, [resident("a")], Fits()),  # 1 + 1 ≤ 2.5
        (CPU, [resident("a", used=5), resident("b", used=3)], Evict(("b",), wait=False)),  # least recently used
        (CPU, [resident("a", used=1, busy=True), resident("b", used=3)], Evict(("b",), wait=False)),  # idle first
        (CPU, [resident("a", used=1, pinned=True), resident("b", used=3)], Evict(("b",), wait=False)),  # pinned last
        (CPU, [resident("a", busy=True, used=5), resident("b", busy=True, used=3)], Evict(("b",), wait=True)),
        (CPU, [resident("a", pinned=True), resident("b", pinned=True, used=1)], Evict(("a",), wait=False)),
        # what it takes: the smallest LRU prefix that makes room
        (
            CPU,
            [resident("a", 0.5, used=1), resident("b", 0.5, used=2), resident("c", 1.0, used=3)],
            Evict(("a",), False),
        ),
        (
            Device("gpu0 (cuda:0)", free=int(0.5 * GIB), total=8 * GIB),
            [resident("a", 2, used=1), resident("b", 3, used=2)],
            Evict(("a",), wait=False),  # the card's own free figure, plus what going frees
        ),
        (
            Device("cpu", free=8 * GIB, total=8 * GIB, max_loaded=2),
            [resident("a", 0.1), resident("b", 0.1, used=1)],
            Evict(("a",), False),
        ),
        (
            Device("cpu", free=8 * GIB, total=8 * GIB, max_loaded=3),
            [resident("a", 0.1), resident("b", 0.1, used=1)],
            Fits(),
        ),
        (Device("cpu", free=None, total=None), [resident("a", 100)], Fits()),  # nothing known: nothing to refuse
    ],
)
def test_what_makes_room(device, residents, expected):
    assert plan("new", GIB, device, residents, evict_pinned=True) == expected


def test_a_model_too_big_for_the_empty_device_is_refused_with_its_figures():
    got = plan("big", 3 * GIB, CPU, [resident("a"), resident("b", busy=True)], evict_pinned=True)
    assert isinstance(got, Refuse)
    assert got.message == (
        "model 'big' needs about 3.0 GiB; cpu (cpu) has 2.5 GiB free with every model that may go unloaded "
        "(memory_budget 2.5 GiB)"
    )


def test_pinned_models_stay_when_so_configured_and_the_refusal_names_them():
    residents = [resident("a", pinned=True), resident("b", pinned=True, used=1)]
    got = plan("new", GIB, CPU, residents, evict_pinned=False)
    assert isinstance(got, Refuse) and got.message.endswith("; kept loaded: a, b")
    assert "has 0.5 GiB free" in got.message


def test_a_loading_model_holds_its_room_and_cannot_go():
    got = plan("new", 2 * GIB, CPU, [resident("a", loading=True)], evict_pinned=True)
    assert isinstance(got, Refuse) and "kept loaded: a" in got.message


def test_an_unknown_size_is_held_to_the_count_alone():
    device = Device("cpu", free=None, total=None, max_loaded=1)
    assert plan("new", None, device, [resident("a")], evict_pinned=True) == Evict(("a",), False)
    got = plan("new", None, device, [resident("a", pinned=True)], evict_pinned=False)
    assert isinstance(got, Refuse) and "max_loaded_models = 1" in got.message
