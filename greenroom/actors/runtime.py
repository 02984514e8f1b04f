"""greenroom's one door to tractor: spawn, session streams, death watching.

tractor 0.1.0a5's sharp edges are handled here and nowhere else:
- a stream to a `kill -9`'d child hangs forever: `watch_death` waits on the child's
  process (its pidfd: no polling, which cost the front end ~9 ms of CPU a second with four
  actors) and the caller cancels whatever was talking to it;
- an actor that fails (at import, at load) must not take the root down: each
  child lives in its own ActorNursery (`spawn`), owned by one supervising task
  that turns failures into values;
- killing only the root would orphan children: each child exits when its parent
  dies (`die_with_parent`), and the root's signal
  handler cancels the tree gracefully first; a signal to the whole process group is left to
  the root by every child (`die_with_parent`), so it too stops the tree in order;
- the root binds the registry ("arbiter") on a free loopback port, so servers
  on one machine never join each other's tree;
- per-request `Portal.run` calls leak, so requests never use them: one session
  stream per actor carries everything (see protocol.py);
- `MsgStream.send` yields to the scheduler twice and formats each message into a log line
  it then drops: the engine actor's hot path sends with `send_now`; a received frame's bytes
  and message are formatted so too, three times: one past a few hundred bytes is not (`_packets`);
- a channel's socket is written by trio tasks only, a frame at a time under a trio lock; the
  engine actor's worker thread writes its events itself (`ThreadWriter`, outbox.py), so every
  frame, trio's too, is written under the transport's `frame_lock`, a thread lock;
- any peer that reaches an actor's port may run every async function of its enabled
  modules and the actor's own methods (`cancel`…): tractor checks nothing after its uid
  handshake. So every actor binds a loopback address only, and another host's actors are
  reached through the worker link's authenticated pipes (`connect`, hosts/);
- a handshake that fails other than by a closed transport (an HTTP client at the port: "GET "
  read as a frame's length) raises into the actor's nursery and ends the actor, the root
  included: `_guarded_handshake` makes every such failure the closed transport tractor
  already shrugs off.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import threading
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import msgspec
import trio

# tractor imports trio.MultiError, deprecated since trio 0.22; say it once, not per process.
_TRACTOR_WARNING = "ignore:trio.MultiError is deprecated:FutureWarning"
warnings.filterwarnings("ignore", message="trio.MultiError is deprecated", category=FutureWarning)
os.environ.setdefault("PYTHONWARNINGS", _TRACTOR_WARNING)  # inherited by children
# OpenMP threads that spin between ops steal the other core from the front end and
# from each other: measured here, 2 spinning torch threads decode 7x slower than 1.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import tractor  # noqa: E402
from tractor._actor import Actor  # noqa: E402
from tractor._exceptions import TransportClosed  # noqa: E402
from tractor._ipc import MsgpackTCPStream  # noqa: E402

warnings.filterwarnings("ignore", category=trio.TrioDeprecationWarning, module="tractor")

_handshake = Actor._do_handshake


async def _guarded_handshake(self, chan):
    try:
        return await _handshake(self, chan)
    except TransportClosed:
        raise
    except Exception as exc:  # a peer that is not an actor: its connection ends, nothing else
        with trio.CancelScope(shield=True):
            await chan.aclose()
        raise TransportClosed(f"a peer at {chan.raddr} failed the handshake: {exc!r}") from exc


Actor._do_handshake = _guarded_handshake

FRAME_WAIT_S = 0.0005  # how often a trio task looks again at a frame lock a thread holds
_transport_send = MsgpackTCPStream.send


async def _hold_frames(lock: threading.Lock) -> None:
    """In the loop: take a transport's frame lock. Its other holder is a thread in one write's
    syscall, or the loop's own task sending the tail of that thread's frame (`ThreadWriter`)."""
    while not lock.acquire(blocking=False):
        await trio.sleep(FRAME_WAIT_S)


def _frame(transport: MsgpackTCPStream, msg) -> bytes:
    """`msg` as tractor's MsgpackTCPStream frames it: its msgpack body after the body's length
    (little-endian, 4 bytes)."""
    body = transport.encode(msg)
    return struct.pack("<I", len(body)) + body


async def _send_framed(self, msg) -> None:
    """tractor's `MsgpackTCPStream.send`; on a transport a thread writes too (`ThreadWriter` gave
    it a `frame_lock`), the frame is written under that lock."""
    lock = getattr(self, "frame_lock", None)
    if lock is None:
        return await _transport_send(self, msg)
    async with self._send_lock:
        frame = _frame(self, msg)
        await _hold_frames(lock)
        try:
            await self.stream.send_all(frame)
        finally:
            lock.release()


MsgpackTCPStream.send = _send_framed

LOGGED_FRAME_BYTES = 256  # a frame past this is never formatted into a log line (_packets)


class _Quiet(dict):
    """A message received in a frame past LOGGED_FRAME_BYTES: tractor formats every message it
    receives into log lines it then drops (`Received msg {msg}`, `Delivering {msg}`), and 128
    vectors of 384 floats (an Embedded, 200 KB) took ~2 ms of the front end's CPU a time, an
    Events message of 32 streams' texts (2 KB) ~56 µs; this one's repr says only what it is."""

    def __repr__(self) -> str:
        return f"<message {sorted(self)}, {self.frame_bytes} bytes>"


async def _packets(self) -> AsyncIterator[dict]:
    """tractor's `MsgpackTCPStream._iter_packets` without its log line of every frame's bytes
    (formatted whether logged or not); a large frame's message is `_Quiet`. As tractor's, a frame
    that does not decode is skipped, four at most (a channel dropping mid-frame)."""
    failed = 0
    while True:
        try:
            header = await self.recv_stream.receive_exactly(4)
        except (ValueError, ConnectionResetError, trio.BrokenResourceError):
            header = b""
        if len(header) < 4:
            raise TransportClosed(f"transport {self} was already closed prior to read")
        (size,) = struct.unpack("<I", header)
        try:
            msg = self.decode(await self.recv_stream.receive_exactly(size))
        except (msgspec.DecodeError, UnicodeDecodeError):
            failed += 1
            if failed > 4:
                raise
            continue
        if size > LOGGED_FRAME_BYTES and type(msg) is dict:
            msg = _Quiet(msg)
            msg.frame_bytes = size
        yield msg


MsgpackTCPStream._iter_packets = _packets

SPAWN_TIMEOUT_S = 120.0
CANCEL_TIMEOUT_S = 5.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tractor_loglevel(level: str) -> str:
    """tractor logs every cancelled context at ERROR while a tree shuts down; greenroom
    reports actor failures itself, so tractor speaks only at debug."""
    return "debug" if level.lower() == "debug" else "critical"


@asynccontextmanager
async def open_root(name: str, loglevel: str, host: str = "127.0.0.1") -> AsyncIterator[None]:
    async with tractor.open_root_actor(name=name, arbiter_addr=(host, free_port(host)), loglevel=loglevel):
        yield


@attrs.define
class Child:
    name: str
    portal: tractor.Portal
    process: trio.Process
    parent_pid: int = attrs.Factory(os.getpid)  # what the actor's session watches (die_with_parent)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    async def wait_death(self) -> str:
        """Return once the child's process is gone, saying how it ended."""
        return f"died (exit code {await watch_death(self)})"


