"""SAE monitoring in the front end: each model's configuration (persisted: store/monitoring.py),
what a generation of a monitored model asks its engine to read (`monitored`), and the records
generations bring back (`recorded`), kept in memory — the last RING_SIZE of them, and a copy to
every live subscriber.

A record is one choice's top-k SAE features, read pre-steering over every position it fed
the model (engines/steering.py, `Monitor`). A subscriber that does not keep up is never
waited for: what does not fit its buffer is dropped for it, and it is told how many.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable

import attrs
import trio

from greenroom.engines.base import MonitorRecord, MonitorRequest
from greenroom.errors import GreenroomError
from greenroom.protocol import Generate, Text
from greenroom.store.monitoring import MonitorConfig, MonitoringStore

RING_SIZE = 1000
SUBSCRIBER_BUFFER = 256  # records a subscriber may fall behind before it loses some


class Subscriber:
    """One live reader: `receive` gives ("record", record) or ("dropped", how many were lost)."""

    def __init__(self, model: str | None):
        self.model = model  # None: every model's records
        self._send, self._recv = trio.open_memory_channel(SUBSCRIBER_BUFFER)
        self._dropped = 0
        self._ended_by: GreenroomError | None = None

    async def receive(self) -> tuple[str, dict | int]:
        """The next item; once closed (and what came before is read), the error it was closed with."""
        try:
            return await self._recv.receive()
        except trio.EndOfChannel:
            raise self._ended_by from None

    def close(self, error: GreenroomError) -> None:
        self._ended_by = error
        self._send.close()

    def offer(self, record: dict) -> None:
        if self.model is not None and record["model"] != self.model:
            return
        try:
            if self._dropped:  # the gap is announced where it happened, before what came after it
                self._send.send_nowait(("dropped", self._dropped))
                self._dropped = 0
            self._send.send_nowait(("record", record))
        except trio.WouldBlock:
            self._dropped += 1


class Monitoring:
    """`steers(model)`: whether a model can steer (only those have the SAE hooks monitoring reads)."""

    def __init__(self, cache_dir: str | None, steers: Callable[[str], bool]):
        self._store = MonitoringStore(cache_dir)
        self._configs = self._store.all()  # read once: the front end is the only writer
        self._steers = steers
        self._ring: collections.deque[dict] = collections.deque(maxlen=RING_SIZE)
        self._last_id = 0
        self._subscribers: set[Subscriber] = set()

    def config(self, model: str) -> MonitorConfig:
        return self._configs.get(model) or MonitorConfig(model)

    def monitored(self, gen: Generate) -> Generate:
        """`gen` with its model's monitoring, when it is on (and the model can steer)."""
        config = self._configs.get(gen.model)
        if config is None or not config.enabled or not self._steers(gen.model):
            return gen
        return attrs.evolve(gen, monitor=MonitorRequest(config.sae_id, config.top_k))

    def recorded(self, gen: Generate, endpoint: str, events):
        """`events` (engine_client.RequestEvents), each finishing Text's monitor record kept on its way past."""
        return events if gen.monitor is None else _Recorded(self, gen, endpoint, events)

    async def configure(self, config: MonitorConfig) -> MonitorConfig:
        await trio.to_thread.run_sync(self._store.put, config)  # a disk write off the event loop
        self._configs[config.model] = config
        return config

    def record(self, model: str, request_id: str, endpoint: str, choice: int, monitored: MonitorRecord) -> dict:
        """Keep one choice's record (the engine's Monitor.result) and hand it to the subscribers."""
        self._last_id += 1
        record = {
            "id": self._last_id,
            "time": round(time.time(), 3),
            "model": model,
            "request_id": request_id,
            "endpoint": endpoint,
            "choice": choice,
            **attrs.asdict(monitored),
        }
        self._ring.append(record)
        for subscriber in self._subscribers:
            subscriber.offer(record)
        return record

    def records(self, model: str | None, since: int, limit: int) -> tuple[list[dict], int]:
        """Up to `limit` records newer than id `since` (of `model`, or all), oldest first, and the
        `since` that continues after them."""
        out = []
        for record in self._ring:
            if record["id"] > since and (model is None or record["model"] == model):
                if len(out) == limit:
                    return out, out[-1]["id"]
                out.append(record)
        return out, self._last_id  # below `since` after a restart renumbered them: start again

    def close(self, error: GreenroomError) -> None:
        """End every live subscription with `error` (the server is shutting down)."""
        for subscriber in self._subscribers:
            subscriber.close(error)
        self._subscribers.clear()

    @contextlib.contextmanager
    def subscribe(self, model: str | None):
        subscriber = Subscriber(model)
        self._subscribers.add(subscriber)
        try:
            yield subscriber
        finally:
            self._subscribers.discard(subscriber)


class _Recorded:
    """A request's events that record what the monitor read."""

    def __init__(self, monitoring: Monitoring, gen: Generate, endpoint: str, events):
        self._monitoring, self._gen, self._endpoint, self._events = monitoring, gen, endpoint, events

    def __aiter__(self):
        return self

    async def __anext__(self):
        return self._keep(await self._events.__anext__())

    def ready(self) -> list:
        return [self._keep(event) for event in self._events.ready()]

    def _keep(self, event):
        if isinstance(event, Text) and event.monitor is not None:
            self._monitoring.record(self._gen.model, self._gen.rid, self._endpoint, event.index, event.monitor)
        return event
