"""The main host's end of the worker link: other hosts' engine actors as members of the tree.

A worker host (`greenroom worker --join`, hosts/worker.py) dials `workers_listen` over TLS
keyed by GREENROOM_WORKER_TOKEN (hosts/tls.py: no token, no handshake, nothing read) and
offers its engine actors (`Join`). Supervision then spawns and restarts them as it does local
ones, through `spawn`: the worker starts the process (`Spawn` → `Spawned`), and the front
end reaches its tractor port — bound on the worker's loopback only — through a *pipe*: a
second TLS connection the worker dials for it (`OpenPipe` → `JoinPipe`), spliced to a
one-shot loopback listener here that tractor connects to. So the session stream, and every
message on it, is tractor's own; only bytes cross the link.

Both sides send a Ping every second; a link silent for `worker_timeout_s`, or closed, is a
lost host: its pipes close, each of its actors' `wait_death` returns (supervision fails their
in-flight requests with a typed error and waits for the host), and its slots stay `offline`
— 503 naming the host — until it joins again."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from greenroom.actors import runtime
from greenroom.hosts import tls
from greenroom.hosts.link import HEARTBEAT_S, Link, LinkClosed, splice
from greenroom.protocol import (
    Bye,
    Exited,
    Join,
    Joined,
    JoinPipe,
    OpenPipe,
    Ping,
    Refused,
    Spawn,
    Spawned,
    SpawnFailed,
    Stop,
)

log = logging.getLogger("greenroom.workers")

HANDSHAKE_TIMEOUT_S = 10.0  # TLS handshake and first message of a new connection
PIPE_TIMEOUT_S = 10.0  # for the worker to dial a pipe asked for
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
ACTOR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:#-]{0,200}")


class HostGone(Exception):
    """The actor's worker host is not connected."""


@attrs.define(eq=False)
class RemoteChild:
    """An engine actor on a worker host, as supervision holds a local runtime.Child."""

    name: str  # the slot's: <host>/<actor>
    host: str
    pid: int  # on the worker host
    parent_pid: int  # the worker's root process there: the actor's session watches it
    portal: object = None
    gone: trio.Event = attrs.Factory(trio.Event)
    how: str = ""

    def end(self, how: str) -> None:
        if not self.gone.is_set():
            self.how = how
            self.gone.set()

    async def wait_death(self) -> str:
        await self.gone.wait()
        return self.how


