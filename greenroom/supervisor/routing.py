"""Which placement of a model the next request goes to. Decided in the root process, beside the
lifecycle and the front end that counts each placement's requests in flight: a hop to another
actor per request would cost a tractor round trip (median 0.25 ms here, bench/scheduler_hop.py),
hundreds of times the whole in-process decision (Lifecycle.client_for on a loaded model: 1.7 µs)."""

from __future__ import annotations

from greenroom.supervisor.placements import ModelState
from greenroom.supervisor.slots import SlotState


def route(replicas: list[ModelState]) -> tuple[ModelState, str]:
    """The placement for the next request among a model's `replicas` (preferred first; several:
    a model placed once is served there, "single_engine_runtime", without asking), and why: the
    preferred one while it is idle; else the first idle one, else the least loaded — so a busy or
    missing device falls back to another that holds the model."""
    up = [
        m
        for m in replicas
        if m.slot.state == SlotState.READY or (m.slot.on_demand and m.slot.state == SlotState.STOPPED)
    ]
    if not up:
        return replicas[0], "preferred_device"  # nothing else to try: wait for it, or its error
    load = [m.slot.client.in_flight if m.slot.client is not None else 0 for m in up]
    chosen = up[load.index(0)] if 0 in load else up[load.index(min(load))]
    if chosen is replicas[0]:
        return chosen, "preferred_device"
    return chosen, "fallback_unavailable" if replicas[0] not in up else "fallback_busy"
