"""The answer of an engine request answered whole (Embed, Score, Tokenize): one event, or its
typed error. A generation's answer goes through generation.py."""

from __future__ import annotations

import array

from greenroom.errors import GreenroomError
from greenroom.protocol import Embedded, Failed
from greenroom.supervisor.engine_client import EngineClient


async def single(client: EngineClient, message):
    """The one answer of a request that is answered whole (Embed, Score), or its typed error."""
    async with client.submit(message) as events:
        async for event in events:
            if isinstance(event, Failed):
                raise GreenroomError.from_wire(event.error)
    return event


def vectors(embedded: Embedded) -> list[list[float]]:
    """An Embedded's float32 vectors as lists."""
    return [array.array("f", raw).tolist() for raw in embedded.vectors]
