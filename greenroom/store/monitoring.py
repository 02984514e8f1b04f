"""Monitoring configuration, in SQLite (WAL) under the cache root, so it survives a restart:
per model, whether monitoring is on, which attached SAE it reads and how many features each
record lists. The front end is the only reader and writer (supervisor/monitoring.py); the
records themselves live in its memory only.
"""

from __future__ import annotations

import attrs

from greenroom.engines.demo.demo_model import default_cache_dir
from greenroom.store.database import Database

DEFAULT_TOP_K = 8

SCHEMA = """
CREATE TABLE IF NOT EXISTS monitoring (
    model TEXT PRIMARY KEY,
    enabled INTEGER NOT NULL,
    sae_id TEXT,              -- NULL until one is chosen
    top_k INTEGER NOT NULL
);
"""


@attrs.frozen
class MonitorConfig:
    model: str
    enabled: bool = False
    sae_id: str | None = None
    top_k: int = DEFAULT_TOP_K


class MonitoringStore:
    def __init__(self, cache_dir: str | None):
        self.path = default_cache_dir(cache_dir) / "monitoring.sqlite3"
        self._db = Database(self.path, SCHEMA).transaction

    def all(self) -> dict[str, MonitorConfig]:
        with self._db() as db:
            rows = db.execute("SELECT model, enabled, sae_id, top_k FROM monitoring").fetchall()
        return {row[0]: MonitorConfig(row[0], bool(row[1]), row[2], row[3]) for row in rows}

    def put(self, config: MonitorConfig) -> None:
        with self._db() as db:
            db.execute(
                "INSERT OR REPLACE INTO monitoring VALUES (?, ?, ?, ?)",
                (config.model, int(config.enabled), config.sae_id, config.top_k),
            )
