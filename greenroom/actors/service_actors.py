"""The scheduler and steering actors. Real processes in the tree from the start; their
work (admission and routing across replicas; the steering state in SQLite) lands
in them as those features are built. Today each serves a session that answers
status queries, so supervision, restart and `greenroom ps` treat them like any actor."""

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