@asynccontextmanager
async def spawn(name: str, module: str, loglevel: str, host: str = "127.0.0.1") -> AsyncIterator[Child]:
    """Start actor `name` serving `module`'s functions, its port bound on `host` (a loopback
    address); on exit, cancel it (hard kill after CANCEL_TIMEOUT_S). Raises if it cannot
    start within SPAWN_TIMEOUT_S."""
    async with tractor.open_nursery(loglevel=loglevel) as an:
        with trio.fail_after(SPAWN_TIMEOUT_S):
            portal = await an.start_actor(name, enable_modules=[module], bind_addr=(host, 0))
        _, process, _ = an._children[portal.channel.uid]
        child = Child(name, portal, process)
        try:
            yield child
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_TIMEOUT_S):
                if child.alive():
                    await an.cancel()
            if child.alive():
                process.kill()


async def watch_death(child: Child) -> int:
    """Return the child's exit code once its process is gone."""
    return await child.process.wait()


async def actor_port(child: Child, timeout_s: float = SPAWN_TIMEOUT_S) -> int:
    """The port `child` accepts connections on, once it has registered with this root (the
    registry): by its uid, since a dead actor's entry under the same name may linger."""
    registry = tractor.current_actor()._registry
    with trio.fail_after(timeout_s):
        while (addr := registry.get(child.portal.channel.uid)) is None:
            await trio.sleep(0.02)
    return addr[1]


@asynccontextmanager
async def connect(host: str, port: int) -> AsyncIterator[tractor.Portal]:
    """A portal to the actor listening at (host, port) — not a child of this process: how the
    main host reaches a worker host's actor through its pipe."""
    from tractor._ipc import _connect_chan
    from tractor._portal import open_portal

    async with _connect_chan(host, port) as chan, open_portal(chan) as portal:
        yield portal


@asynccontextmanager
async def open_session(child: Child, fn: Callable, **kwargs) -> AsyncIterator[tuple[object, tractor.MsgStream]]:
    """Open `fn` (a @tractor.context function) in the child and its bidirectional
    stream; yields (the value it passed to `ctx.started`, the stream)."""
    async with child.portal.open_context(fn, **kwargs) as (ctx, first):
        async with ctx.open_stream() as stream:
            yield first, stream


