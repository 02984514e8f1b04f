"""The worker link's framing: typed messages (protocol.py) as length-prefixed msgpack over an
authenticated TLS stream (tls.py), and the byte splice a pipe connection is."""

from __future__ import annotations

import ssl

import msgspec
import trio

from greenroom.protocol import Ping, from_wire, to_wire

HEARTBEAT_S = 1.0  # each side sends a Ping this often
MAX_FRAME = 1 << 20  # control messages are small; an authenticated peer still cannot make us buffer more
_HEADER = 4


class LinkClosed(Exception):
    """The other host closed the link, broke the framing, or fell silent past the timeout."""


class Link:
    def __init__(self, stream: trio.abc.Stream):
        self.stream = stream
        self._send_lock = trio.Lock()
        self._buffer = bytearray()

    async def send(self, msg) -> None:
        body = msgspec.msgpack.encode(to_wire(msg))
        async with self._send_lock:
            try:
                await self.stream.send_all(len(body).to_bytes(_HEADER, "big") + body)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise LinkClosed(f"sending failed: {exc}") from None

    async def receive(self, timeout_s: float):
        """The next message; LinkClosed once nothing has arrived for `timeout_s`."""
        with trio.move_on_after(timeout_s):
            header = await self._read(_HEADER)
            size = int.from_bytes(header, "big")
            if size > MAX_FRAME:
                raise LinkClosed(f"a frame of {size} bytes (at most {MAX_FRAME})")
            body = await self._read(size)
            try:
                return from_wire(msgspec.msgpack.decode(body))
            except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
                raise LinkClosed(f"an undecodable message: {exc}") from None
        raise LinkClosed(f"nothing received for {timeout_s:g} s")

    async def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                cause = exc.__cause__
                if (
                    isinstance(cause, ssl.SSLEOFError)
                    or isinstance(cause, OSError)
                    and not isinstance(cause, ssl.SSLError)
                ):
                    raise LinkClosed("the connection was cut") from cause  # a killed process, a reset
                raise LinkClosed(f"the connection broke: {cause or exc}") from cause
            if not data:
                raise LinkClosed("the other host closed the connection")
            self._buffer += data
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def take_buffer(self) -> bytes:
        """Bytes read past the last frame: a pipe's first tractor bytes, once it carries no more frames."""
        out, self._buffer = bytes(self._buffer), bytearray()
        return out

    async def heartbeat(self) -> None:
        while True:
            await self.send(Ping())
            await trio.sleep(HEARTBEAT_S)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1.0):
            await self.stream.aclose()


async def splice(a: trio.abc.Stream, b: trio.abc.Stream) -> None:
    """Copy bytes both ways until either side ends; then close both."""

    async def copy(src: trio.abc.Stream, dst: trio.abc.Stream, done: trio.CancelScope) -> None:
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(copy, a, b, nursery.cancel_scope)
            nursery.start_soon(copy, b, a, nursery.cancel_scope)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1.0):
            await a.aclose()
            await b.aclose()
