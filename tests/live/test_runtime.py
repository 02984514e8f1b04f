"""greenroom/actors/runtime.py's edges, on a real tractor tree in this process: the engine
actor's fast send, its worker thread's own sends, and what reaches an actor's port that is not
an actor."""

import os
import socket
import time
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from greenroom.actors import runtime
from greenroom.actors.runtime import tractor

BIG = 32 << 20  # far past a socket's buffer: the frame is written in part, then by tractor


@tractor.context
async def sender(ctx, parent_pid: int):
    runtime.die_with_parent(parent_pid)
    await ctx.started(None)
    async with ctx.open_stream() as stream:
        await runtime.send_now(stream, {"n": 1, "blob": b"x" * BIG})
        await runtime.send_now(stream, {"n": 2})
        await stream.send({"n": 3})
        await runtime.send_now(stream, {"n": 4})
        async for msg in stream:  # echo until the parent closes
            await runtime.send_now(stream, msg)


@tractor.context
async def thread_and_loop(ctx, parent_pid: int):
    """A thread and the loop send at once, on the stream and on tractor's own path."""
    runtime.die_with_parent(parent_pid)
    await ctx.started(None)
    async with ctx.open_stream() as stream:
        writer = runtime.ThreadWriter(stream)

        def work():
            for n in range(300):
                while not writer.try_hold():  # a trio task is writing a frame
                    time.sleep(0.0001)
                writer.write({"by": "thread", "n": n, "blob": b"t" * (BIG if n == 1 else n)})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, work)
            for n in range(300):
                msg = {"by": "loop", "n": n, "blob": b"l" * (BIG if n == 7 else n)}
                await (runtime.send_now(stream, msg) if n % 2 else stream.send(msg))
                await trio.sleep(0)
        await writer.close()
        assert not writer.try_hold()  # closed: the thread writes no more
        await stream.send({"by": "loop", "n": "end"})
        await stream.receive()  # until the parent has read it all


def _garbage(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)


@asynccontextmanager
async def _session(monkeypatch, fn):
    """A tree with one child actor serving `fn`'s session: (the child, the stream)."""
    # the child imports this module by its name, `live.test_runtime`: its package's folder on its path
    tests = str(Path(__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    async with runtime.open_root("test-root", "critical"):
        async with runtime.spawn("child", __name__, "critical") as child:
            async with runtime.open_session(child, fn, parent_pid=child.parent_pid) as (_, stream):
                yield child, stream


def test_send_now_frames_as_tractor_does_and_a_bad_peer_leaves_the_tree_up(monkeypatch):
    async def main():
        async with _session(monkeypatch, sender) as (child, stream):
            got = [await stream.receive() for _ in range(4)]
            assert [m["n"] for m in got] == [1, 2, 3, 4]
            assert got[0]["blob"] == b"x" * BIG
            # an HTTP client at the root's port and at the actor's, and a frame that is no msgpack
            root_port = tractor.current_actor().accept_addr[1]
            for port in (root_port, await runtime.actor_port(child)):
                for data in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x05\x00\x00\x00\xc1\xc1\xc1\xc1\xc1"):
                    await trio.to_thread.run_sync(_garbage, port, data)
            await trio.sleep(0.5)  # their handlers have run
            await stream.send({"n": 5})
            assert (await stream.receive())["n"] == 5
            assert child.alive()

    trio.run(main)


def test_a_thread_and_the_loop_write_whole_frames_each_in_order(monkeypatch):
    async def main():
        async with _session(monkeypatch, thread_and_loop) as (_, stream):
            seen = {"thread": [], "loop": []}
            while (msg := await stream.receive())["n"] != "end":
                big = msg["n"] == (1 if msg["by"] == "thread" else 7)
                assert msg["blob"] == msg["by"][0].encode() * (BIG if big else msg["n"])
                seen[msg["by"]].append(msg["n"])
            assert seen == {"thread": list(range(300)), "loop": list(range(300))}
            await stream.send("done")

    trio.run(main)
