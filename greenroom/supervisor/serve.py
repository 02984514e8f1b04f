"""`greenroom serve`: the root actor runs the supervisor and the HTTP front end."""

from __future__ import annotations

import logging
import signal
import socket
from functools import partial

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from greenroom.actors import runtime
from greenroom.config import Config
from greenroom.errors import GreenroomError
from greenroom.http.core import chunked, idle_timer, routes, status_line
from greenroom.http.core.app import create_app
from greenroom.http.core.connection import DrainBody
from greenroom.http.core.shutdown import Shutdown
from greenroom.store.registry import Registry
from greenroom.supervisor.tree import Tree

log = logging.getLogger("greenroom")


async def serve(config: Config) -> None:
    # the HTTP ports are bound before the tree's own loopback ports are picked: a port of
    # greenroom's is then never the one a client of greenroom's is about to reach
    try:
        listening = [_listen(config.host, config.port)]
    except OSError as exc:
        raise SystemExit(f"greenroom: cannot listen on {config.host}:{config.port}: {exc.strerror}") from None
    listening += _ollama_listen(config)
    async with runtime.open_root("supervisor", runtime.tractor_loglevel(config.log_level)):
        tree = Tree(config)
        Registry(config.cache_dir).restore(tree)  # models added by /api/pull, /api/copy, /api/create
        shutdown = Shutdown()
        # keep-alive after responses that leave a body unread, uploads paced; every exchange counted for the drain
        app = shutdown.counted(DrainBody(create_app(tree, shutdown), routes.streamed))
        status_line.install()  # `HTTP/1.1 400 Bad Request`, not `HTTP/1.1 400 `
        idle_timer.install()  # a kept-alive connection's idle timer, restarted per request, made cheaper
        chunked.install()  # a streamed body's chunks framed here and written straight to the socket
        hc = HypercornConfig()
        hc.bind = [f"fd://{sock.fileno()}" for sock in listening]
        hc.accesslog = logging.getLogger("greenroom.access") if config.log_level == "debug" else None
        hc.errorlog = logging.getLogger("greenroom.http")
        hc.graceful_timeout = 1.0  # after the drain (Shutdown) only idle keep-alive connections are left
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain_on_signals, shutdown, tree, config.graceful_shutdown_timeout_s)
            await nursery.start(tree.run)
            async with trio.open_nursery() as front:
                await front.start(partial(hypercorn_serve, app, hc, shutdown_trigger=shutdown.closed.wait))
                tree.listening = [_url(*sock.getsockname()[:2]) for sock in listening]
                log.info("greenroom serving on %s", ", ".join(tree.listening))
            nursery.cancel_scope.cancel()  # every request answered and the listeners closed: the tree goes


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), as hypercorn binds one; it listens once served."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    return sock


def _ollama_listen(config: Config) -> list[socket.socket]:
    """Ollama's port too, unless it is off, the same, or taken (a real Ollama running):
    then greenroom serves the Ollama API on its own port only, and says so."""
    if not config.ollama_port or config.ollama_port == config.port:
        return []
    try:
        return [_listen(config.host, config.ollama_port)]
    except OSError as exc:
        log.warning(
            "not listening on Ollama's port %d (%s); the Ollama API is on port %d",
            config.ollama_port,
            exc.strerror,
            config.port,
        )
        return []


async def _drain_on_signals(shutdown: Shutdown, tree: Tree, timeout_s: float) -> None:
    """The first SIGTERM or SIGINT drains the front end (Shutdown.drain), after which serve()
    closes it and cancels the tree — each actor's nursery cancels its child (hard kill after a
    timeout), so no process outlives the root; a second one ends the drain's wait at once."""

    def end(error: GreenroomError) -> None:
        for slot in tree.slots.values():
            if slot.client is not None:
                slot.client.fail_all(error)

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            async for signum in signals:
                name = signal.Signals(signum).name
                if shutdown.draining:
                    log.info("%s received again: ending the requests still running now", name)
                    shutdown.hurry()
                    continue
                log.info("%s received: taking no new requests, draining for up to %g s", name, timeout_s)
                nursery.start_soon(shutdown.drain, timeout_s, tree.monitoring.close, end)
