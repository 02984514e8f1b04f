"""`greenroom worker --join HOST:PORT`: a worker host's process. It is the root of this host's
actors (tractor's registry and every actor bound on a loopback address: nothing here listens
on the network), dials the main host over TLS keyed by GREENROOM_WORKER_TOKEN (tls.py),
offers its engine actors, and then does what the main host's supervision asks: spawn an
actor, stop it, dial a pipe to one (supervisor/workers.py says how the two ends fit).

A lost link stops every actor here (their sessions were the main host's) and the worker
dials again, waiting RETRY_S and twice as long after each failure up to RETRY_MAX_S; a main host
it cannot reach is said once, not at every try, and the join when it comes. The main host's
shutdown (`Bye`) ends the worker too. A refused token ends it at once: retrying cannot fix it."""

from __future__ import annotations

import logging
import os
import signal
import ssl

import trio

from greenroom.actors import runtime
from greenroom.actors.engine_actor import engine_session
from greenroom.hosts import tls
from greenroom.hosts.link import Link, LinkClosed, splice
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

log = logging.getLogger("greenroom.worker")

RETRY_S = 1.0
RETRY_MAX_S = 10.0
TIMEOUT_S = 5.0  # a link silent this long is lost (the main host's worker_timeout_s, by default)
ENGINE_MODULE = engine_session.__module__  # the one module the main host may start actors of


class Refusal(Exception):
    """The main host will not have this worker: the token differs, or it refused the join."""


class MainShutdown(Exception):
    pass


