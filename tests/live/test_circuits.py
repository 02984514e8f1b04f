"""Circuits (spec: "Intensity coupling" for circuits, "X-miLLM-Circuit-Rung", "Embeddings are
never steered") and the steering lock, against a live server with the tiny demo model and
both its demo SAEs (layers 1 and 2): one λ for every layer, clamped at both ends into the
declared range, CIRCUIT_INTENSITY_MIN 0 (no range: "min" is "off"), members re-derived from the
authored strengths and clamped to ±200, slice_fallback under the cluster rule; the rung header
in RFC 8941 form and each case that omits it; GET /api/circuits/active; embeddings and scoring
unsteered with every circuit layer suppressed; circuits, dials, live values and the lock across
a restart."""

from __future__ import annotations

import itertools
import json
import sqlite3
import types

import httpx
import pytest
from conftest import MODEL, Server
from fake_hub import server_cache

from .test_intensity import ECHO, chat, text
from .test_steering_api import CONFIG, SAE_ID, UNSTEERABLE, put, steering

L2 = "sae_demo_tiny_l2"
RUNG = "X-miLLM-Circuit-Rung"
EDGE = '2; language="causally validated (edge)"'
LAYERS = [
    {"layer": 1, "members": [{"feature": 5, "strength": 80}]},
    {"layer": 2, "sae_id": L2, "members": [{"feature": 7, "strength": 180, "label": "strong"}]},
]
_names = itertools.count()


@pytest.fixture(scope="module")
def site(tmp_path_factory, model_cache):
    tmp = tmp_path_factory.mktemp("circuits")
    site = types.SimpleNamespace(tmp=tmp, cache=server_cache(tmp, model_cache))
    site.server = srv = Server(tmp, site.cache, CONFIG)
    assert post(srv, "/api/saes/attach", {"model": MODEL, "sae": "demo:tiny:2"}).status_code == 200
    docs = [
        ("edge", {"rung": 2, "layers": LAYERS, "intensity_range": [0.5, 1.5]}),
        ("loose", {"rung": 0, "layers": LAYERS}),  # no range: [CIRCUIT_INTENSITY_MIN, the server's max]
        (
            "backed",
            {
                "rung": 3,
                "layers": [*LAYERS, {"layer": 3, "members": [{"feature": 1, "strength": 50}]}],
                "intensity_range": [0.5, 1.5],
                "slice_fallback": "slice",
            },
        ),
        ("nowhere", {"rung": 1, "layers": [{"layer": 3, "members": [{"feature": 1, "strength": 50}]}]}),
    ]
    r = post(
        srv,
        "/api/clusters/import",
        {
            "format": "greenroom.cluster.v1",
            "name": "slice",
            "model": MODEL,
            "sae_id": SAE_ID,
            "members": [{"feature": 5, "strength": 100}],
        },
    )
    assert r.status_code == 200, r.text
    for name, doc in docs:
        r = post(srv, "/api/circuits/import", {"format": "greenroom.circuit.v1", "name": name, "model": MODEL, **doc})
        assert r.status_code == 200, r.text
    yield site
    site.server.stop()


@pytest.fixture
def srv(site):
    assert put(site.server, {"strengths": {}, "enabled": True}).json()["live"]
    return site.server


