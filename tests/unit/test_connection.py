"""`DrainBody` against a driver that does what hypercorn 0.18 does with one HTTP/1.1 exchange
(connection.py's docstring): a bounded queue to the app (`max_app_queue_size`, 10), a reader
that waits while it is full, and, when the response's last message is sent, `http.disconnect`
put into that queue before the connection is closed."""

from __future__ import annotations

import trio

from greenroom.http.core.connection import DRAIN_MAX_BYTES, DrainBody

QUEUE = 10
CHUNK = 64 * 1024


async def exchange(body_bytes: int, *, streamed: bool) -> dict:
    """One request of `body_bytes` to an app that answers without reading it; what happened."""
    to_app, from_client = trio.open_memory_channel(QUEUE)
    seen = {"closed": False, "headers": None, "put": 0}

    async def hypercorn_send(message):
        if message["type"] == "http.response.start":
            seen["headers"] = dict(message["headers"])
        elif not message.get("more_body", False):  # `_maybe_recycle`: `_close_stream`, then `Closed`
            with trio.move_on_after(1):  # hypercorn would wait for ever: the client hangs
                await to_app.send({"type": "http.disconnect"})
                seen["closed"] = True

    async def app(scope, receive, send):
        await trio.sleep(0.05)  # the view's own work (a stat in a thread): the reader fills the queue
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/blobs/x",
        "headers": [(b"content-length", str(body_bytes).encode())],
    }
    served = DrainBody(app, streamed=lambda method, path: streamed)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def reader():
                left = body_bytes
                while left and not seen["closed"]:
                    n = min(CHUNK, left)
                    left -= n
                    await to_app.send({"type": "http.request", "body": b"x" * n, "more_body": left > 0})
                    seen["put"] += n

            nursery.start_soon(reader)
            await served(scope, from_client.receive, hypercorn_send)
            nursery.cancel_scope.cancel()  # hypercorn stops reading a closed connection
    return seen


def test_a_big_unread_streamed_body_still_gets_its_close():
    seen = trio.run(lambda: exchange(16 * DRAIN_MAX_BYTES, streamed=True))
    assert seen["closed"]
    assert seen["headers"][b"connection"] == b"close"
    assert seen["put"] < 16 * DRAIN_MAX_BYTES  # it was not read to its end to get there


def test_a_big_unread_body_still_gets_its_close():
    seen = trio.run(lambda: exchange(16 * DRAIN_MAX_BYTES, streamed=False))
    assert seen["closed"] and seen["headers"][b"connection"] == b"close"


def test_a_small_unread_body_is_drained_and_the_connection_kept():
    seen = trio.run(lambda: exchange(DRAIN_MAX_BYTES // 2, streamed=False))
    assert seen["closed"]  # the exchange's end (hypercorn recycles a drained connection)
    assert b"connection" not in seen["headers"]
    assert seen["put"] == DRAIN_MAX_BYTES // 2
