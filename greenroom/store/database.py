"""One SQLite file of the store: WAL (readers never wait on the one writer), its schema
created once per process, and one transaction per `transaction()` block."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path


class Database:
    def __init__(
        self, path: Path, schema: str, foreign_keys: bool = False, added_columns: tuple[tuple[str, str, str], ...] = ()
    ):
        """`added_columns`: (table, column, declaration) added since a table was first made, so a
        file an older greenroom wrote gains them (CREATE TABLE IF NOT EXISTS leaves it as it is)."""
        self.path, self._schema, self._foreign_keys = Path(path), schema, foreign_keys
        self._added_columns = added_columns
        self._ready = False

    @contextlib.contextmanager
    def transaction(self):
        if not self._ready:  # the file, WAL mode and the tables: once, not per call
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as conn:
                conn.execute("PRAGMA journal_mode=WAL")  # persistent: set in the file
                conn.executescript(self._schema)
                for table, column, declaration in self._added_columns:
                    if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
                conn.commit()
            self._ready = True
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            if self._foreign_keys:
                conn.execute("PRAGMA foreign_keys=ON")  # per connection, as SQLite has it
            with conn:  # one transaction
                yield conn
        finally:
            conn.close()
