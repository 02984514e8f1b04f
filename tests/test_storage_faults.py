"""A store file that cannot be written (store/database.py): every writer answers the typed 503
`storage_unavailable` naming the file, a Responses answer is kept and said unstored, nothing is
logged as unhandled, and the stores work again once the file does.

The fault is another writer holding the file's lock (BEGIN EXCLUSIVE) past the busy timeout, as a
stuck process or a backup tool would: unlike chmod it stops root's writes too, on any filesystem."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import httpx
import openai
import pytest
from conftest import MODEL, Server
from fake_hub import server_cache

from greenroom.engines.demo_model import default_cache_dir

CONFIG = f"""
npu_actors = []
[[models]]
id = "{MODEL}"
source = "demo:tiny"
sae = "demo:tiny"
"""
SAE_ID = "sae_demo_tiny_l1"


def ollama_error(body: dict) -> dict:
    """Ollama's flat envelope: the message is `error`."""
    return {"code": body["code"], "message": body["error"]}


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    tmp = tmp_path_factory.mktemp("storage")
    cache = server_cache(tmp, model_cache)
    server = Server(tmp, cache, CONFIG)
    server.stores = default_cache_dir(cache)
    yield server
    server.stop()


@contextlib.contextmanager
def locked(path: Path):
    """`path` with its write lock held by another connection for the block."""
    assert path.exists(), path
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        conn.rollback()
        conn.close()


def unavailable(r: httpx.Response, store: str, envelope=lambda body: body["error"]) -> bool:
    error = envelope(r.json())
    return r.status_code == 503 and error["code"] == "storage_unavailable" and store in error["message"]


def test_a_response_that_cannot_be_stored_is_answered_and_said_unstored(srv):
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
    first = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
    with locked(srv.stores / "responses.sqlite3"):
        raw = client.responses.with_raw_response.create(
            model=MODEL, input="Go on", max_output_tokens=4, previous_response_id=first.id
        )
        whole = raw.parse()
        *_, last = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, stream=True)
        streamed = last.response  # response.incomplete: max_output_tokens cut it
        assert client.responses.retrieve(first.id).id == first.id  # reads go on meanwhile
    assert whole.status == "incomplete" and whole.output_text and whole.store is False
    why = raw.headers["X-Greenroom-Not-Stored"]
    assert why.startswith("storage_unavailable: ") and "responses.sqlite3" in why and "locked" in why, why
    assert streamed.output_text and streamed.store is False
    for unstored in (whole.id, streamed.id):
        with pytest.raises(openai.NotFoundError) as exc:
            client.responses.create(model=MODEL, input="More", max_output_tokens=2, previous_response_id=unstored)
        assert exc.value.body["code"] == "response_not_found"
    # the file works again: stored as asked
    again = client.responses.with_raw_response.create(
        model=MODEL, input="Go on", max_output_tokens=4, previous_response_id=first.id
    )
    assert again.parse().store is True and "X-Greenroom-Not-Stored" not in again.headers
    assert client.responses.retrieve(again.parse().id).output_text == again.parse().output_text


def test_steering_monitoring_and_model_registry_writes_are_typed(srv):
    def steer(strength: float) -> httpx.Response:
        body = {"model": MODEL, "strengths": {SAE_ID: {"5": strength}}}
        return httpx.put(srv.url + "/api/steering", json=body, timeout=60)

    def monitor(enabled: bool) -> httpx.Response:
        return httpx.put(srv.url + "/api/monitoring", json={"model": MODEL, "enabled": enabled}, timeout=60)

    def copy() -> httpx.Response:
        return httpx.post(srv.url + "/api/copy", json={"source": MODEL, "destination": "kept"}, timeout=60)

    def tags() -> list[str]:
        return [m["name"] for m in httpx.get(srv.url + "/api/tags", timeout=30).json()["models"]]

    assert steer(10).status_code == 200
    version = httpx.get(srv.url + "/api/steering", timeout=30).json()["models"][0]["version"]
    with locked(srv.stores / "steering.sqlite3"):  # the steering coordinator's, across the actor boundary
        assert unavailable(steer(20), "steering.sqlite3")
    assert httpx.get(srv.url + "/api/steering", timeout=30).json()["models"][0]["version"] == version
    assert steer(20).status_code == 200

    with locked(srv.stores / "monitoring.sqlite3"):
        assert unavailable(monitor(True), "monitoring.sqlite3")
    assert httpx.get(srv.url + "/api/monitoring", timeout=30).json()["models"][0]["enabled"] is False
    assert monitor(True).status_code == 200

    with locked(srv.stores / "registry.sqlite3"):  # the Ollama surface: its flat envelope
        assert unavailable(copy(), "registry.sqlite3", envelope=ollama_error)
        assert "kept" not in tags()  # nothing half made
    assert copy().status_code == 200 and "kept" in tags()
    with locked(srv.stores / "registry.sqlite3"):
        r = httpx.request("DELETE", srv.url + "/api/delete", json={"model": "kept"}, timeout=60)
        assert unavailable(r, "registry.sqlite3", envelope=ollama_error)
        assert "kept" in tags()
    assert httpx.request("DELETE", srv.url + "/api/delete", json={"model": "kept"}, timeout=60).status_code == 200


def test_no_store_failure_is_logged_as_unhandled(srv):
    log = srv.log_path.read_text(errors="replace")
    assert "store " in log and "unavailable: database is locked" in log
    assert "unhandled" not in log and "Traceback" not in log, log[-3000:]
