"""Feature dashboards, their jobs and users' labels, in SQLite (WAL) under the cache root
(`<cache>/models/dashboards.sqlite3`), so all of it survives a restart.

One row per job: the model and SAE, what it was asked (`spec`), its status (queued, running,
done, failed, cancelled, interrupted), its progress and error. One row per feature of a model's
SAE: its logit effects and its corpus statistics (engines/dashboards.py makes both), each with
the job that wrote it. One row per label a user set. The front end writes jobs and labels
(http/manage/features_api.py); the engine actor running a job writes its progress and results
(actors/dashboard_runner.py) and reads the job's status, which is how a cancel reaches it. A job
the server was running when it stopped is marked `interrupted` when it starts again
(`interrupt_unfinished`): jobs are not resumed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from greenroom.engines.demo.demo_model import default_cache_dir
from greenroom.store.database import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    sae_id TEXT NOT NULL,
    status TEXT NOT NULL,
    spec TEXT NOT NULL,       -- JSON: features, corpus, top_k, context_tokens, max_tokens
    progress TEXT NOT NULL,   -- JSON: engines/dashboards.DashboardJob.progress
    error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS features (
    model TEXT NOT NULL,
    sae_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    logits TEXT,              -- JSON: {promoted, suppressed}: [{id, text, value}]
    logits_job TEXT,
    stats TEXT,               -- JSON: {tokens, density, histogram, contexts}
    stats_job TEXT,
    PRIMARY KEY (model, sae_id, idx)
);
CREATE TABLE IF NOT EXISTS labels (
    model TEXT NOT NULL,
    sae_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    label TEXT NOT NULL,
    PRIMARY KEY (model, sae_id, idx)
);
"""
UNFINISHED = ("queued", "running")
FINISHED = ("done", "failed", "cancelled", "interrupted")
INTERRUPTED = "the server, or the engine holding the model, stopped while the job ran; start it again"
_JOB_COLUMNS = "id, model, sae_id, status, spec, progress, error, created_at, updated_at"


