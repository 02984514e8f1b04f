"""chunked.py's short way for a streamed body's chunks, through a real hypercorn (trio) and read
by h11 as a client: the bytes are exactly the chunks sent, framed as h11 frames them; a reader
that stops reading holds the app back (backpressure: its sends wait once the sockets' buffers are
full, and what a socket took in part goes on through hypercorn's send); the connection is kept
alive for the next request; a client that goes away mid-stream ends the app's sends."""

from __future__ import annotations

import socket

import h11
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart import Response
from quart_trio import QuartTrio

from greenroom.http.core import chunked, status_line

CHUNKS = 400
SIZE = 4096  # 1.6 MB in all: far more than the two sockets' buffers, set small below
BUFFER = 16 * 1024


def payload(i: int) -> bytes:
    return (b"%08d" % i) * (SIZE // 8)


def app_streaming() -> tuple[QuartTrio, dict]:
    """A quart-trio app streaming CHUNKS chunks (no Content-Length: chunked), and what it did."""
    app, seen = QuartTrio(__name__), {"sent": 0, "ended": trio.Event()}

    @app.route("/")
    async def stream():
        async def body():
            try:
                for i in range(CHUNKS):
                    yield payload(i)
                    seen["sent"] += 1  # taken up again: the chunk was sent
            finally:
                seen["ended"].set()

        response = Response(body(), content_type="text/plain")
        response.timeout = None
        return response

    return app, seen


def listening() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)  # accepted sockets inherit it
    sock.bind(("127.0.0.1", 0))
    return sock


async def receive_response(sock, client: h11.Connection) -> tuple[h11.Response, list[bytes]]:
    """One response, its body's chunks as they were framed (h11's chunk_start/chunk_end)."""
    response, chunks = None, []
    while True:
        event = client.next_event()
        if event is h11.NEED_DATA:
            client.receive_data(await sock.recv(65536))
        elif isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            if event.chunk_start:
                chunks.append(b"")
            chunks[-1] += event.data
        elif isinstance(event, h11.EndOfMessage):
            return response, chunks


def request(client: h11.Connection) -> bytes:
    return client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")])) + client.send(h11.EndOfMessage())


async def served(test) -> None:
    chunked.install()
    status_line.install()  # as `greenroom serve` installs both
    (app, seen), sock = app_streaming(), listening()
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = config.errorlog = None
    stop = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: serve(app, config, shutdown_trigger=stop.wait, task_status=task_status)
            )
            client_sock = trio.socket.socket()
            client_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
            await client_sock.connect(sock.getsockname())
            with client_sock:
                await test(seen, client_sock)
            stop.set()


def test_a_slow_reader_holds_the_app_back_and_gets_every_byte_then_the_next_response():
    async def test(seen, sock):
        client = h11.Connection(h11.CLIENT)
        await sock.send(request(client))
        await trio.sleep(1)  # not reading: the app's sends wait once the buffers are full
        held = seen["sent"]
        assert 0 < held < CHUNKS // 2, f"{held} of {CHUNKS} chunks sent to a client that read nothing"
        response, chunks = await receive_response(sock, client)
        assert response.status_code == 200 and (b"transfer-encoding", b"chunked") in response.headers
        assert response.reason == b"OK"
        assert chunks == [payload(i) for i in range(CHUNKS)]
        client.start_next_cycle()  # kept alive: the next request on the same connection
        await sock.send(request(client))
        response, chunks = await receive_response(sock, client)
        assert chunks == [payload(i) for i in range(CHUNKS)]

    trio.run(served, test)


def test_a_client_gone_mid_stream_ends_the_apps_sends():
    async def test(seen, sock):
        client = h11.Connection(h11.CLIENT)
        await sock.send(request(client))
        while client.next_event() is h11.NEED_DATA:
            client.receive_data(await sock.recv(SIZE))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # a reset
        sock.close()
        with trio.fail_after(5):
            await seen["ended"].wait()  # quart-trio cancels the view on hypercorn's http.disconnect
        assert seen["sent"] < CHUNKS

    trio.run(served, test)
