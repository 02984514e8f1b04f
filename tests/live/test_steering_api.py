"""The steering management API (http/manage/steering_api.py) against live servers: SAEs attached,
listed and detached; live strengths that change greedy output and, cleared, restore it; the
typed refusals; the state surviving a server restart and an engine actor's crash (the
coordinator's state is pushed to the restarted actor)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from conftest import MODEL, Server
from fake_hub import server_cache

from greenroom.config import load_config

SAE_ID = "sae_demo_tiny_l1"  # the demo SAE of the tiny demo model's first SAE layer
UNSTEERABLE = "greenroom-demo-openvino"  # OpenVINO has no SAE hooks (GGUF steers: test_gguf_steering.py)
CONFIG = f"""
npu_actors = []
[[models]]
id = "{MODEL}"
source = "demo:tiny"
sae = "demo:tiny"
[[models]]
id = "{UNSTEERABLE}"
source = "demo-openvino:tiny"
engine = "openvino"
preload = false
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    tmp = tmp_path_factory.mktemp("steering")
    server = Server(tmp, server_cache(tmp, model_cache), CONFIG)
    yield server
    server.stop()


def steering(srv: Server) -> dict:
    rows = httpx.get(srv.url + "/api/steering", timeout=30).json()["models"]
    return next(row for row in rows if row["model"] == MODEL)