class DashboardStore:
    def __init__(self, cache_dir: str | Path | None):
        self.path = default_cache_dir(cache_dir) / "dashboards.sqlite3"
        self._db = Database(self.path, SCHEMA).transaction

    # -- jobs ---------------------------------------------------------------------------

    def add_job(self, job_id: str, model: str, sae_id: str, spec: dict) -> dict:
        now = time.time()
        with self._db() as db:
            db.execute(
                f"INSERT INTO jobs ({_JOB_COLUMNS}) VALUES (?, ?, ?, 'queued', ?, '{{}}', NULL, ?, ?)",
                (job_id, model, sae_id, json.dumps(spec), now, now),
            )
        return self.job(job_id)

    def job(self, job_id: str) -> dict | None:
        with self._db() as db:
            row = db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _job(row)

    def jobs(self, model: str, sae_id: str) -> list[dict]:
        with self._db() as db:
            rows = db.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE model = ? AND sae_id = ? ORDER BY created_at",
                (model, sae_id),
            ).fetchall()
        return [_job(row) for row in rows]

    def set_status(self, job_id: str, status: str, progress: dict | None = None, error: str | None = None) -> str:
        """Move an unfinished job on (a finished one stays as it is: a cancel that came first
        wins); returns the status the job has now."""
        with self._db() as db:
            row = db.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return "cancelled"
            if row[0] in FINISHED:
                return row[0]
            sets, args = ["status = ?", "updated_at = ?"], [status, time.time()]
            if progress is not None:
                sets.append("progress = ?")
                args.append(json.dumps(progress))
            if error is not None:
                sets.append("error = ?")
                args.append(error)
            db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?", (*args, job_id))
        return status

    def interrupt_unfinished(self) -> int:
        """Mark every job left queued or running interrupted: the server that ran them stopped."""
        with self._db() as db:
            return db.execute(
                "UPDATE jobs SET status = 'interrupted', error = ?, updated_at = ? WHERE status IN ('queued', 'running')",
                (INTERRUPTED, time.time()),
            ).rowcount

    def interrupt_job(self, job_id: str) -> None:
        self.set_status(job_id, "interrupted", error=INTERRUPTED)

    # -- features -------------------------------------------------------------------------

    def put_logits(self, model: str, sae_id: str, job_id: str, rows: list[tuple[int, dict]]) -> None:
        self._put(model, sae_id, job_id, "logits", rows)

    def put_stats(self, model: str, sae_id: str, job_id: str, rows: list[tuple[int, dict]]) -> None:
        self._put(model, sae_id, job_id, "stats", rows)

    def _put(self, model: str, sae_id: str, job_id: str, column: str, rows: list[tuple[int, dict]]) -> None:
        with self._db() as db:
            db.executemany(
                f"INSERT INTO features (model, sae_id, idx, {column}, {column}_job) VALUES (?, ?, ?, ?, ?) "
                f"ON CONFLICT (model, sae_id, idx) DO UPDATE SET {column} = excluded.{column}, "
                f"{column}_job = excluded.{column}_job",
                [(model, sae_id, index, json.dumps(value), job_id) for index, value in rows],
            )

    def feature(self, model: str, sae_id: str, index: int) -> dict:
        """{logits, logits_job, stats, stats_job, label}, each None where nothing was stored."""
        with self._db() as db:
            row = db.execute(
                "SELECT logits, logits_job, stats, stats_job FROM features WHERE model = ? AND sae_id = ? AND idx = ?",
                (model, sae_id, index),
            ).fetchone()
            label = db.execute(
                "SELECT label FROM labels WHERE model = ? AND sae_id = ? AND idx = ?", (model, sae_id, index)
            ).fetchone()
        row = row or (None, None, None, None)
        return {
            "logits": json.loads(row[0]) if row[0] else None,
            "logits_job": row[1],
            "stats": json.loads(row[2]) if row[2] else None,
            "stats_job": row[3],
            "label": label[0] if label else None,
        }

    def promoting(self, model: str, sae_id: str, token_id: int) -> list[tuple[int, float]]:
        """The features whose stored logit effects promote `token_id`: (index, its logit effect)."""
        with self._db() as db:
            rows = db.execute(
                "SELECT idx, logits FROM features WHERE model = ? AND sae_id = ? AND logits IS NOT NULL",
                (model, sae_id),
            ).fetchall()
        out = []
        for index, logits in rows:
            for token in json.loads(logits)["promoted"]:
                if token["id"] == token_id:
                    out.append((index, token["value"]))
        return out

    # -- labels ---------------------------------------------------------------------------

    def set_label(self, model: str, sae_id: str, index: int, label: str | None) -> None:
        with self._db() as db:
            if label:
                db.execute(
                    "INSERT OR REPLACE INTO labels (model, sae_id, idx, label) VALUES (?, ?, ?, ?)",
                    (model, sae_id, index, label),
                )
            else:
                db.execute("DELETE FROM labels WHERE model = ? AND sae_id = ? AND idx = ?", (model, sae_id, index))

    def labels(self, model: str, sae_id: str) -> dict[int, str]:
        with self._db() as db:
            rows = db.execute("SELECT idx, label FROM labels WHERE model = ? AND sae_id = ?", (model, sae_id))
            return dict(rows.fetchall())

    def labelled(self, model: str, sae_id: str, text: str) -> list[tuple[int, str]]:
        """The features whose label holds `text` (case-insensitive)."""
        with self._db() as db:
            rows = db.execute(
                "SELECT idx, label FROM labels WHERE model = ? AND sae_id = ? AND instr(lower(label), lower(?)) > 0 "
                "ORDER BY idx",
                (model, sae_id, text),
            )
            return rows.fetchall()


def _job(row: tuple) -> dict:
    return {
        "id": row[0],
        "model": row[1],
        "sae_id": row[2],
        "status": row[3],
        **json.loads(row[4]),
        "progress": json.loads(row[5]),
        "error": row[6],
        "created_at": row[7],
        "updated_at": row[8],
    }
