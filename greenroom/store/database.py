"""One SQLite file of the store: WAL (readers never wait on the one writer), its schema
created once per process, and one transaction per `transaction()` block.

A file that cannot be used — locked by another writer past BUSY_TIMEOUT_S, read-only, on a full
disk, unreadable — is the typed 503 `storage_unavailable` naming the file and SQLite's reason,
never an untyped failure: the transaction is rolled back, so nothing of it was stored, and the
next transaction tries the file again."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path

from greenroom.errors import GreenroomError

log = logging.getLogger("greenroom.store")

# how long a transaction waits for another's write lock: far past any write of greenroom's own
# (milliseconds), short enough that an answer waiting on a stuck file is not held for long
BUSY_TIMEOUT_S = 5.0


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
        try:
            if not self._ready:
                self._create()
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
            try:
                if self._foreign_keys:
                    conn.execute("PRAGMA foreign_keys=ON")  # per connection, as SQLite has it
                with conn:  # one transaction
                    yield conn
            finally:
                conn.close()
        except (sqlite3.OperationalError, OSError) as exc:
            raise self._unavailable(exc) from None
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:  # a constraint or a misuse: greenroom's own fault
                raise
            raise self._unavailable(exc) from None  # "file is not a database", "malformed"

    def _create(self) -> None:
        """The file, WAL mode and the tables: once, not per call."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.closing(sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)) as conn:
            conn.execute("PRAGMA journal_mode=WAL")  # persistent: set in the file
            conn.executescript(self._schema)
            for table, column, declaration in self._added_columns:
                if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            conn.commit()
        self._ready = True

    def _unavailable(self, exc: Exception) -> GreenroomError:
        self._ready = False  # the next transaction makes the file again if it went (or lost its tables)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        log.warning("store %s unavailable: %s", self.path, reason)
        return GreenroomError(
            "storage_unavailable", f"the store {self.path} could not be used ({reason}); nothing was changed in it"
        )
