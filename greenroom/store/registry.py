"""The model registry: what /api/pull, /api/copy and /api/create added to the server, in
SQLite (WAL) under the cache root, so those models survive a restart.

Two tables. `repos`: each Hugging Face repository pulled — the commit, where its files
are (`<cache>/models/hub/<owner>/<name>`), and whether a caller's token was needed
(`authenticated`). `models`: each name the server serves because of those routes — its placement
(source, engine, …; a model created from an uploaded GGUF file has its blob as its source,
store/blobs.py), the defaults a created model applies (system, template, parameters,
messages) and what /api/show says of it (license, parent_model), and the repository whose files
it uses, so the files go only when the last name using them does (a blob likewise).

Each call opens its own connection: calls come from the trio loop and from worker
threads alike, and a connection costs less than a millisecond.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sqlite3
import time
from pathlib import Path

import attrs

from greenroom.engines.demo.demo_model import default_cache_dir
from greenroom.store.database import Database

log = logging.getLogger("greenroom.store.registry")

SCHEMA = """
CREATE TABLE IF NOT EXISTS repos (
    repo TEXT PRIMARY KEY,
    revision TEXT NOT NULL,
    path TEXT NOT NULL,
    authenticated INTEGER NOT NULL,
    pulled_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS models (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('pulled', 'copy', 'created')),
    spec TEXT NOT NULL,
    defaults TEXT,
    repo TEXT REFERENCES repos(repo),
    created_at REAL NOT NULL
);
"""


@attrs.frozen
class Entry:
    name: str
    kind: str  # pulled | copy | created
    spec: dict  # Tree.add_model's arguments: source, engine, actor, dtype, n_ctx, threads, chat_template
    defaults: dict | None  # a created model's system, template, parameters, messages, license, parent_model
    repo: str | None


class Registry:
    def __init__(self, cache_dir: str | None):
        self.root = default_cache_dir(cache_dir)
        self.path = self.root / "registry.sqlite3"
        self.hub_dir = self.root / "hub"
        self._db = Database(self.path, SCHEMA, foreign_keys=True).transaction

    def repo_dir(self, repo: str) -> Path:
        return self.hub_dir.joinpath(*repo.split("/"))

    # repositories -----------------------------------------------------------------------
    def record_pull(self, repo: str, revision: str, path: Path, authenticated: bool, entries: list[Entry]) -> None:
        """A finished pull: the repository and the names it is served as, in one transaction."""
        with self._db() as db:
            db.execute(
                "INSERT INTO repos VALUES (?, ?, ?, ?, ?) ON CONFLICT(repo) DO UPDATE SET "
                "revision = excluded.revision, path = excluded.path, "
                "authenticated = excluded.authenticated, pulled_at = excluded.pulled_at",
                (repo, revision, str(path), int(authenticated), time.time()),
            )
            for e in entries:
                self._put(db, e)

    # models -----------------------------------------------------------------------------
    def add(self, entry: Entry) -> None:
        with self._db() as db:
            self._put(db, entry)

    @staticmethod
    def _put(db: sqlite3.Connection, e: Entry) -> None:
        db.execute(
            "INSERT OR REPLACE INTO models VALUES (?, ?, ?, ?, ?, ?)",
            (
                e.name,
                e.kind,
                json.dumps(e.spec),
                json.dumps(e.defaults) if e.defaults is not None else None,
                e.repo,
                time.time(),
            ),
        )

    def get(self, name: str) -> Entry | None:
        with self._db() as db:
            row = db.execute("SELECT name, kind, spec, defaults, repo FROM models WHERE name = ?", (name,)).fetchone()
        return _entry(row) if row else None

    def entries(self) -> list[Entry]:
        with self._db() as db:
            rows = db.execute("SELECT name, kind, spec, defaults, repo FROM models ORDER BY created_at").fetchall()
        return [_entry(r) for r in rows]

    def remove(self, name: str) -> None:
        """Forget `name` (its repository's files stay until `prune` finds them unused)."""
        with self._db() as db:
            db.execute("DELETE FROM models WHERE name = ?", (name,))

    def prune(self, repo: str) -> Path | None:
        """Forget a pulled repository no name uses any more, returning its directory (the
        caller deletes the files); None while a name still uses it."""
        with self._db() as db:
            if db.execute("SELECT 1 FROM models WHERE repo = ?", (repo,)).fetchone():
                return None
            row = db.execute("SELECT path FROM repos WHERE repo = ?", (repo,)).fetchone()
            db.execute("DELETE FROM repos WHERE repo = ?", (repo,))
        return Path(row[0]) if row else None

    def delete_files(self, path: Path) -> None:
        """Remove a pulled repository's directory, and its owner's when that is now empty;
        never anything outside the hub directory."""
        path = path.resolve()
        hub = self.hub_dir.resolve()
        if hub not in path.parents:
            raise ValueError(f"refusing to delete {path}: not below {hub}")
        shutil.rmtree(path, ignore_errors=True)
        if path.parent != hub:
            with contextlib.suppress(OSError):
                path.parent.rmdir()

    # start-up ---------------------------------------------------------------------------
    def restore(self, tree) -> None:
        """Place every registered model on `tree` again (at start-up, before it runs). A
        model whose files are gone, or whose name the configuration now uses, is skipped
        with a warning and kept in the registry."""
        for e in self.entries():
            if e.name in tree.model_states:
                log.warning("registered model %r is not restored: the configuration defines that name", e.name)
                continue
            source = e.spec["source"]
            if not source.startswith("demo") and not Path(source).exists():
                log.warning("registered model %r is not restored: %s is gone", e.name, source)
                continue
            place(tree, e)


def place(tree, e: Entry):
    """Put a registry entry on the tree (on its recorded actor, or the first engine actor
    when that one no longer exists); the placement carries a created model's defaults."""
    spec = {
        k: v
        for k, v in e.spec.items()
        if k in ("source", "engine", "actor", "dtype", "n_ctx", "threads", "chat_template")
    }
    spec["defaults"] = e.defaults or None
    try:
        return tree.add_model(e.name, **spec)
    except ValueError:  # the recorded engine actor is not in this server's tree
        return tree.add_model(e.name, **{**spec, "actor": "auto"})


def _entry(row) -> Entry:
    return Entry(row[0], row[1], json.loads(row[2]), json.loads(row[3]) if row[3] else None, row[4])
