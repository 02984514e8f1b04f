"""`greenroom serve`: the root actor runs the supervisor and the HTTP front end."""

from __future__ import annotations

import logging
import signal
import socket

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from greenroom.actors import runtime
from greenroom.config import Config
from greenroom.http.app import create_app
from greenroom.http.connection import DrainBody
from greenroom.store.registry import Registry
from greenroom.supervisor.tree import Tree

log = logging.getLogger("greenroom")


async def serve(config: Config) -> None:
    async with runtime.open_root("supervisor", runtime.tractor_loglevel(config.log_level)):
        tree = Tree(config)
        Registry(config.cache_dir).restore(tree)  # models added by /api/pull, /api/copy, /api/create
        app = DrainBody(create_app(tree))  # keep-alive after responses that leave a body unread
        hc = HypercornConfig()
        hc.bind = [f"{config.host}:{config.port}"] + _ollama_bind(config)
        hc.accesslog = logging.getLogger("greenroom.access") if config.log_level == "debug" else None
        hc.errorlog = logging.getLogger("greenroom.http")
        hc.graceful_timeout = 1.0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
            await nursery.start(tree.run)
            await nursery.start(hypercorn_serve, app, hc)
            log.info("greenroom serving on %s", ", ".join(f"http://{b}" for b in hc.bind))


def _ollama_bind(config: Config) -> list[str]:
    """Ollama's port too, unless it is off, the same, or taken (a real Ollama running):
    then greenroom serves the Ollama API on its own port only, and says so."""
    if not config.ollama_port or config.ollama_port == config.port:
        return []
    with socket.socket() as s:
        try:
            s.bind((config.host, config.ollama_port))
        except OSError as exc:
            log.warning(
                "not listening on Ollama's port %d (%s); the Ollama API is on port %d",
                config.ollama_port,
                exc.strerror,
                config.port,
            )
            return []
    return [f"{config.host}:{config.ollama_port}"]


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    """SIGTERM/SIGINT cancel the whole tree: each actor's nursery cancels its child
    (hard kill after a timeout), so no process outlives the root."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("%s received, shutting down", signal.Signals(signum).name)
            scope.cancel()
            return