@attrs.define(eq=False)
class RemoteHost:
    name: str
    connected: bool = False
    joined: trio.Event = attrs.Factory(trio.Event)  # set while connected
    left: trio.Event = attrs.Factory(trio.Event)  # set while not connected
    lost_reason: str | None = None  # why it is not connected (None: it never joined)
    pid: int | None = None
    address: str | None = None  # the peer address of its link
    heard: float = 0.0  # when its link last said something (trio time)
    actors: list[str] = attrs.Factory(list)
    link: Link | None = None
    scope: trio.CancelScope | None = None  # its link's task
    done: trio.Event = attrs.Factory(trio.Event)  # set when its link's task has ended
    children: dict[str, RemoteChild] = attrs.Factory(dict)  # bare actor name → the running one
    replies: dict[str, trio.MemorySendChannel] = attrs.Factory(dict)  # spawns awaiting Spawned
    pipes: dict[str, trio.SocketListener] = attrs.Factory(dict)  # pipes awaiting the worker's JoinPipe
    pipe_scopes: set[trio.CancelScope] = attrs.Factory(set)

    def lose(self, reason: str) -> None:
        """The link is gone: close every pipe, end every actor's life, answer every waiting spawn."""
        self.connected, self.lost_reason, self.link = False, reason, None
        self.joined = trio.Event()
        self.left.set()
        for scope in self.pipe_scopes:
            scope.cancel()
        for listener in self.pipes.values():
            listener.socket.close()  # tractor's connection waiting in its backlog is refused
        self.pipes.clear()
        for child in self.children.values():
            child.end(f"was lost with its worker host {self.name!r} ({reason})")
        for actor, reply in self.replies.items():
            reply.send_nowait(SpawnFailed(actor, f"worker host {self.name!r} was lost ({reason})"))
        self.replies.clear()

    async def spawn(self, actor: str, module: str) -> Spawned:
        if not self.connected:
            raise HostGone(f"worker host {self.name!r} is not connected")
        send, recv = trio.open_memory_channel(1)
        self.replies[actor] = send
        await self.link.send(Spawn(actor, module))
        with trio.fail_after(runtime.SPAWN_TIMEOUT_S + PIPE_TIMEOUT_S):
            reply = await recv.receive()
        if isinstance(reply, SpawnFailed):
            raise RuntimeError(reply.error)
        return reply

    @asynccontextmanager
    async def portal(self, port: int) -> AsyncIterator[object]:
        """A tractor portal to the worker's actor at `port`, through a pipe the worker dials."""
        if not self.connected:
            raise HostGone(f"worker host {self.name!r} is not connected")
        pipe = uuid.uuid4().hex
        listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        self.pipes[pipe] = listener
        try:
            await self.link.send(OpenPipe(pipe, port))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._expire_pipe, pipe)
                async with runtime.connect("127.0.0.1", listener.socket.getsockname()[1]) as portal:
                    yield portal
                nursery.cancel_scope.cancel()
        finally:
            if self.pipes.pop(pipe, None) is listener:
                listener.socket.close()

    async def _expire_pipe(self, pipe: str) -> None:
        """A pipe the worker never dials: close its listener, which resets tractor's connection
        waiting in the backlog — its handshake has no timeout of its own."""
        await trio.sleep(PIPE_TIMEOUT_S)
        listener = self.pipes.pop(pipe, None)
        if listener is not None:
            log.warning("worker host %s did not dial pipe %s in %.0f s", self.name, pipe, PIPE_TIMEOUT_S)
            listener.socket.close()

    async def join_pipe(self, pipe: str, stream: trio.abc.Stream, leftover: bytes) -> None:
        """The worker's pipe connection for `pipe`: splice it to tractor's connection until either ends."""
        listener = self.pipes.pop(pipe, None)
        if listener is None:
            return
        with trio.CancelScope() as scope:
            self.pipe_scopes.add(scope)
            try:
                local = None
                with trio.move_on_after(PIPE_TIMEOUT_S):
                    local = await listener.accept()
                await listener.aclose()
                if local is not None:
                    if leftover:
                        await local.send_all(leftover)
                    await splice(local, stream)
            finally:
                self.pipe_scopes.discard(scope)


