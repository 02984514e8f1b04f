"""Frames between actors as greenroom reads them (greenroom/actors/runtime.py's `_packets`, in
place of tractor's reader): every message arrives whole and in order, and one from a frame past
a few hundred bytes (an Embedded's vectors, an Events message of many streams) has a one-line
repr, since tractor formats each message it receives into log lines it then drops."""

from __future__ import annotations

import os

import trio

from greenroom.actors.runtime import MsgpackTCPStream
from greenroom.protocol import EventBatch, events_wire


def _received(messages: list[dict]) -> list:
    """`messages` sent over a loopback socket, as the other end's reader yields them."""
    got = []

    async def main():
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:

            async def serve(stream):
                transport = MsgpackTCPStream(stream)
                for msg in messages:
                    await transport.send(msg)

            nursery.start_soon(trio.serve_listeners, serve, listeners)
            transport = MsgpackTCPStream(await trio.open_tcp_stream("127.0.0.1", port))
            for _ in messages:
                got.append(await transport.recv())
            nursery.cancel_scope.cancel()

    trio.run(main)
    return got


def test_messages_arrive_whole_and_a_large_one_formats_in_one_short_line():
    small = {"cid": "1", "yield": {"t": "Status"}}
    large = {"cid": "2", "yield": {"t": "Embedded", "vectors": [os.urandom(1536) for _ in range(128)]}}
    got = _received([small, large, small])
    assert got == [small, large, small]
    assert len(f"{got[1]}") < 100  # tractor's own reader: a 560,000-character line
    assert f"{got[0]}" == repr(small)  # a frame within LOGGED_FRAME_BYTES: a plain dict


def test_an_events_message_of_32_streams_formats_in_one_short_line():
    """One step of 32 streams (~1.5 KB): tractor's three log lines of it took ~56 µs of the front
    end's CPU a message; its repr now says only what it is."""
    batch = EventBatch()
    for i in range(32):
        batch.text(f"chatcmpl-{i:024x}", 0, " word", 5, None)
    message = {"cid": "1", "yield": events_wire(batch.items)}
    (got,) = _received([message])
    assert got == message and len(f"{got}") < 100
