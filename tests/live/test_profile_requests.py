"""The per-request `profile` field on chat completions (spec: "Per-request steering with
profile") against a live server with a cache of its own: the request is steered exactly as the
same strengths set live, the live state is as it was afterwards; the typed refusals (unknown
profile, a profile whose SAE was detached, OpenVINO before any load, scoring, text completions);
no SAE attached → unsteered; and the operator-wins race: a PUT /api/steering mid-stream stays."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import MODEL, Server
from fake_hub import server_cache

from .test_steering_api import CONFIG, SAE_ID, UNSTEERABLE, greedy, put, steering

STRENGTHS = {SAE_ID: {"5": 150.0}}
OTHER = {SAE_ID: {"9": -60.0}}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    tmp = tmp_path_factory.mktemp("profile-requests")
    server = Server(tmp, server_cache(tmp, model_cache), CONFIG)
    r = httpx.post(
        server.url + "/api/profiles", json={"name": "loud", "model": MODEL, "strengths": STRENGTHS}, timeout=30
    )
    assert r.status_code == 200, r.text
    yield server
    server.stop()


def chat(srv: Server, **extra) -> httpx.Response:
    return httpx.post(srv.url + "/v1/chat/completions", json={**CHAT, **extra}, timeout=60)


def test_a_profile_steers_that_request_as_its_strengths_set_live_and_the_live_state_stays(srv):
    assert put(srv, {"strengths": OTHER}).json()["live"]
    other = greedy(srv)
    before = steering(srv)
    r = chat(srv, profile="loud")
    assert r.status_code == 200, r.text
    profiled = r.json()["choices"][0]["message"]["content"]
    assert steering(srv) == before and greedy(srv) == other  # the live state is untouched, and still steers
    assert put(srv, {"strengths": STRENGTHS}).json()["live"]
    assert greedy(srv) == profiled != other  # the profile replaced the live strengths, not added to them
    assert put(srv, {"strengths": {}}).json()["live"]


def test_an_unknown_profile_is_a_404(srv):
    r = chat(srv, profile="nowhere")
    assert r.status_code == 404, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("profile_not_found", "profile")


def test_a_profile_whose_sae_was_detached_is_a_400(srv):
    r = httpx.post(srv.url + "/api/saes/attach", json={"model": MODEL, "sae": "demo:tiny:2"}, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(
        srv.url + "/api/profiles",
        json={"name": "l2", "model": MODEL, "strengths": {"sae_demo_tiny_l2": {"1": 9}}},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert (
        httpx.post(
            srv.url + "/api/saes/detach", json={"model": MODEL, "sae_id": "sae_demo_tiny_l2"}, timeout=30
        ).status_code
        == 200
    )
    r = chat(srv, profile="l2")
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("sae_not_attached", "profile")


def test_an_engine_without_sae_hooks_is_refused_before_any_load(srv):
    def loaded() -> bool:
        return any(UNSTEERABLE in a["models"] for a in srv.actors().values())

    was = loaded()
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        timeout=60,
        json={"model": UNSTEERABLE, "messages": [{"role": "user", "content": "Hi"}], "profile": "loud"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "field_not_honoured", r.text
    assert r.json()["error"]["param"] == "profile" and loaded() == was


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", {**CHAT, "max_tokens": 1, "logprobs": True}),  # scoring: always unsteered
        ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 4}),  # the spec: chat only
    ],
)
def test_scoring_and_text_completions_refuse_a_profile(srv, path, body):
    r = httpx.post(srv.url + path, json={**body, "profile": "loud"}, timeout=60)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("field_not_honoured", "profile")


def test_a_steering_write_mid_stream_wins(srv):
    assert put(srv, {"strengths": {}}).json()["live"]
    with httpx.stream(
        "POST",
        srv.url + "/v1/chat/completions",
        timeout=120,
        json={**CHAT, "max_tokens": 400, "temperature": 1, "seed": 1, "stream": True, "profile": "loud"},
    ) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))  # generating now
        written = put(srv, {"strengths": OTHER})
        assert written.status_code == 200 and written.json()["live"], written.text
        frames = [line for line in lines if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]" and all("error" not in json.loads(f[6:]) for f in frames[:-1])
    state = steering(srv)
    assert state["strengths"] == OTHER and state["version"] == written.json()["version"] and state["live"]
    assert greedy(srv) == greedy_with(srv, OTHER)


def greedy_with(srv: Server, strengths: dict) -> str:
    assert put(srv, {"strengths": strengths}).json()["live"]
    return greedy(srv)


def test_with_no_sae_attached_a_profile_request_runs_unsteered(srv):
    assert put(srv, {"strengths": {}}).json()["live"]
    unsteered = greedy(srv)
    assert (
        httpx.post(srv.url + "/api/saes/detach", json={"model": MODEL, "sae_id": SAE_ID}, timeout=30).status_code == 200
    )
    r = chat(srv, profile="loud")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == unsteered
    assert (
        httpx.post(srv.url + "/api/saes/attach", json={"model": MODEL, "sae": "demo:tiny"}, timeout=60).status_code
        == 200
    )
