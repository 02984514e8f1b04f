"""From an engine request to an HTTP answer: the one skeleton both API surfaces use.

submit → wait for `Admitted` (the engine's refusals are then plain typed errors, never a
broken stream) → stream the frames, or collect one answer. Closing the response body (the
client went away) or leaving early cancels the request in the engine.
"""

from __future__ import annotations

import array
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from quart import current_app, request

from greenroom import structured_fields as sf
from greenroom.errors import GreenroomError
from greenroom.http.core.framing import Framing, streamed
from greenroom.http.core.headers import DRAWN_SEED_HEADER
from greenroom.http.core.pacing import Pacer
from greenroom.http.manage import monitoring_api
from greenroom.protocol import Admitted, Embedded, Failed, Generate
from greenroom.supervisor.engine_client import EngineClient, RequestEvents, admit
from greenroom.supervisor.tree import Tree


def drawn_seed(admitted: Admitted, scope: str = "request") -> dict[str, str]:
    """X-Greenroom-Drawn-Seed, in X-miLLM-Seed's form and with the scope of the promise that
    seed, sent, would carry; absent where no seed was drawn (one was sent, or the request's lane
    reproduces none: Admitted.drawn_seed)."""
    if admitted.drawn_seed is None:
        return {}
    return {DRAWN_SEED_HEADER: sf.item(admitted.drawn_seed, {"scope": scope})}


async def answer(
    tree: Tree,
    client: EngineClient,
    gen: Generate,
    *,
    framing: Framing | None,
    headers: Callable[[Admitted], dict[str, str]],
    frames: Callable[[RequestEvents, Admitted], AsyncIterator[bytes]],
    collect: Callable[[RequestEvents, Admitted], Awaitable[dict]],
    done: Callable[[], None] | None = None,
):
    """Run `gen` (monitored where its model's monitoring is on) and answer it: streamed in
    `framing` (None: one collected answer), with `headers(admitted)`. `done` runs once the
    answer is complete — after the last frame, or once collected."""
    gen = monitoring_api.monitored(tree, gen)
    stack = contextlib.AsyncExitStack()
    try:
        events, first = await admit(stack, client, gen)
        events = monitoring_api.recorded(tree, gen, request.path, events)
        answered = headers(first)
        if framing is not None:
            events = pacer().paced(events, stack)
            return streamed(_then(frames(events, first), done), framing, answered, stack)
        async with stack:
            result = await collect(events, first)
        if done is not None:
            done()
        return result, 200, answered
    except BaseException:
        await stack.aclose()
        raise


def pacer() -> Pacer:
    """The app's one pacer (create_app makes it)."""
    return current_app.extensions["greenroom.pacer"]


async def _then(chunks: AsyncIterator[bytes], done: Callable[[], None] | None):
    async for chunk in chunks:
        yield chunk
    if done is not None:
        done()


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
