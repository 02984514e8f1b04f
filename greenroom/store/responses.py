"""Stored responses (/v1/responses with `store`), in SQLite (WAL) under the cache root, so a
conversation continued with `previous_response_id` survives a restart.

One row per response: the Response object as it was answered (what GET returns), the
conversation it ends — the chat messages of every earlier turn, its input and its output,
without the instructions (OpenAI's rule: a response's instructions are not carried over), so a
continuation is that list followed by its own input — and its own input as the items OpenAI
lists (GET /v1/responses/{id}/input_items; null in a row written before they were kept). The
front end is the only reader and writer; it calls from worker threads (trio.to_thread), one
connection per call.
"""

from __future__ import annotations

import json
import time

import attrs

from greenroom.engines.demo.demo_model import default_cache_dir
from greenroom.store.database import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    response TEXT NOT NULL,      -- the Response object, JSON
    conversation TEXT NOT NULL,  -- the chat messages it ends, JSON
    stored_at REAL NOT NULL,
    input_items TEXT             -- its input, as listed items, JSON
);
"""


@attrs.frozen
class Stored:
    response: dict
    conversation: list[dict]
    input_items: list[dict] | None


class ResponseStore:
    def __init__(self, cache_dir: str | None):
        self.path = default_cache_dir(cache_dir) / "responses.sqlite3"
        self._db = Database(self.path, SCHEMA, added_columns=(("responses", "input_items", "TEXT"),)).transaction

    def put(self, response: dict, conversation: list[dict], input_items: list[dict]) -> None:
        with self._db() as db:
            db.execute(
                "INSERT OR REPLACE INTO responses (id, response, conversation, stored_at, input_items) "
                "VALUES (?, ?, ?, ?, ?)",
                (response["id"], json.dumps(response), json.dumps(conversation), time.time(), json.dumps(input_items)),
            )

    def get(self, response_id: str) -> Stored | None:
        with self._db() as db:
            row = db.execute(
                "SELECT response, conversation, input_items FROM responses WHERE id = ?", (response_id,)
            ).fetchone()
        if row is None:
            return None
        return Stored(json.loads(row[0]), json.loads(row[1]), None if row[2] is None else json.loads(row[2]))

    def delete(self, response_id: str) -> bool:
        with self._db() as db:
            return db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0