def post(srv: Server, path: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def activate(srv: Server, name: str) -> dict:
    r = post(srv, f"/api/circuits/{name}/activate")
    assert r.status_code == 200 and r.json()["live"], r.text
    return r.json()


def under(srv: Server, strengths: dict) -> str:
    """The greedy text with exactly these strengths (sae_id → feature → strength), by a plain profile."""
    name = f"cref{next(_names)}"
    r = post(srv, "/api/profiles", {"name": name, "model": MODEL, "strengths": strengths})
    assert r.status_code == 200, r.text
    return text(chat(srv, profile=name))


def active_circuit(srv: Server, **params) -> dict:
    """GET /api/circuits/active's entry for the demo model (one per steerable model; ?model= narrows)."""
    (entry,) = [
        e
        for e in httpx.get(srv.url + "/api/circuits/active", params=params, timeout=30).json()["models"]
        if e["model"] == MODEL
    ]
    return entry


def scaled(lam: float) -> dict:
    return {SAE_ID: {"5": 80 * lam}, L2: {"7": min(200.0, 180 * lam)}}


def test_an_active_circuit_steers_every_layer_and_carries_its_rung(srv):
    state = activate(srv, "edge")
    assert state["strengths"] == {SAE_ID: {"5": 80.0}, L2: {"7": 180.0}}
    assert state["serving"]["rung"] == 2 and state["serving"]["mode"] == "circuit"
    r = chat(srv)
    assert r.headers[RUNG] == EDGE and ECHO not in r.headers
    assert text(r) == under(srv, scaled(1)) != under(srv, {})
    active = active_circuit(srv)
    assert (active["model"], active["circuit"]["name"], active["serving_mode"]) == (MODEL, "edge", "circuit")
    assert active["steering"]["rung"] == 2 and active["steering"]["language"] == "causally validated (edge)"
    assert active["steering"]["header"] == EDGE and active["steering"]["intensity"] == 1.0
    assert {(row["layer"], row["sae_id"]) for row in active["steering"]["layers"]} == {(1, SAE_ID), (2, L2)}
    r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200 and r.headers[RUNG] == EDGE, r.text


def test_numeric_intensity_is_clamped_up_to_the_declared_floor(srv):
    activate(srv, "edge")
    r = chat(srv, steering_intensity=0.1)
    assert r.headers[ECHO] == "0.5" and r.headers[RUNG] == EDGE
    assert text(r) == under(srv, scaled(0.5))


def test_numeric_intensity_is_clamped_down_to_the_declared_top_and_members_to_200(srv):
    activate(srv, "edge")
    r = chat(srv, steering_intensity=2)
    assert r.headers[ECHO] == "1.5"
    assert text(r) == under(srv, scaled(1.5))  # 180 × 1.5 = 270 → 200; 80 × 1.5 = 120 keeps scaling


def test_only_an_exact_zero_goes_below_the_floor(srv):
    activate(srv, "edge")
    unsteered = under(srv, {})
    for value in (0, "off"):
        r = chat(srv, steering_intensity=value)
        assert r.headers[ECHO] == "0" and RUNG not in r.headers and text(r) == unsteered


def test_the_dial_is_absolute_not_compounding_on_the_stored_one(srv):
    activate(srv, "edge")
    r = httpx.put(srv.url + "/api/circuits/edge/intensity", json={"intensity": 1.5}, timeout=30)
    assert r.status_code == 200 and r.json()["state"]["live"], r.text
    assert r.json()["state"]["strengths"] == {SAE_ID: {"5": 120.0}, L2: {"7": 200.0}}
    try:
        r = chat(srv, steering_intensity=1)
        assert r.headers[ECHO] == "1" and text(r) == under(srv, scaled(1))  # not 1 × 1.5
    finally:
        assert httpx.put(srv.url + "/api/circuits/edge/intensity", json={"intensity": 1}, timeout=30).status_code == 200


def test_without_a_range_the_floor_is_circuit_intensity_min_and_min_is_off(srv):
    activate(srv, "loose")
    r = chat(srv, steering_intensity=0.1)
    assert r.headers[ECHO] == "0.1" and r.headers[RUNG] == '0; language="associated"'
    assert text(r) == under(srv, scaled(0.1))
    r = chat(srv, steering_intensity="min")
    assert r.headers[ECHO] == "0" and RUNG not in r.headers and text(r) == under(srv, {})
    assert chat(srv, steering_intensity="max").headers[ECHO] == "2"


def test_slice_fallback_serves_the_backing_cluster_under_the_cluster_rule_without_a_rung(srv):
    state = activate(srv, "backed")  # layer 3 has no SAE: its backing cluster steers
    assert state["serving"]["mode"] == "slice_fallback" and "rung" not in state["serving"]
    assert state["strengths"] == {SAE_ID: {"5": 100.0}}
    r = chat(srv)
    assert RUNG not in r.headers and text(r) == under(srv, {SAE_ID: {"5": 100.0}})
    r = chat(srv, steering_intensity=0.2)  # the cluster rule: dialling below the floor is honoured
    assert r.headers[ECHO] == "0.2" and RUNG not in r.headers
    assert text(r) == under(srv, {SAE_ID: {"5": 20.0}})
    assert chat(srv, steering_intensity="min").headers[ECHO] == "0.5"  # the cluster's floor
    active = active_circuit(srv, model=MODEL)
    assert (active["serving_mode"], active["steering"]) == ("slice_fallback", None)


def test_no_rung_without_an_active_circuit(srv):
    r = chat(srv)
    assert RUNG not in r.headers
    assert active_circuit(srv)["circuit"] is None


def test_no_rung_with_no_sae_on_any_member_layer(srv):
    state = activate(srv, "nowhere")
    assert state["serving"] == {"kind": "circuit", "name": "nowhere", "mode": None, "reason": "no_sae_attached"}
    assert state["strengths"] == {}
    r = chat(srv, steering_intensity=1)
    assert RUNG not in r.headers and ECHO not in r.headers  # an empty base: no echo either
    active = active_circuit(srv)
    assert (active["serving_mode"], active["reason"], active["steering"]) == (None, "no_sae_attached", None)


def test_no_rung_for_an_unparseable_definition(srv):
    # imported while layer 2 had no SAE, so its member past the SAE's width was not checked then
    assert post(srv, "/api/saes/detach", {"model": MODEL, "sae_id": L2}).status_code == 200
    try:
        r = post(
            srv,
            "/api/circuits/import",
            {
                "format": "greenroom.circuit.v1",
                "name": "wider",
                "model": MODEL,
                "rung": 3,
                "layers": [{"layer": 2, "members": [{"feature": 100000, "strength": 10}]}],
            },
        )
        assert r.status_code == 200, r.text
    finally:
        assert post(srv, "/api/saes/attach", {"model": MODEL, "sae": "demo:tiny:2"}).status_code == 200
    state = activate(srv, "wider")
    assert state["serving"]["reason"] == "unparseable_definition" and state["strengths"] == {}
    assert RUNG not in chat(srv).headers


def test_no_rung_while_steering_is_disabled(srv):
    activate(srv, "edge")
    assert put(srv, {"enabled": False}).json()["live"]
    r = chat(srv)
    assert RUNG not in r.headers and text(r) == under(srv, {})
    assert active_circuit(srv)["reason"] == "steering_disabled"


def test_a_member_past_an_attached_sae_is_refused_at_import(srv):
    r = post(
        srv,
        "/api/circuits/import",
        {
            "format": "greenroom.circuit.v1",
            "name": "bad",
            "model": MODEL,
            "rung": 1,
            "layers": [{"layer": 1, "members": [{"feature": 100000, "strength": 10}]}],
        },
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_feature_index", r.text


@pytest.mark.parametrize(
    "doc,param",
    [
        ({"rung": 4}, "rung"),
        ({"rung": True}, "rung"),
        ({"layers": []}, "layers"),
        ({"layers": [LAYERS[0], LAYERS[0]]}, "layers[1].layer"),
        ({"slice_fallback": "nothing"}, "slice_fallback"),
        ({"intensity_range": [1, 0.5]}, "intensity_range"),
        ({"name": "edge"}, "name"),
    ],
)
def test_a_bad_circuit_document_is_refused(srv, doc, param):
    body = {"format": "greenroom.circuit.v1", "name": "bad2", "model": MODEL, "rung": 2, "layers": LAYERS, **doc}
    r = post(srv, "/api/circuits/import", body)
    assert 400 <= r.status_code < 500 and r.json()["error"]["param"] == param, r.text


def test_embeddings_and_scoring_are_unsteered_on_every_circuit_layer(srv):
    def embed() -> list[float]:
        r = post(srv, "/v1/embeddings", {"model": MODEL, "input": "The river winds through the valley"})
        assert r.status_code == 200, r.text
        return r.json()["data"][0]["embedding"]

    def score() -> httpx.Response:
        r = post(srv, "/v1/completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 1, "logprobs": 3})
        assert r.status_code == 200, r.text
        return r

    unsteered, unscored = embed(), score().json()["choices"][0]["logprobs"]
    activate(srv, "edge")
    scored = score()
    assert embed() == unsteered and scored.json()["choices"][0]["logprobs"] == unscored
    assert scored.headers["X-miLLM-Steering"] == "none" and RUNG not in scored.headers


def test_the_lock_lists_one_model_and_everything_survives_a_restart(site):
    srv = site.server
    everything = {m["id"] for m in httpx.get(srv.url + "/v1/models", timeout=30).json()["data"]}
    assert len(everything) > 1
    r = httpx.put(srv.url + "/api/steering/lock", json={"model": MODEL}, timeout=30)
    assert r.status_code == 200 and r.json() == {"model": MODEL}, r.text
    assert [m["id"] for m in httpx.get(srv.url + "/v1/models", timeout=30).json()["data"]] == [MODEL]
    r = httpx.put(srv.url + "/api/steering/lock", json={"model": UNSTEERABLE}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "steering_unsupported", r.text
    activate(srv, "edge")
    assert httpx.put(srv.url + "/api/circuits/edge/intensity", json={"intensity": 0.8}, timeout=30).status_code == 200
    before = {
        p: httpx.get(srv.url + p, timeout=30).json() for p in ("/api/circuits", "/api/clusters", "/api/circuits/active")
    }
    steered = chat(srv)
    srv.stop()
    site.server = srv = Server(site.tmp, site.cache, CONFIG)
    assert {p: httpx.get(srv.url + p, timeout=30).json() for p in before} == before
    assert [m["id"] for m in httpx.get(srv.url + "/v1/models", timeout=30).json()["data"]] == [MODEL]
    again = chat(srv)
    assert again.headers[RUNG] == EDGE and text(again) == text(steered) == under(srv, scaled(0.8))
    assert httpx.delete(srv.url + "/api/steering/lock", timeout=30).json() == {"model": None}
    assert {m["id"] for m in httpx.get(srv.url + "/v1/models", timeout=30).json()["data"]} == everything


def test_a_generation_stays_steered_while_embeddings_and_scoring_run_between_its_steps(srv):
    activate(srv, "edge")
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 120,
        "temperature": 0,
    }
    alone = text(post(srv, "/v1/chat/completions", body))
    unsteered_embedding = post(srv, "/v1/embeddings", {"model": MODEL, "input": "stone bridges"}).json()
    parts = []
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200 and r.headers[RUNG] == EDGE
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            parts += [c["delta"].get("content") or "" for c in chunk["choices"]]
            if len(parts) == 3:  # mid-generation: unsteered passes between its decode steps
                assert (
                    post(srv, "/v1/embeddings", {"model": MODEL, "input": "stone bridges"}).json()["data"]
                    == unsteered_embedding["data"]
                )
                assert (
                    post(
                        srv, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1, "logprobs": 1}
                    ).status_code
                    == 200
                )
    assert "".join(parts) == alone  # every step of the generation was steered as when it ran alone


def test_a_circuit_exports_to_the_document_import_takes(srv):
    body = {
        "format": "greenroom.circuit.v1",
        "name": "trip",
        "model": MODEL,
        "description": "round trip",
        "rung": 3,
        "layers": LAYERS,
        "intensity_range": [0.5, 1.5],
        "intensity": 0.7,
        "slice_fallback": "slice",
    }
    assert post(srv, "/api/circuits/import", body).status_code == 200
    doc = httpx.get(srv.url + "/api/circuits/trip/export", timeout=30).json()
    assert doc == body
    before = httpx.get(srv.url + "/api/circuits/trip", timeout=30).json()
    assert httpx.delete(srv.url + "/api/circuits/trip", timeout=30).status_code == 200
    assert httpx.get(srv.url + "/api/circuits/trip/export", timeout=30).status_code == 404
    assert post(srv, "/api/circuits/import", doc).status_code == 200
    after = httpx.get(srv.url + "/api/circuits/trip", timeout=30).json()
    assert {k: v for k, v in after.items() if not k.endswith("_at")} == {
        k: v for k, v in before.items() if not k.endswith("_at")
    }


def make(srv: Server, kind: str, name: str, **doc) -> None:
    """A new steering document of `kind` (circuit, cluster or profile) steering the demo model."""
    if kind == "profile":
        r = post(srv, "/api/profiles", {"name": name, "model": MODEL, "strengths": {SAE_ID: {"5": 150}}, **doc})
    else:
        shape = (
            {"rung": 2, "layers": LAYERS}
            if kind == "circuit"
            else {"sae_id": SAE_ID, "members": [{"feature": 5, "strength": 100}]}
        )
        r = post(
            srv,
            f"/api/{kind}s/import",
            {"format": f"greenroom.{kind}.v1", "name": name, "model": MODEL, **shape, **doc},
        )
    assert r.status_code == 200, r.text


def unsteered_everywhere(srv: Server, unsteered: str) -> None:
    """The three views agree nothing steers, and generation is the unsteered greedy text."""
    state = steering(srv)
    assert (state["active"], state["serving"], state["strengths"], state["live"]) == (None, None, {}, True), state
    assert active_circuit(srv)["circuit"] is None and active_circuit(srv)["steering"] is None
    r = chat(srv)
    assert RUNG not in r.headers and text(r) == unsteered


@pytest.mark.parametrize("kind", ["circuit", "cluster", "profile"])
def test_deleting_the_active_base_deactivates_it(srv, kind):
    unsteered = text(chat(srv))
    name = f"gone{next(_names)}"
    make(srv, kind, name)
    r = post(srv, f"/api/{kind}s/{name}/activate")
    assert r.status_code == 200 and r.json()["live"] and r.json()["active"]["name"] == name, r.text
    assert text(chat(srv)) != unsteered
    r = httpx.delete(f"{srv.url}/api/{kind}s/{name}", timeout=30)
    assert r.status_code == 200, r.text
    state = r.json()["state"]
    assert r.json()["deleted"] and (state["active"], state["strengths"], state["live"]) == (None, {}, True), r.text
    assert state["version"] == steering(srv)["version"]
    unsteered_everywhere(srv, unsteered)


def test_deleting_a_document_that_is_not_steering_changes_no_state(srv):
    make(srv, "cluster", "idle")
    before = steering(srv)["version"]
    r = httpx.delete(srv.url + "/api/clusters/idle", timeout=30)
    assert r.json() == {"name": "idle", "deleted": True, "state": None} and steering(srv)["version"] == before


def test_deleting_the_cluster_an_active_circuit_falls_back_to_stops_its_steering(srv):
    unsteered = text(chat(srv))
    make(srv, "cluster", "backing")
    make(
        srv,
        "circuit",
        "fallen",
        layers=[{"layer": 3, "members": [{"feature": 1, "strength": 50}]}],
        slice_fallback="backing",
    )
    assert activate(srv, "fallen")["serving"]["mode"] == "slice_fallback" and text(chat(srv)) != unsteered
    state = httpx.delete(srv.url + "/api/clusters/backing", timeout=30).json()["state"]
    assert state["strengths"] == {} and state["serving"]["mode"] is None, state
    assert state["serving"]["reason"] == "no_sae_attached" and text(chat(srv)) == unsteered
    assert active_circuit(srv)["circuit"]["name"] == "fallen" and active_circuit(srv)["steering"] is None


def test_a_deleted_base_stays_deactivated_across_a_restart(site):
    srv = site.server
    assert put(srv, {"strengths": {}, "enabled": True}).json()["live"]
    unsteered = text(chat(srv))
    make(srv, "circuit", "greet")  # docs/steering.md's example: import, activate, delete
    activate(srv, "greet")
    assert httpx.delete(srv.url + "/api/circuits/greet", timeout=30).json()["state"]["active"] is None
    srv.stop()
    site.server = srv = Server(site.tmp, site.cache, CONFIG)
    unsteered_everywhere(srv, unsteered)
    # a store an earlier greenroom left with a deleted circuit active: deactivated at start
    make(srv, "circuit", "stale")
    activate(srv, "stale")
    srv.stop()
    with sqlite3.connect(site.cache / "models" / "steering.sqlite3") as db:
        assert db.execute("DELETE FROM circuits WHERE name = 'stale'").rowcount == 1
    site.server = srv = Server(site.tmp, site.cache, CONFIG)
    unsteered_everywhere(srv, unsteered)


@pytest.mark.parametrize(
    "method,path,body,status,code,param",
    [
        ("PUT", "/api/steering/lock", {}, 400, "missing_parameter", "model"),
        ("PUT", "/api/steering/lock", {"model": "nowhere"}, 404, "model_not_found", "model"),
        ("PUT", "/api/steering/lock", {"model": MODEL, "colour": "red"}, 400, "invalid_parameter", "colour"),
        ("GET", "/api/circuits/active?model=nowhere", None, 404, "model_not_found", "model"),
        ("GET", "/api/circuits/absent", None, 404, "circuit_not_found", "name"),
        ("GET", "/api/clusters/absent/export", None, 404, "profile_not_found", "name"),
        ("POST", "/api/circuits/absent/activate", None, 404, "circuit_not_found", "name"),
        ("POST", "/api/clusters/absent/activate", None, 404, "profile_not_found", "name"),
        ("PUT", "/api/circuits/absent/intensity", {"intensity": 1}, 404, "circuit_not_found", "name"),
        ("PUT", "/api/circuits/edge/intensity", {}, 400, "missing_parameter", "intensity"),
        ("PUT", "/api/circuits/edge/intensity", {"intensity": "max"}, 400, "invalid_parameter", "intensity"),
        ("PUT", "/api/circuits/edge/intensity", {"intensity": 2.5}, 400, "invalid_parameter", "intensity"),
        (
            "PUT",
            "/api/clusters/slice/intensity",
            {"intensity": 1, "reapply": True},
            400,
            "invalid_parameter",
            "reapply",
        ),
        ("DELETE", "/api/circuits/absent", None, 404, "circuit_not_found", "name"),
    ],
)
def test_bad_input_on_the_document_and_lock_routes_is_typed(srv, method, path, body, status, code, param):
    r = httpx.request(method, srv.url + path, json=body, timeout=30)
    assert r.status_code == status, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (code, param)