class WorkerHosts:
    """Every worker host the config names or that has joined, by name. `on_join(host, actors)`
    runs as a host is admitted, before its actors are spawned (the tree adds their slots);
    `on_leave(host)` as one is lost."""

    def __init__(
        self,
        listen: str,
        token: str,
        timeout_s: float,
        on_join: Callable[[str, list[str]], None],
        on_leave: Callable[[str], None],
    ):
        host, _, port = listen.rpartition(":")
        self.listen = (host.strip("[]"), int(port))
        self.timeout_s = timeout_s
        self._ssl = tls.context(token, server=True)
        self._on_join, self._on_leave = on_join, on_leave
        self.hosts: dict[str, RemoteHost] = {}

    def host(self, name: str) -> RemoteHost:
        return self.hosts.setdefault(name, RemoteHost(name))

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.listen[1], host=self.listen[0])
        log.info("listening for worker hosts on %s:%d (TLS, GREENROOM_WORKER_TOKEN)", *self.listen)
        task_status.started()
        await trio.serve_listeners(self._accept, listeners)

    async def _accept(self, tcp: trio.SocketStream) -> None:
        peer = "{}:{}".format(*tcp.socket.getpeername()[:2])
        stream = trio.SSLStream(tcp, self._ssl, server_side=True)
        link = Link(stream)
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                await stream.do_handshake()
            first = await link.receive(HANDSHAKE_TIMEOUT_S)
        except (trio.BrokenResourceError, trio.TooSlowError) as exc:
            log.warning("refused a connection from %s: no TLS handshake with the worker token (%s)", peer, _why(exc))
            return
        except LinkClosed as exc:
            log.warning("refused a connection from %s: %s", peer, exc)
            return
        if isinstance(first, Join):
            await self._serve_host(link, first, peer)
        elif isinstance(first, JoinPipe) and first.host in self.hosts:
            await self.hosts[first.host].join_pipe(first.pipe, stream, link.take_buffer())

    async def _serve_host(self, link: Link, join: Join, peer: str) -> None:
        bad = [a for a in join.actors if not ACTOR_NAME.fullmatch(a)]
        if not HOST_NAME.fullmatch(join.host) or bad:
            await link.send(Refused(f"invalid host or actor names: {join.host!r} {bad}"))
            return
        host = self.host(join.host)
        if host.scope is not None:
            if join.pid != host.pid and trio.current_time() - host.heard < 2 * HEARTBEAT_S:
                # another worker process under a connected host's name, whose link is alive
                await link.send(Refused(f"a worker named {join.host!r} is connected from {host.address}; use --name"))
                return
            host.scope.cancel()  # it rejoined before its old link was noticed gone
            await host.done.wait()
        host.done = trio.Event()
        reason = None
        try:
            with trio.CancelScope() as host.scope:
                await link.send(Joined())
                host.connected, host.link, host.pid, host.address = True, link, join.pid, peer
                host.heard = trio.current_time()
                host.actors, host.lost_reason = list(join.actors), None
                self._on_join(host.name, host.actors)
                host.left = trio.Event()
                host.joined.set()
                log.info("worker host %s joined from %s offering %s", host.name, peer, ", ".join(join.actors))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_heartbeat, link)
                    while True:
                        self._handle(host, await link.receive(self.timeout_s))
                        host.heard = trio.current_time()
            reason = "it joined again"
        except LinkClosed as exc:
            reason = str(exc)
        finally:
            shutdown = reason is None and trio.current_effective_deadline() == float("-inf")
            reason = reason or ("the main host is shutting down" if shutdown else "an internal error")
            (log.info if shutdown else log.error)("worker host %s lost: %s", host.name, reason)
            host.lose(reason)
            self._on_leave(host.name)
            host.scope = None
            if shutdown:
                with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                    try:
                        await link.send(Bye(reason))
                    except LinkClosed:
                        pass
            await link.aclose()
            host.done.set()

    def _handle(self, host: RemoteHost, msg) -> None:
        if isinstance(msg, (Spawned, SpawnFailed)):
            reply = host.replies.pop(msg.actor, None)
            if reply is not None:
                reply.send_nowait(msg)
        elif isinstance(msg, Exited):
            child = host.children.get(msg.actor)
            if child is not None:
                child.end(f"died (exit code {msg.code}) on worker host {host.name!r}")
        elif not isinstance(msg, Ping):
            raise LinkClosed(f"an unexpected {type(msg).__name__}")

    @asynccontextmanager
    async def spawn(self, slot_name: str, host_name: str, module: str) -> AsyncIterator[RemoteChild]:
        """Start the engine actor of slot `slot_name` (`<host>/<actor>`) on its host and yield it
        with a portal; on exit, stop it there. HostGone when the host is not connected."""
        host = self.host(host_name)
        actor = slot_name.split("/", 1)[1]
        spawned = await host.spawn(actor, module)
        child = RemoteChild(slot_name, host.name, spawned.pid, host.pid)
        host.children[actor] = child
        link = host.link
        try:
            async with host.portal(spawned.port) as portal:
                child.portal = portal
                yield child
        finally:
            if host.children.get(actor) is child:
                del host.children[actor]
            if host.link is link and link is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                    try:
                        await link.send(Stop(actor))
                    except LinkClosed:
                        pass


async def _heartbeat(link: Link) -> None:
    try:
        await link.heartbeat()
    except LinkClosed:
        pass  # the receiving side says why


def _why(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    return getattr(cause, "reason", None) or str(cause) or type(cause).__name__
