"""A store file that cannot be written (store/database.py): every writer answers the typed 503
`storage_unavailable` naming the file, a Responses answer is kept and said unstored, nothing is
logged as unhandled, and the stores work again once the file does.

The fault is another writer holding the file's lock (BEGIN EXCLUSIVE) past the busy timeout, as a
stuck process or a backup tool would: unlike chmod it stops root's writes too, on any filesystem."""

from __future__ import annotations

import concurrent.futures
import contextlib
import sqlite3
from pathlib import Path

import httpx
import openai
import pytest
from conftest import MODEL, Server
from fake_hub import server_cache

from greenroom.engines.demo.demo_model import default_cache_dir

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

    def stream_last():
        *_, last = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4, stream=True)
        return last.response  # response.incomplete: max_output_tokens cut it

    with locked(srv.stores / "responses.sqlite3"), concurrent.futures.ThreadPoolExecutor(2) as pool:
        streaming = pool.submit(stream_last)  # beside the other, so the test waits out the busy timeout once
        raw = client.responses.with_raw_response.create(
            model=MODEL, input="Go on", max_output_tokens=4, previous_response_id=first.id
        )
        whole, streamed = raw.parse(), streaming.result()
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

    def copy(destination: str) -> httpx.Response:
        return httpx.post(srv.url + "/api/copy", json={"source": MODEL, "destination": destination}, timeout=60)

    def delete(name: str) -> httpx.Response:
        return httpx.request("DELETE", srv.url + "/api/delete", json={"model": name}, timeout=60)

    def tags() -> list[str]:
        return [m["name"] for m in httpx.get(srv.url + "/api/tags", timeout=30).json()["models"]]

    assert steer(10).status_code == 200 and copy("kept").status_code == 200
    version = httpx.get(srv.url + "/api/steering", timeout=30).json()["models"][0]["version"]
    stores = ("steering.sqlite3", "monitoring.sqlite3", "registry.sqlite3")
    with contextlib.ExitStack() as held, concurrent.futures.ThreadPoolExecutor(4) as pool:
        for name in stores:
            held.enter_context(locked(srv.stores / name))
        # each write waits out the busy timeout: side by side, so the test waits it once
        steered, monitored, copied, deleted = (
            pool.submit(write, arg) for write, arg in ((steer, 20), (monitor, True), (copy, "made"), (delete, "kept"))
        )
        assert unavailable(steered.result(), "steering.sqlite3")  # the coordinator's, across the actor boundary
        assert unavailable(monitored.result(), "monitoring.sqlite3")
        assert unavailable(copied.result(), "registry.sqlite3", envelope=ollama_error)  # Ollama's flat envelope
        assert unavailable(deleted.result(), "registry.sqlite3", envelope=ollama_error)
        assert "made" not in tags() and "kept" in tags()  # nothing half made, nothing half deleted
    assert httpx.get(srv.url + "/api/steering", timeout=30).json()["models"][0]["version"] == version
    assert httpx.get(srv.url + "/api/monitoring", timeout=30).json()["models"][0]["enabled"] is False
    # the files work again
    assert steer(20).status_code == 200 and monitor(True).status_code == 200
    assert copy("made").status_code == 200 and delete("kept").status_code == 200
    assert "made" in tags() and "kept" not in tags()


def test_no_store_failure_is_logged_as_unhandled(srv):
    log = srv.log_path.read_text(errors="replace")
    assert "store " in log and "unavailable: database is locked" in log
    assert "unhandled" not in log and "Traceback" not in log, log[-3000:]
