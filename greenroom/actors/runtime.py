"""greenroom's one door to tractor: spawn, session streams, death watching.

tractor 0.1.0a5's sharp edges are handled here and nowhere else:
- a stream to a `kill -9`'d child hangs forever: `watch_death` polls the child's
  process and the caller cancels whatever was talking to it;
- an actor that fails (at import, at load) must not take the root down: each
  child lives in its own ActorNursery (`spawn`), owned by one supervising task
  that turns failures into values;
- killing only the root would orphan children: each child exits when its parent
  dies (`die_with_parent`), and the root's signal
  handler cancels the tree gracefully first;
- the root binds the registry ("arbiter") on a free loopback port, so servers
  on one machine never join each other's tree;
- per-request `Portal.run` calls leak, so requests never use them: one session
  stream per actor carries everything (see protocol.py);
- any peer that reaches an actor's port may run every async function of its enabled
  modules and the actor's own methods (`cancel`…): tractor checks nothing after its uid
  handshake. So every actor binds a loopback address only, and another host's actors are
  reached through the worker link's authenticated pipes (`connect`, hosts/).
"""

from __future__ import annotations

import os
import select
import socket
import threading
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio

# tractor imports trio.MultiError, deprecated since trio 0.22; say it once, not per process.
_TRACTOR_WARNING = "ignore:trio.MultiError is deprecated:FutureWarning"
warnings.filterwarnings("ignore", message="trio.MultiError is deprecated", category=FutureWarning)
os.environ.setdefault("PYTHONWARNINGS", _TRACTOR_WARNING)  # inherited by children
# OpenMP threads that spin between ops steal the other core from the front end and
# from each other: measured here, 2 spinning torch threads decode 7x slower than 1.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import tractor  # noqa: E402

warnings.filterwarnings("ignore", category=trio.TrioDeprecationWarning, module="tractor")

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

    async def wait_death(self, poll_s: float = 0.05) -> str:
        """Return once the child's process is gone, saying how it ended."""
        return f"died (exit code {await watch_death(self, poll_s)})"


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


async def watch_death(child: Child, poll_s: float = 0.05) -> int:
    """Return the child's exit code once its process is gone."""
    while child.alive():
        await trio.sleep(poll_s)
    return child.process.returncode


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


def die_with_parent(parent_pid: int) -> None:
    """Called first in every child: exit at once when the parent process is gone.

    Not PR_SET_PDEATHSIG: trio spawns from a worker thread, and the kernel would
    kill us when that *thread* exits. A daemon thread waits on the parent's pidfd."""

    def wait_then_exit() -> None:
        try:
            fd = os.pidfd_open(parent_pid)
        except OSError:  # already gone
            os._exit(1)
        select.select([fd], [], [])
        os._exit(1)

    threading.Thread(target=wait_then_exit, name="die-with-parent", daemon=True).start()
