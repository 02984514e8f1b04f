"""A streamed response's chunks, framed here and written straight to the socket.

Hypercorn 0.18 hands each chunk of a chunked HTTP/1.1 body down six layers (`HTTPStream.app_send`,
which makes it a `Body` event → `H11Protocol.stream_send` → `_send_h11_event`, with status_line.py's
wrapper → h11's `Connection.send`, its state machine and `ChunkedWriter` → `TCPServer.protocol_send`,
its send lock and shielded scope → trio's `SocketStream.send_all` → `socket.send`), and two of them
yield to trio's scheduler (the lock's acquire and the socket's send, each a
`cancel_shielded_checkpoint`) even when the socket takes the bytes at once: at 64 streams of
bench/throughput.py that path was about half the front end's CPU (sampled), and each chunk cost
three scheduler passes (its stream's next event the third).

`install()` gives a body chunk a shorter way while h11 frames the body in chunks (HTTP/1.1 without
a Content-Length: h11's `ChunkedWriter`, in its `SEND_BODY` state) on a plain TCP socket:
`HTTPStream.app_send` frames it here as h11 does (`<size in hex>\\r\\n<data>\\r\\n`; a body chunk
changes none of h11's state) and writes it to the socket without waiting. When nothing else is
being sent on the connection and the socket takes all of it (the usual case), a chunk costs no
scheduler pass. What the socket does not take (a slow reader: its buffer is full) and every failure
(a client gone: hypercorn reports the close as before) go the usual way, through hypercorn's lock
and trio's `send_all`, which waits for the socket: backpressure holds the stream's task as it did.
The body's end (h11's `EndOfMessage`, its state to DONE) is written the same way from
`H11Protocol.stream_send`. Everything else (the response's head, a Content-Length, HTTP/1.0 or
HEAD body, HTTP/2, TLS) goes through hypercorn unchanged. A hypercorn or h11 without the private
attributes this relies on (checked once, at install) serves as it is, and says so.
"""

from __future__ import annotations

import logging
import os

import h11
import trio
from h11._writers import ChunkedWriter
from hypercorn.events import RawData
from hypercorn.protocol.events import EndBody
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.trio.tcp_server import TCPServer


def frame(data: bytes) -> bytes:
    """One chunk of a chunked body, as h11's ChunkedWriter writes it (never empty: an empty
    chunk ends the body)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def chunking(protocol) -> bool:
    """Whether `protocol` (an HTTP stream's) is HTTP/1.1 sending a chunked body: h11 has a
    ChunkedWriter in its SEND_BODY state alone."""
    return type(protocol) is H11Protocol and type(getattr(protocol.connection, "_writer", None)) is ChunkedWriter


async def write(protocol: H11Protocol, data: bytes) -> None:
    """`data` to the protocol's socket: what it takes at once without waiting, the rest through
    hypercorn's own send (its lock, trio's send_all: it waits for a slow reader)."""
    server = getattr(protocol.send, "__self__", None)
    if type(server) is TCPServer and not server.send_lock.locked() and type(server.stream) is trio.SocketStream:
        try:
            sent = os.write(server.stream.socket.fileno(), data)
        except OSError:  # full (BlockingIOError), or gone: hypercorn's send meets it as it would
            sent = 0
        if sent == len(data):
            return
        data = data[sent:]
    await protocol.send(RawData(data=data))


def install() -> None:
    """Wrap `HTTPStream.app_send` and `H11Protocol.stream_send` once, where hypercorn and h11
    have what this relies on."""
    app_send, stream_send = HTTPStream.app_send, H11Protocol.stream_send
    if getattr(app_send, "chunks_framed_here", False):
        return
    names = TCPServer.__init__.__code__.co_names + HTTPStream.__init__.__code__.co_names
    if not (hasattr(h11.Connection(h11.SERVER), "_writer") and {"send_lock", "stream", "send", "state"} <= set(names)):
        logging.getLogger("greenroom.http").warning(
            "this hypercorn or h11 is not the one chunked.py knows: body chunks go the long way"
        )
        return

    async def app_send_chunked(self, message) -> None:
        if (
            message is not None
            and message["type"] == "http.response.body"
            and message.get("more_body", False)
            and self.state is ASGIHTTPState.RESPONSE
        ):
            protocol = getattr(self.send, "__self__", None)
            if chunking(protocol):
                if body := message.get("body", b""):
                    await write(protocol, frame(body))
                return
        await app_send(self, message)

    async def stream_send_chunked(self, event) -> None:
        if type(event) is EndBody and chunking(self):  # the last, empty chunk; h11 moves to DONE
            await write(self, self.connection.send(h11.EndOfMessage()))
            return
        await stream_send(self, event)

    app_send_chunked.chunks_framed_here = True
    HTTPStream.app_send, H11Protocol.stream_send = app_send_chunked, stream_send_chunked
