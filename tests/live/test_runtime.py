"""greenroom/actors/runtime.py's edges, on a real tractor tree in this process: the engine
actor's fast send, its worker thread's own sends (and the outbox's messages of them,
greenroom/actors/outbox.py), and what reaches an actor's port that is not an actor."""

import os
import socket
import time
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from greenroom.actors import runtime
from greenroom.actors.outbox import Outbox, send_interval
from greenroom.actors.runtime import tractor
from greenroom.protocol import Done, Text, from_wire

BIG = 32 << 20  # far past a socket's buffer: the frame is written in part, then by tractor
STREAMS, STEPS, STEP_S, CHUNKS_PER_S = 32, 40, 0.004, 2000.0  # the outbox's decode steps (`outbox_steps`)


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


@tractor.context
async def outbox_steps(ctx, parent_pid: int):
    """A worker thread puts STEPS decode steps of STREAMS streams through an Outbox, as the engine
    actor's worker does: each stream's first text, then running texts, then its last — stream
    r0's first two tokens held back (an incomplete character), its first text made by step 3;
    then, after a pause, a Done (what a held text would have gone with)."""
    runtime.die_with_parent(parent_pid)
    await ctx.started(None)
    async with ctx.open_stream() as stream:
        outbox = Outbox(stream, CHUNKS_PER_S)

        def work():
            for step in range(1, STEPS + 1):
                time.sleep(STEP_S)  # the step's forward
                for i in range(STREAMS):
                    if i == 0 and step < 3:
                        continue
                    if step < STEPS:
                        outbox.put_text(f"r{i}", 0, f" {step}", step, None, step == (3 if i == 0 else 1))
                    else:
                        outbox.put_from_thread(Text(f"r{i}", 0, " end", step, "length"))
                outbox.flush_due(STREAMS)
            time.sleep(0.5)
            outbox.put_from_thread(Done("after"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(outbox.send)
            await trio.to_thread.run_sync(work)
            await stream.receive()  # the parent has read it all
            nursery.cancel_scope.cancel()
        await outbox.close()


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


def test_a_batchs_texts_go_in_few_messages_and_its_first_and_last_are_never_held(monkeypatch):
    """32 streams: a running text waits as long as the front end would hold its chunk (16 ms at
    2000 chunks/s: ≤ 14 messages for 40 steps of 4 ms, where 10 ms made ~17), one Text per
    stream a message; the first texts go at the end of their step (a late one too), and the last
    ones."""

    async def main():
        async with _session(monkeypatch, outbox_steps) as (_, stream):
            messages = []
            while not messages or messages[-1] != [Done("after")]:
                messages.append(from_wire(await stream.receive()).events)
            await stream.send("done")
            return messages

    messages = trio.run(main)
    assert send_interval(STREAMS, CHUNKS_PER_S) == STREAMS / CHUNKS_PER_S
    assert len(messages) <= 4 + STEPS * STEP_S / send_interval(STREAMS, CHUNKS_PER_S), len(messages)
    assert [(t.rid, t.text, t.completion_tokens) for t in messages[0]] == [
        (f"r{i}", " 1", 1) for i in range(1, STREAMS)
    ]
    late = next(m for m in messages if any(t.rid == "r0" for t in m))  # r0's first text: at the end of step 3
    assert [t.text for t in late if t.rid == "r0"] == [" 3"]
    assert [t.completion_tokens for t in late if t.rid == "r1"] == [3]
    assert [(t.rid, t.finish_reason) for t in messages[-2]] == [(f"r{i}", "length") for i in range(STREAMS)]
    for events in messages[:-1]:
        assert sorted(t.rid for t in events) == sorted({t.rid for t in events})  # one Text per stream
    for i in range(STREAMS):
        whole = "".join(f" {step}" for step in range(3 if i == 0 else 1, STEPS)) + " end"
        assert "".join(t.text for m in messages for t in m if t.rid == f"r{i}") == whole
