"""The scheduler actor: a process in the tree that answers status queries, so supervision,
restart and `greenroom ps` treat it like any actor. Admission and routing across replicas
run in the front end's process (supervisor/routing.py, the engine actors' bounded
queues), because a hop to this actor per request would cost a tractor round trip
(~4 ms measured). (The steering coordinator has its own session: steering_actor.py.)"""

from __future__ import annotations

import os

from greenroom.actors.runtime import die_with_parent, tractor
from greenroom.protocol import Events, Status, StatusQuery, from_wire, to_wire


@tractor.context
async def service_session(ctx, parent_pid: int, role: str):
    die_with_parent(parent_pid)
    await ctx.started({"ok": True, "models": []})
    async with ctx.open_stream() as stream:
        async for raw in stream:
            msg = from_wire(raw)
            if isinstance(msg, StatusQuery):
                status = {"pid": os.getpid(), "role": role, "models": [], "queue_depth": 0}
                await stream.send(to_wire(Events([Status(msg.rid, status)])))