class WorkerHost:
    def __init__(self, main: tuple[str, int], name: str, actors: list[str], bind: str, token: str, log_level: str):
        self.main, self.name, self.actors, self.bind = main, name, actors, bind
        self._ssl = tls.context(token, server=False)
        self._loglevel = runtime.tractor_loglevel(log_level)
        self._running: dict[str, trio.CancelScope] = {}
        self._ports: dict[str, int] = {}  # actor → its tractor port: the only ports a pipe may reach
        self._joined = False  # the current link was admitted

    async def run(self) -> int:
        """Join, serve, rejoin after a lost link; the exit status."""
        async with runtime.open_root(f"worker-{self.name}", self._loglevel, host=self.bind):
            delay, said = RETRY_S, False
            while True:
                self._joined = False
                try:
                    await self._serve_link()
                except Refusal as exc:
                    log.error("the main host at %s:%d refused this worker: %s", *self.main, exc)
                    return 2
                except MainShutdown as exc:
                    log.info("the main host said goodbye (%s); stopping", exc)
                    return 0
                except (OSError, LinkClosed, trio.BrokenResourceError, trio.TooSlowError) as exc:
                    if self._joined:  # a link that was up: said, and rejoined soon
                        log.warning("link to %s:%d lost (%s); joining again", *self.main, exc)
                        delay, said = RETRY_S, True
                    elif not said:
                        log.warning(
                            "cannot join the main host at %s:%d (%s); trying again quietly, every %.0f s at most",
                            *self.main,
                            exc,
                            RETRY_MAX_S,
                        )
                        said = True
                await trio.sleep(delay)
                delay = min(2 * delay, RETRY_MAX_S)

    async def _dial(self) -> trio.SSLStream:
        tcp = await trio.open_tcp_stream(*self.main)
        stream = trio.SSLStream(tcp, self._ssl, server_hostname=None)
        try:
            with trio.fail_after(TIMEOUT_S):
                await stream.do_handshake()
        except trio.BrokenResourceError as exc:
            if isinstance(exc.__cause__, ssl.SSLError):  # its certificate is not this token's
                raise Refusal(f"the TLS handshake failed: GREENROOM_WORKER_TOKEN differs ({exc.__cause__})") from None
            raise
        return stream

    async def _serve_link(self) -> None:
        link = Link(await self._dial())
        try:
            await link.send(Join(self.name, self.actors, os.getpid()))
            try:
                reply = await link.receive(TIMEOUT_S)
            except LinkClosed as exc:
                if isinstance(exc.__cause__, ssl.SSLError):  # TLS 1.3: the server checks our certificate late
                    raise Refusal(f"GREENROOM_WORKER_TOKEN differs ({exc.__cause__})") from None
                raise
            if isinstance(reply, Refused):
                raise Refusal(reply.reason)
            if not isinstance(reply, Joined):
                raise LinkClosed(f"an unexpected {type(reply).__name__}")
            log.info("joined the main host at %s:%d as %s, offering %s", *self.main, self.name, ", ".join(self.actors))
            self._joined = True
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_heartbeat, link)
                while True:
                    msg = await link.receive(TIMEOUT_S)
                    if isinstance(msg, Spawn):
                        await nursery.start(self._actor, link, msg)
                    elif isinstance(msg, Stop):
                        if msg.actor in self._running:
                            self._running[msg.actor].cancel()
                    elif isinstance(msg, OpenPipe):
                        nursery.start_soon(self._pipe, msg)
                    elif isinstance(msg, Bye):
                        raise MainShutdown(msg.reason)
                    elif not isinstance(msg, Ping):
                        raise LinkClosed(f"an unexpected {type(msg).__name__}")
        finally:
            await link.aclose()  # the nursery has stopped every actor

    async def _actor(self, link: Link, msg: Spawn, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run one actor until the main host stops it or it dies; tell the main host either way."""
        if msg.module != ENGINE_MODULE or not (msg.actor in self.actors or msg.actor.startswith("gguf:")):
            task_status.started()
            await link.send(SpawnFailed(msg.actor, f"this worker does not run {msg.module}:{msg.actor}"))
            return
        if msg.actor in self._running:  # its previous life is ending
            self._running[msg.actor].cancel()
        port = None
        with trio.CancelScope() as scope:
            self._running[msg.actor] = scope
            task_status.started()
            try:
                async with runtime.spawn(msg.actor, msg.module, self._loglevel, host=self.bind) as child:
                    port = self._ports[msg.actor] = await runtime.actor_port(child)
                    log.info("actor %s started, pid %d", msg.actor, child.pid)
                    await link.send(Spawned(msg.actor, child.pid, port))
                    code = await runtime.watch_death(child)
                    log.error("actor %s (pid %d) died with exit code %s", msg.actor, child.pid, code)
                    await link.send(Exited(msg.actor, code))
            except LinkClosed:
                raise
            except Exception as exc:
                await link.send(SpawnFailed(msg.actor, f"{type(exc).__name__}: {exc}"))
            finally:
                if port is not None and self._ports.get(msg.actor) == port:  # not a next life's
                    del self._ports[msg.actor]
                if self._running.get(msg.actor) is scope:
                    del self._running[msg.actor]

    async def _pipe(self, msg: OpenPipe) -> None:
        """Dial a pipe connection for the main host and join it to one of our actors' ports."""
        if msg.port not in self._ports.values():
            log.warning("refused a pipe to port %d: no actor of this worker listens there", msg.port)
            return
        try:
            remote = await self._dial()
            await Link(remote).send(JoinPipe(self.name, msg.pipe))
            local = await trio.open_tcp_stream(self.bind, msg.port)
        except (OSError, LinkClosed, trio.BrokenResourceError, Refusal) as exc:
            log.warning("pipe %s to port %d failed: %s", msg.pipe, msg.port, exc)
            return
        await splice(local, remote)


async def _heartbeat(link: Link) -> None:
    try:
        await link.heartbeat()
    except LinkClosed:
        pass  # the receiving side says why


async def run_worker(worker: WorkerHost) -> int:
    """The worker until its link ends it, or SIGTERM/SIGINT (its actors are stopped first)."""
    status = 0

    async def main(scope: trio.CancelScope) -> None:
        nonlocal status
        status = await worker.run()
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(main, nursery.cancel_scope)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("%s received, stopping", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break
    return status
