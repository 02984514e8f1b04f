"""One SQLite file of the store: WAL (readers never wait on the one writer), its schema
created once per process, and one transaction per `transaction()` block."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path


class Database:
    def __init__(self, path: Path, schema: str, foreign_keys: bool = False):
        self.path, self._schema, self._foreign_keys = Path(path), schema, foreign_keys
        self._ready = False

    @contextlib.contextmanager
    def transaction(self):
        if not self._ready:  # the file, WAL mode and the tables: once, not per call
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as conn:
                conn.execute("PRAGMA journal_mode=WAL")  # persistent: set in the file
                conn.executescript(self._schema)
            self._ready = True
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            if self._foreign_keys:
                conn.execute("PRAGMA foreign_keys=ON")  # per connection, as SQLite has it
            with conn:  # one transaction
                yield conn
        finally:
            conn.close()
