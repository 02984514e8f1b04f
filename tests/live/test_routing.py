"""Routing among placements of one model (Tree.route): the preferred placement serves
while it is idle; a busy or missing one falls back to another actor holding the model —
reported in the NPU proxy's headers — and the idle timer unloads what is not used."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import httpx
import pytest
from conftest import MODEL, UNENDING, Server

CONFIG = """
engine_actors = ["cpu", "cpu2"]
idle_unload_s = 3
[[models]]
id = "greenroom-demo"
source = "demo:tiny"
actor = "cpu"
[[models]]
id = "greenroom-demo"
source = "demo:tiny"
actor = "cpu2"
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    server = Server(tmp_path_factory.mktemp("routing"), model_cache, CONFIG)
    yield server
    server.stop()


def generate(srv, **extra) -> httpx.Response:
    r = httpx.post(
        srv.url + "/api/generate",
        timeout=60,
        json={"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 4}, **extra},
    )
    assert r.status_code == 200, r.text
    return r


def served_by(srv) -> dict[str, int]:
    return {name: a["counters"]["completed"] for name, a in srv.actors().items() if name.startswith("cpu")}


def test_the_preferred_placement_serves_while_idle(srv):
    before = served_by(srv)
    r = generate(srv)
    assert r.headers["X-NPU-Proxy-Route-Reason"] == "preferred_device"
    assert r.headers["X-NPU-Proxy-Device"] == "CPU"
    assert int(r.headers["X-NPU-Proxy-Token-Count"]) == r.json()["prompt_eval_count"]
    after = served_by(srv)
    assert after["cpu"] == before["cpu"] + 1 and after["cpu2"] == before["cpu2"]


@contextlib.contextmanager
def stream_beside(url: str, body: dict):
    """A stream that decodes while the block runs, however fast the machine: it is read until
    the block ends, then closed (which cancels it)."""
    started, finished = threading.Event(), threading.Event()

    def read():
        with httpx.stream("POST", url, timeout=120, json=body) as r:
            for _ in r.iter_lines():
                started.set()
                if finished.is_set():
                    break

    t = threading.Thread(target=read)
    t.start()
    try:
        assert started.wait(30)
        yield
        assert t.is_alive(), "the stream ended before the block did"
    finally:
        finished.set()
        t.join(120)


def test_a_busy_placement_falls_back_to_another(srv):
    body = {"model": MODEL, "prompt": "Once", "max_tokens": 30000, "stream": True, **UNENDING}
    with stream_beside(srv.url + "/v1/completions", body):
        before = served_by(srv)
        r = generate(srv)
    assert r.headers["X-NPU-Proxy-Route-Reason"] == "fallback_busy"
    assert served_by(srv)["cpu2"] == before["cpu2"] + 1


def test_a_missing_placement_falls_back_to_another(srv):
    generate(srv)
    os.kill(srv.actors()["cpu"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while srv.actors()["cpu"]["state"] == "ready" and time.monotonic() < deadline:
        time.sleep(0.05)
    r = generate(srv)
    assert r.headers["X-NPU-Proxy-Route-Reason"] == "fallback_unavailable"
    models = {m["id"]: m for m in httpx.get(srv.url + "/api/models").json()["models"]}
    assert [p["actor"] for p in models[MODEL]["replicas"]] == ["cpu", "cpu2"]


def test_an_idle_model_is_unloaded_by_the_idle_timer(srv):
    generate(srv)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        replicas = httpx.get(srv.url + "/api/models").json()["models"][0]["replicas"]
        if all(p["state"] == "unloaded" for p in replicas):
            break
        time.sleep(0.5)
    assert all(p["state"] == "unloaded" for p in replicas), replicas
    assert generate(srv).json()["done"]  # and the next request loads it again


MIXED = """
engine_actors = ["cpu"]
npu_actors = ["npu0"]
[[models]]
id = "mixed"
source = "demo-openvino:tiny"
engine = "openvino"
actor = "npu0"
[[models]]
id = "mixed"
source = "demo:tiny"
actor = "cpu"
"""


def test_an_npu_placement_preferred_with_a_transformers_fallback(own_server):
    """The NPU proxy's case: OpenVINO's NPU pipeline (on the CPU here) preferred, the
    transformers engine taking over while it is busy; fields only both honour are accepted."""
    import ollama

    srv = own_server(MIXED)
    client = ollama.Client(host=srv.url)
    raw = httpx.post(
        srv.url + "/api/generate",
        timeout=60,
        json={"model": "mixed", "prompt": "hi", "stream": False, "options": {"num_predict": 4}},
    )
    assert raw.headers["X-NPU-Proxy-Route-Reason"] == "preferred_device"
    assert raw.headers["X-NPU-Proxy-Device"] == "CPU"  # what computed: OpenVINO's CPU standing in
    assert client.chat(model="mixed", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4}).done

    body = {"model": "mixed", "prompt": "Once", "options": {"num_predict": 20000, **UNENDING}}
    with stream_beside(srv.url + "/api/generate", body):
        raw = httpx.post(
            srv.url + "/api/generate",
            timeout=60,
            json={"model": "mixed", "prompt": "hi", "stream": False, "options": {"num_predict": 4}},
        )
    assert raw.headers["X-NPU-Proxy-Route-Reason"] == "fallback_busy"
    assert raw.headers["X-NPU-Proxy-Device"] == "CPU"  # the transformers engine's cpu, spelt as the NPU's

    r = httpx.post(srv.url + "/v1/completions", json={"model": "mixed", "prompt": "x", "logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["code"] == "field_not_honoured"
    assert "openvino/transformers" in r.json()["error"]["message"]


def test_the_device_header_has_one_spelling_whatever_the_engine_calls_it():
    from greenroom.engines.base import ModelInfo
    from greenroom.http.ollama.ollama_api import routing_headers
    from greenroom.supervisor.lifecycle import Serving

    for device, shown in (("cpu", "CPU"), ("CPU", "CPU"), ("cuda:1", "GPU"), ("npu:0", "NPU"), ("NPU.0", "NPU")):
        serving = Serving(ModelInfo("m", "openvino", 2048, "int8", device, 1), "npu", "single_engine_runtime")
        assert routing_headers(serving, 3)["X-NPU-Proxy-Device"] == shown
