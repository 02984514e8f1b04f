"""The steering state, in SQLite (WAL) under the cache root, so it survives a restart.

One row per model: the SAEs attached to it (what each is and where its files are), the
live per-feature strengths, whether steering is enabled, and the state's version, which
grows with every change. One row per profile: a named set of strengths for one model's
SAEs, with the identities of the SAEs it refers to, so an export is self-contained. The steering coordinator actor (actors/steering_actor.py) is the
only writer; engine actors receive the state it resolves, never this file.
"""

from __future__ import annotations

import json

import attrs

from greenroom.engines.demo_model import default_cache_dir
from greenroom.store.database import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS steering (
    model TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    enabled INTEGER NOT NULL,
    saes TEXT NOT NULL,       -- JSON: [{sae_id, source, path, layer, block, hook_point, width, d_in, architecture}]
    strengths TEXT NOT NULL   -- JSON: {sae_id: {feature: strength}}, features as decimal strings
);
CREATE TABLE IF NOT EXISTS profiles (
    name TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    description TEXT NOT NULL,
    strengths TEXT NOT NULL,  -- JSON, as steering.strengths
    saes TEXT NOT NULL,       -- JSON: [{sae_id, source, layer, hook_point, width, d_in, architecture}]
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
"""


@attrs.define
class ModelSteering:
    model: str
    version: int = 0  # 0: nothing was ever set for this model
    enabled: bool = True
    saes: list[dict] = attrs.Factory(list)
    strengths: dict[str, dict[str, float]] = attrs.Factory(dict)


class SteeringStore:
    def __init__(self, cache_dir: str | None):
        self.root = default_cache_dir(cache_dir)
        self.path = self.root / "steering.sqlite3"
        self._db = Database(self.path, SCHEMA).transaction

    def get(self, model: str) -> ModelSteering:
        with self._db() as db:
            row = db.execute("SELECT version, enabled, saes, strengths FROM steering WHERE model = ?",
                             (model,)).fetchone()
        if row is None:
            return ModelSteering(model)
        return ModelSteering(model, row[0], bool(row[1]), json.loads(row[2]), json.loads(row[3]))

    def put(self, state: ModelSteering) -> ModelSteering:
        """Store `state` as the next version of its model's steering; returns it versioned."""
        with self._db() as db:
            row = db.execute("SELECT version FROM steering WHERE model = ?", (state.model,)).fetchone()
            state = attrs.evolve(state, version=(row[0] if row else 0) + 1)
            db.execute("INSERT OR REPLACE INTO steering VALUES (?, ?, ?, ?, ?)",
                       (state.model, state.version, int(state.enabled), json.dumps(state.saes),
                        json.dumps(state.strengths)))
        return state

    def profiles(self) -> list[dict]:
        with self._db() as db:
            rows = db.execute(f"SELECT {_PROFILE_COLUMNS} FROM profiles ORDER BY name").fetchall()
        return [_profile(row) for row in rows]

    def profile(self, name: str) -> dict | None:
        with self._db() as db:
            row = db.execute(f"SELECT {_PROFILE_COLUMNS} FROM profiles WHERE name = ?", (name,)).fetchone()
        return None if row is None else _profile(row)

    def put_profile(self, profile: dict) -> None:
        with self._db() as db:
            db.execute(f"INSERT OR REPLACE INTO profiles ({_PROFILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (profile["name"], profile["model"], profile["description"], json.dumps(profile["strengths"]),
                        json.dumps(profile["saes"]), profile["created_at"], profile["updated_at"]))

    def delete_profile(self, name: str) -> bool:
        with self._db() as db:
            return db.execute("DELETE FROM profiles WHERE name = ?", (name,)).rowcount > 0


_PROFILE_COLUMNS = "name, model, description, strengths, saes, created_at, updated_at"


def _profile(row: tuple) -> dict:
    return {"name": row[0], "model": row[1], "description": row[2], "strengths": json.loads(row[3]),
            "saes": json.loads(row[4]), "created_at": row[5], "updated_at": row[6]}
