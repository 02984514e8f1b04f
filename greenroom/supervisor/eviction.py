"""Which loaded models make room for a load that does not fit its device: the policy alone,
pure (no actor, no clock), so that it is tested with a table of devices
(tests/unit/test_eviction.py). The lifecycle (lifecycle.py) asks it under the device's load
lock and carries out its answer.

Ollama's rule (server/sched.go, `findRunnerToUnload`): idle models go first; one with running
or queued requests is never cut, it is waited for; a pinned model (`keep_alive: -1`) goes last,
and only when nothing else makes room. Greenroom takes the least recently used first within
each of those groups (Ollama: the shortest keep_alive first), and lets `evict_pinned = false`
keep pinned models loaded whatever asks for room.
"""

from __future__ import annotations

import attrs

GIB = 2**30


@attrs.frozen
class Resident:
    """A model loaded (or loading) on the device: what it takes and whether it may go."""

    id: str
    footprint: int  # bytes on the device: reported by its actor after loading, else estimated
    busy: bool  # requests running or queued for it: waited for, never cut
    pinned: bool  # keep_alive < 0: never unloaded when idle
    last_used: float  # when a request last asked for it (trio time): least recent goes first
    loading: bool = False  # its load is under way: its room is taken, it cannot go yet


@attrs.frozen
class Device:
    """The device's figures: `free` as it reports them now (None: unknown), its `total`, and
    the operator's `budget` for everything loaded there (None: none); `max_loaded`: the most
    models loaded there at once (0: no limit)."""

    name: str
    free: int | None
    total: int | None
    budget: int | None = None
    max_loaded: int = 0


@attrs.frozen
class Fits:
    """Load now."""


@attrs.frozen
class Evict:
    """Unload `victims` first (ids, in order); `wait`: some are busy, and are waited for."""

    victims: tuple[str, ...]
    wait: bool


@attrs.frozen
class Refuse:
    """Nothing that may go makes room: `message` gives the figures (503 insufficient_memory)."""

    message: str


Plan = Fits | Evict | Refuse


def plan(model: str, need: int | None, device: Device, residents: list[Resident], evict_pinned: bool) -> Plan:
    """How `model`, needing about `need` bytes (None: unknown, so only the count limit
    applies), gets loaded on `device` beside `residents`."""
    free = _free(device, residents)
    if _fits(need, free, device, len(residents)):
        return Fits()
    order = sorted(
        (r for r in residents if not r.loading and (evict_pinned or not r.pinned)),
        key=lambda r: (r.pinned, r.busy, r.last_used),
    )
    victims: list[Resident] = []
    for r in order:
        victims.append(r)
        if _fits(need, free + sum(v.footprint for v in victims), device, len(residents) - len(victims)):
            return Evict(tuple(v.id for v in victims), wait=any(v.busy for v in victims))
    return Refuse(_refusal(model, need, device, residents, free + sum(v.footprint for v in order), order))


def _free(device: Device, residents: list[Resident]) -> int | float:
    """What a load may take now: the device's free memory, and within the budget what the
    residents leave of it."""
    free = float("inf") if device.free is None else device.free
    if device.budget is not None:
        free = min(free, device.budget - sum(r.footprint for r in residents))
    return free


def _fits(need: int | None, free: int | float, device: Device, count: int) -> bool:
    room = need is None or need <= free
    return room and (device.max_loaded <= 0 or count < device.max_loaded)


def _refusal(model: str, need: int | None, device: Device, residents, capacity, movable) -> str:
    kept = [r.id for r in residents if r not in movable]
    if need is None:  # only the count limit stood in the way: everything left is loading or pinned
        return (
            f"model {model!r} cannot be loaded on {device.name}: max_loaded_models = {device.max_loaded} "
            f"are loaded there and none may be unloaded ({', '.join(kept)})"
        )
    figures = f"{device.name} has {max(capacity, 0) / GIB:.1f} GiB free"
    if device.total is not None:
        figures += f" of {device.total / GIB:.1f} GiB"
    if movable:
        figures += " with every model that may go unloaded"
    if device.budget is not None:
        figures += f" (memory_budget {device.budget / GIB:.1f} GiB)"
    if kept:
        figures += f"; kept loaded: {', '.join(kept)}"
    return f"model {model!r} needs about {need / GIB:.1f} GiB; {figures}"