async def send_now(stream: tractor.MsgStream, data) -> None:
    """`stream.send(data)`: the same frame under the same lock, written in this turn of the loop
    when the socket takes it whole. Each yield of tractor's own send (its lock's checkpoint, the
    socket's) is a trip through the scheduler, and in the engine actor each trip hands the GIL to
    the worker thread and back: measured ~0.26 ms of loop CPU a message through `stream.send`."""
    ctx = stream._ctx
    transport = ctx.chan.msgstream
    lock = getattr(transport, "frame_lock", None)  # a thread writes to it too (ThreadWriter)
    if (
        ctx._error
        or stream._closed
        or not isinstance(transport, MsgpackTCPStream)
        or transport._send_lock.locked()
        or (lock is not None and not lock.acquire(blocking=False))  # the thread is writing
    ):
        await stream.send(data)  # its errors, or its wait for the locks
        return
    frame = _frame(transport, {"yield": data, "cid": ctx.cid})
    transport._send_lock.acquire_nowait()  # no other send can start before this one ends
    try:
        try:
            sent = os.write(transport.stream.socket.fileno(), frame)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"the stream's socket failed: {exc}") from exc
        if sent < len(frame):  # the socket's buffer is full: the rest as tractor sends it
            await transport.stream.send_all(frame[sent:])
    finally:
        transport._send_lock.release()
        if lock is not None:
            lock.release()


class ThreadWriter:
    """A session stream's messages written to its socket by a thread other than the loop's,
    without waking the loop: a whole frame while no trio task is writing one (the transport's
    frame lock). Made in the loop; `close` there before the stream ends."""

    def __init__(self, stream: tractor.MsgStream):
        self._stream, self._ctx = stream, stream._ctx
        transport = self._ctx.chan.msgstream
        self._transport = transport if isinstance(transport, MsgpackTCPStream) else None
        if self._transport is not None and not hasattr(transport, "frame_lock"):
            transport.frame_lock = threading.Lock()  # held from a frame's first byte to its last, by either thread
        # its own descriptor of the socket, closed under the frame lock: a write never meets a
        # number the loop closed and the kernel gave to another file meanwhile
        self._fd = None if self._transport is None else os.dup(self._transport.stream.socket.fileno())
        self._token = trio.lowlevel.current_trio_token()

    def try_hold(self) -> bool:
        """From the thread: the frame lock, if no trio task holds it and the stream is open."""
        if self._transport is None or not self._transport.frame_lock.acquire(blocking=False):
            return False
        if self._fd is None or self._ctx._error or self._stream._closed:
            self._transport.frame_lock.release()
            return False
        return True

    def release(self) -> None:
        self._transport.frame_lock.release()

    def write(self, data) -> None:
        """From the thread, holding the lock (`try_hold`): `data` as the stream's next message. A
        frame the socket does not take whole is finished by a task of the loop, which then lets
        the lock go (a full buffer never blocks the thread); a socket that failed takes nothing,
        and tractor's next send or receive in the loop meets its error."""
        frame = _frame(self._transport, {"yield": data, "cid": self._ctx.cid})  # msgspec's encoder: under the GIL
        try:
            sent = os.write(self._fd, frame)
        except BlockingIOError:
            sent = 0
        except OSError:
            sent = len(frame)
        if sent < len(frame):
            self._token.run_sync_soon(trio.lowlevel.spawn_system_task, self._finish, frame[sent:])
        else:
            self.release()

    async def _finish(self, rest: bytes) -> None:
        try:
            await self._transport.stream.send_all(rest)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the channel is gone: tractor meets that in its own reads and sends
        finally:
            self.release()

    async def close(self) -> None:
        """In the loop: the thread writes no more (its `try_hold` fails from now on)."""
        if self._fd is None:
            return
        with trio.CancelScope(shield=True):
            await _hold_frames(self._transport.frame_lock)
        try:
            os.close(self._fd)
            self._fd = None
        finally:
            self.release()


def die_with_parent(parent_pid: int) -> None:
    """Called first in every child: its life is its parent's to end. It exits at once when the
    parent process is gone, and leaves SIGTERM and SIGINT to the parent — sent to the whole
    process group (systemd's stop, a terminal's Ctrl-C), they would otherwise end every actor
    at once, before the root could stop the tree in order; the root's cancel stops it instead
    (SIGKILL still ends it). A handler, not SIG_IGN, which a process it execs would inherit.

    Not PR_SET_PDEATHSIG: trio spawns from a worker thread, and the kernel would
    kill us when that *thread* exits. A daemon thread waits on the parent's pidfd."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)

    def wait_then_exit() -> None:
        try:
            fd = os.pidfd_open(parent_pid)
        except OSError:  # already gone
            os._exit(1)
        select.select([fd], [], [])
        os._exit(1)

    threading.Thread(target=wait_then_exit, name="die-with-parent", daemon=True).start()