def live(srv: Server, timeout_s: float = 30) -> dict:
    """The model's steering once it is live on the engine actor."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = steering(srv)
        if state["live"] or time.monotonic() > deadline:
            assert state["live"], state
            return state
        time.sleep(0.1)


def put(srv: Server, body: dict) -> httpx.Response:
    return httpx.put(srv.url + "/api/steering", json={"model": MODEL, **body}, timeout=30)


def greedy(srv: Server) -> str:
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        timeout=60,
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 12,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_default_config_attaches_the_first_demo_sae_unsteered(srv):
    assert load_config().models[0].id == MODEL and load_config().models[0].sae == "demo:tiny"
    state = live(srv)
    assert state["strengths"] == {} and state["enabled"] and state["version"] >= 1
    (sae,) = state["saes"]
    assert sae["sae_id"] == SAE_ID
    assert (sae["layer"], sae["hook_point"], sae["width"], sae["d_in"]) == (1, "blocks.1.hook_resid_post", 512, 128)
    listed = httpx.get(srv.url + "/api/saes", timeout=30).json()
    assert [m["saes"] for m in listed["models"] if m["model"] == MODEL] == [state["saes"]]
    assert {"sae": "demo:tiny:2", "model_size": "tiny", "layer": 2} in listed["available"]


def test_attach_list_detach(srv):
    before = steering(srv)["version"]
    r = httpx.post(srv.url + "/api/saes/attach", json={"model": MODEL, "sae": "demo:tiny:2"}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["live"] and body["version"] == before + 1
    second = next(s for s in body["saes"] if s["sae_id"] == "sae_demo_tiny_l2")
    assert (second["layer"], second["architecture"], second["width"]) == (2, "jumprelu", 512)
    listed = httpx.get(srv.url + "/api/saes", timeout=30).json()["models"]
    assert {s["sae_id"] for m in listed if m["model"] == MODEL for s in m["saes"]} == {SAE_ID, "sae_demo_tiny_l2"}
    # one SAE per block
    again = httpx.post(
        srv.url + "/api/saes/attach", json={"model": MODEL, "sae": "demo:tiny:2", "sae_id": "x"}, timeout=60
    )
    assert again.status_code == 400 and again.json()["error"]["code"] == "invalid_parameter"
    r = httpx.post(srv.url + "/api/saes/detach", json={"model": MODEL, "sae_id": "sae_demo_tiny_l2"}, timeout=30)
    assert r.status_code == 200 and r.json()["live"] and r.json()["version"] == before + 2
    assert [s["sae_id"] for s in r.json()["saes"]] == [SAE_ID]


def test_an_sae_in_a_folder_named_sae_is_named_once(srv, model_cache, tmp_path):
    """…/sae/layer-2 is sae_layer-2, never sae_sae_layer-2."""
    import shutil

    from greenroom.engines.demo.demo_sae import ensure_demo_sae

    folder = tmp_path / "sae" / "layer-2"
    shutil.copytree(ensure_demo_sae(model_cache / "models", "tiny", 2), folder)
    r = httpx.post(srv.url + "/api/saes/attach", json={"model": MODEL, "sae": str(folder)}, timeout=60)
    assert r.status_code == 200, r.text
    assert "sae_layer-2" in {s["sae_id"] for s in r.json()["saes"]}
    assert (
        httpx.post(srv.url + "/api/saes/detach", json={"model": MODEL, "sae_id": "sae_layer-2"}, timeout=30).status_code
        == 200
    )


def test_strength_steers_greedy_output_and_clearing_restores_it(srv):
    unsteered = greedy(srv)
    r = put(srv, {"strengths": {SAE_ID: {"5": 150}}})
    assert r.status_code == 200 and r.json()["live"], r.text
    assert r.json()["strengths"] == {SAE_ID: {"5": 150.0}}
    steered = greedy(srv)
    assert steered != unsteered
    r = put(srv, {"enabled": False})  # disabled: the strengths stay, nothing steers
    assert r.json()["strengths"] == {SAE_ID: {"5": 150.0}} and greedy(srv) == unsteered
    r = put(srv, {"enabled": True})
    assert greedy(srv) == steered
    r = put(srv, {"strengths": {}})
    assert r.status_code == 200 and r.json()["live"] and r.json()["strengths"] == {}
    assert greedy(srv) == unsteered


@pytest.mark.parametrize(
    "path,body,code,param",
    [
        ("steering", {"strengths": {SAE_ID: {"5": 201}}}, "invalid_parameter", f"strengths.{SAE_ID}.5"),
        ("steering", {"strengths": {SAE_ID: {"5": -200.5}}}, "invalid_parameter", f"strengths.{SAE_ID}.5"),
        ("steering", {"strengths": {SAE_ID: {"512": 1}}}, "invalid_feature_index", f"strengths.{SAE_ID}.512"),
        ("steering", {"strengths": {SAE_ID: {"-1": 1}}}, "invalid_feature_index", f"strengths.{SAE_ID}.-1"),
        ("steering", {"strengths": {"sae_nope": {"5": 1}}}, "sae_not_attached", "strengths.sae_nope"),
        ("steering", {"model": UNSTEERABLE, "strengths": {}}, "steering_unsupported", "model"),
        ("steering", {"enabled": "yes"}, "invalid_parameter", "enabled"),
        ("steering", {"strength": {}}, "invalid_parameter", "strength"),
        ("detach", {"sae_id": "sae_nope"}, "sae_not_attached", "sae_id"),
        ("attach", {"model": UNSTEERABLE, "sae": "demo:tiny"}, "steering_unsupported", "model"),
        ("attach", {"sae": "/etc/passwd"}, "invalid_sae", "sae"),
        ("attach", {"sae": "demo:tiny:9"}, "invalid_sae", "sae"),
    ],
)
def test_refusals_are_typed_400s(srv, path, body, code, param):
    before = steering(srv)
    url = srv.url + ("/api/steering" if path == "steering" else f"/api/saes/{path}")
    r = httpx.request("PUT" if path == "steering" else "POST", url, json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["param"] == param
    assert steering(srv)["version"] == before["version"]  # nothing changed


def test_state_survives_a_restart_and_an_engine_crash(tmp_path, model_cache):
    cache = server_cache(tmp_path, model_cache)
    first = Server(tmp_path, cache, CONFIG)
    try:
        r = put(first, {"strengths": {SAE_ID: {"7": -120}}})
        assert r.json()["live"], r.text
        version, steered = r.json()["version"], greedy(first)
    finally:
        first.stop()
    second = Server(tmp_path, cache, CONFIG)
    try:
        state = live(second)
        assert state["version"] == version and state["strengths"] == {SAE_ID: {"7": -120.0}}
        assert [s["sae_id"] for s in state["saes"]] == [SAE_ID]
        assert greedy(second) == steered
        os.kill(second.actors()["cpu"]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while second.actors()["cpu"]["restarts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert live(second)["version"] == version  # pushed again to the restarted actor
        assert greedy(second) == steered
    finally:
        second.stop()
