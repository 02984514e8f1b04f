"""The steering state, in SQLite (WAL) under the cache root, so it survives a restart.

One row per model: the SAEs attached to it (what each is and where its files are), the
live per-feature strengths, whether steering is enabled, the active base the live values
came from (a profile, cluster or circuit), and the state's version, which grows with every
change. One row per profile: a named set of strengths for one model's SAEs, with the
identities of the SAEs it refers to, so an export is self-contained; a cluster is a profile
with an intensity range and a persistent dial. One row per circuit: members per layer, its
evidence rung, range, dial and backing cluster. One row of settings: the model locked for
steering. This module owns the rows and their SQL, nothing of what they mean (bases, dials and
checks are actors/steering_bases.py's and steering_rules.py's). The steering coordinator actor
(actors/steering_actor.py) is its only user and so the only writer; engine actors receive the
state it resolves, never this file.
"""

from __future__ import annotations

import json

import attrs

from greenroom.engines.demo.demo_model import default_cache_dir
from greenroom.store.database import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS steering (
    model TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    enabled INTEGER NOT NULL,
    saes TEXT NOT NULL,       -- JSON: [{sae_id, source, path, layer, block, hook_point, width, d_in, architecture,
                              --         reads, decoder_norm, residual_norm, coefficient_per_strength}]
    strengths TEXT NOT NULL,  -- JSON: {sae_id: {feature: strength}}, features as decimal strings
    active TEXT               -- JSON: {"kind": "profile" | "circuit", "name"}: what the live values came from
);
CREATE TABLE IF NOT EXISTS profiles (
    name TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    description TEXT NOT NULL,
    strengths TEXT NOT NULL,  -- JSON, as steering.strengths
    saes TEXT NOT NULL,       -- JSON: [{sae_id, source, layer, hook_point, width, d_in, architecture}]
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    cluster TEXT              -- JSON, clusters only: {"intensity", "intensity_range", "labels"}
);
CREATE TABLE IF NOT EXISTS circuits (
    name TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    definition TEXT NOT NULL, -- JSON: {description, rung, layers: [{layer, sae_id, members, labels}],
                              --        intensity_range, slice_fallback}
    intensity REAL NOT NULL,  -- the persistent dial
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL       -- JSON
);
"""
ADDED_COLUMNS = (("steering", "active", "TEXT"), ("profiles", "cluster", "TEXT"))


@attrs.define
class ModelSteering:
    model: str
    version: int = 0  # 0: nothing was ever set for this model
    enabled: bool = True
    saes: list[dict] = attrs.Factory(list)
    strengths: dict[str, dict[str, float]] = attrs.Factory(dict)
    active: dict | None = None  # {"kind": "profile" | "circuit", "name"}; None: values set directly


class SteeringStore:
    def __init__(self, cache_dir: str | None):
        self.root = default_cache_dir(cache_dir)
        self.path = self.root / "steering.sqlite3"
        self._db = Database(self.path, SCHEMA, added_columns=ADDED_COLUMNS).transaction

    def get(self, model: str) -> ModelSteering:
        with self._db() as db:
            row = db.execute(
                "SELECT version, enabled, saes, strengths, active FROM steering WHERE model = ?", (model,)
            ).fetchone()
        if row is None:
            return ModelSteering(model)
        return ModelSteering(
            model, row[0], bool(row[1]), json.loads(row[2]), json.loads(row[3]), json.loads(row[4]) if row[4] else None
        )

    def models(self) -> list[ModelSteering]:
        with self._db() as db:
            names = [row[0] for row in db.execute("SELECT model FROM steering ORDER BY model")]
        return [self.get(name) for name in names]

    def put(self, state: ModelSteering) -> ModelSteering:
        """Store `state` as the next version of its model's steering; returns it versioned."""
        with self._db() as db:
            row = db.execute("SELECT version FROM steering WHERE model = ?", (state.model,)).fetchone()
            state = attrs.evolve(state, version=(row[0] if row else 0) + 1)
            db.execute(
                "INSERT OR REPLACE INTO steering (model, version, enabled, saes, strengths, active) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    state.model,
                    state.version,
                    int(state.enabled),
                    json.dumps(state.saes),
                    json.dumps(state.strengths),
                    json.dumps(state.active) if state.active else None,
                ),
            )
        return state

    def put_saes(self, model: str, saes: list[dict]) -> None:
        """Rewrite the records of `model`'s attached SAEs in place (what was measured of them):
        not a steering change, so the version stays."""
        with self._db() as db:
            db.execute("UPDATE steering SET saes = ? WHERE model = ?", (json.dumps(saes), model))

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
            db.execute(
                f"INSERT OR REPLACE INTO profiles ({_PROFILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    profile["name"],
                    profile["model"],
                    profile["description"],
                    json.dumps(profile["strengths"]),
                    json.dumps(profile["saes"]),
                    profile["created_at"],
                    profile["updated_at"],
                    json.dumps(profile["cluster"]) if profile.get("cluster") else None,
                ),
            )

    def delete_profile(self, name: str) -> bool:
        with self._db() as db:
            return db.execute("DELETE FROM profiles WHERE name = ?", (name,)).rowcount > 0

    def circuits(self) -> list[dict]:
        with self._db() as db:
            rows = db.execute(f"SELECT {_CIRCUIT_COLUMNS} FROM circuits ORDER BY name").fetchall()
        return [_circuit(row) for row in rows]

    def circuit(self, name: str) -> dict | None:
        with self._db() as db:
            row = db.execute(f"SELECT {_CIRCUIT_COLUMNS} FROM circuits WHERE name = ?", (name,)).fetchone()
        return None if row is None else _circuit(row)

    def put_circuit(self, circuit: dict) -> None:
        definition = {k: v for k, v in circuit.items() if k not in _CIRCUIT_OWN}
        with self._db() as db:
            db.execute(
                f"INSERT OR REPLACE INTO circuits ({_CIRCUIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    circuit["name"],
                    circuit["model"],
                    json.dumps(definition),
                    circuit["intensity"],
                    circuit["created_at"],
                    circuit["updated_at"],
                ),
            )

    def delete_circuit(self, name: str) -> bool:
        with self._db() as db:
            return db.execute("DELETE FROM circuits WHERE name = ?", (name,)).rowcount > 0

    def setting(self, key: str):
        with self._db() as db:
            row = db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put_setting(self, key: str, value) -> None:
        with self._db() as db:
            if value is None:
                db.execute("DELETE FROM settings WHERE key = ?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (key, json.dumps(value)))


_PROFILE_COLUMNS = "name, model, description, strengths, saes, created_at, updated_at, cluster"
_CIRCUIT_COLUMNS = "name, model, definition, intensity, created_at, updated_at"
_CIRCUIT_OWN = ("name", "model", "intensity", "created_at", "updated_at")  # columns, not in the definition


def _profile(row: tuple) -> dict:
    return {
        "name": row[0],
        "model": row[1],
        "description": row[2],
        "strengths": json.loads(row[3]),
        "saes": json.loads(row[4]),
        "created_at": row[5],
        "updated_at": row[6],
        "cluster": json.loads(row[7]) if row[7] else None,
    }


def _circuit(row: tuple) -> dict:
    """A stored circuit; a definition that no longer parses is kept as {"unparseable": reason}
    (it is listed, and never steers)."""
    try:
        definition = json.loads(row[2])
        if not isinstance(definition, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        definition = {"unparseable": str(exc)}
    return {
        "name": row[0],
        "model": row[1],
        **definition,
        "intensity": row[3],
        "created_at": row[4],
        "updated_at": row[5],
    }
