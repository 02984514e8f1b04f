"""Frames between actors as greenroom reads them (greenroom/actors/runtime.py's `_packets`, in
place of tractor's reader): every message arrives whole and in order, and one from a large frame
(an Embedded's vectors) has a one-line repr, since tractor formats each message it receives
into log lines it then drops."""

from __future__ import annotations

import os

import trio

from greenroom.actors.runtime import MsgpackTCPStream


def test_messages_arrive_whole_and_a_large_one_formats_in_one_short_line():
    small = {"cid": "1", "yield": {"t": "Status"}}
    large = {"cid": "2", "yield": {"t": "Embedded", "vectors": [os.urandom(1536) for _ in range(128)]}}
    got = []

    async def main():
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:

            async def serve(stream):
                transport = MsgpackTCPStream(stream)
                for msg in (small, large, small):
                    await transport.send(msg)

            nursery.start_soon(trio.serve_listeners, serve, listeners)
            transport = MsgpackTCPStream(await trio.open_tcp_stream("127.0.0.1", port))
            for _ in range(3):
                got.append(await transport.recv())
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert got == [small, large, small]
    assert len(f"{got[1]}") < 100  # tractor's own reader: a 560,000-character line
    assert f"{got[0]}" == repr(small)  # a frame within LOGGED_FRAME_BYTES: a plain dict
