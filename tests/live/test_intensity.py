"""Per-request `steering_intensity` and clusters (spec: "Intensity coupling") against a live
server with the tiny demo model and its demo SAE, one test per rule: the cluster's cap (its
declared range, else the server's maximum), "min"/"max", dialling down always honoured, the
persistent dial, the base (named profile, else the active one, else the live values),
0/"off" without validating the base, the X-miLLM-Steering-Intensity echo and each case that
omits it, and the typed refusals. A dialled request's text is compared with the same request
under a plain profile holding the strengths the rule should give (a plain profile applies its
strengths exactly and never touches the live state)."""

from __future__ import annotations

import itertools

import httpx
import pytest
from conftest import MODEL, Server
from fake_hub import server_cache

from .test_steering_api import SAE_ID, put

BARE = "greenroom-bare"  # a transformers model with no SAE attached
CONFIG = f"""
npu_actors = []
intensity_max = 1.6
[[models]]
id = "{MODEL}"
source = "demo:tiny"
sae = "demo:tiny"
[[models]]
id = "{BARE}"
source = "demo:tiny"
preload = false
"""
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 12, "temperature": 0}
ECHO = "X-miLLM-Steering-Intensity"
OPEN = [{"feature": 5, "strength": 100.0}]  # no intensity_range: the server's cap (1.6) and floor (0.5)
RANGED = [{"feature": 5, "strength": 100.0}, {"feature": 9, "strength": -40.0, "label": "formal"}]
_names = itertools.count()


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    tmp = tmp_path_factory.mktemp("intensity")
    server = Server(tmp, server_cache(tmp, model_cache), CONFIG)
    for name, members, extra in (
        ("open", OPEN, {}),
        ("ranged", RANGED, {"intensity_range": [0.5, 1.5]}),
        ("wide", OPEN, {"intensity_range": [0.2, 3.0]}),
    ):
        r = cluster_import(server, name, members, **extra)
        assert r.status_code == 200, r.text
    yield server
    server.stop()


def cluster_import(srv: Server, name: str, members: list, **extra) -> httpx.Response:
    return httpx.post(
        srv.url + "/api/clusters/import",
        timeout=30,
        json={
            "format": "greenroom.cluster.v1",
            "name": name,
            "model": MODEL,
            "sae_id": SAE_ID,
            "members": members,
            **extra,
        },
    )


def chat(srv: Server, **extra) -> httpx.Response:
    return httpx.post(srv.url + "/v1/chat/completions", json={**CHAT, **extra}, timeout=60)


def text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def under(srv: Server, features: dict[str, float]) -> str:
    """The greedy text with exactly these strengths on the demo SAE (a plain profile's request)."""
    name = f"ref{next(_names)}"
    r = httpx.post(
        srv.url + "/api/profiles",
        timeout=30,
        json={"name": name, "model": MODEL, "strengths": {SAE_ID: features} if features else {}},
    )
    assert r.status_code == 200, r.text
    return text(chat(srv, profile=name))


def dial(srv: Server, kind: str, name: str, value) -> httpx.Response:
    return httpx.put(f"{srv.url}/api/{kind}/{name}/intensity", json={"intensity": value}, timeout=30)


@pytest.fixture(autouse=True)
def clear(srv):
    """Each test starts from live values {} (no active base), steering enabled."""
    assert put(srv, {"strengths": {}, "enabled": True}).json()["live"]


def test_a_cluster_is_listed_with_its_members_range_and_dial(srv):
    r = httpx.get(srv.url + "/api/clusters/ranged", timeout=30)
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["sae_id"], got["intensity"], got["intensity_range"], got["active"]) == (SAE_ID, 1.0, [0.5, 1.5], False)
    assert got["members"] == [{"feature": 5, "strength": 100.0}, {"feature": 9, "strength": -40.0, "label": "formal"}]
    names = [c["name"] for c in httpx.get(srv.url + "/api/clusters", timeout=30).json()["clusters"]]
    assert {"open", "ranged", "wide"} <= set(names)


def test_numeric_intensity_scales_the_cluster_and_is_echoed(srv):
    r = chat(srv, profile="open", steering_intensity=0.5)
    assert r.headers[ECHO] == "0.5"
    assert text(r) == under(srv, {"5": 50.0}) != under(srv, {"5": 100.0})


def test_dialling_below_the_declared_floor_is_honoured(srv):
    r = chat(srv, profile="ranged", steering_intensity=0.2)
    assert r.headers[ECHO] == "0.2"
    assert text(r) == under(srv, {"5": 20.0, "9": -8.0})


def test_numeric_intensity_is_capped_at_the_declared_range(srv):
    r = chat(srv, profile="ranged", steering_intensity=2)
    assert r.headers[ECHO] == "1.5"
    assert text(r) == under(srv, {"5": 150.0, "9": -60.0})


def test_without_a_declared_range_the_cap_is_the_servers_maximum(srv):
    r = chat(srv, profile="open", steering_intensity=2)
    assert r.headers[ECHO] == "1.6"  # intensity_max = 1.6 in this server's config
    assert text(r) == under(srv, {"5": 160.0})


@pytest.mark.parametrize(
    "cluster,symbol,resolved",
    [
        ("ranged", "min", "0.5"),
        ("ranged", "max", "1.5"),  # the declared range's ends
        ("open", "min", "0.5"),
        ("open", "max", "1.6"),  # CLUSTER_INTENSITY_MIN and the server's maximum
        ("wide", "min", "0.2"),
        ("wide", "max", "2"),  # [0.2, 3] within the [0, 2] envelope
    ],
)
def test_symbols_resolve_to_the_range_ends(srv, cluster, symbol, resolved):
    r = chat(srv, profile=cluster, steering_intensity=symbol)
    assert r.status_code == 200 and r.headers[ECHO] == resolved, r.text


def test_a_strength_scaled_past_200_is_clamped(srv):
    r = cluster_import(srv, "strong", [{"feature": 5, "strength": 150.0}, {"feature": 9, "strength": 60.0}])
    assert r.status_code == 200, r.text
    r = chat(srv, profile="strong", steering_intensity=1.6)
    assert r.headers[ECHO] == "1.6"
    assert text(r) == under(srv, {"5": 200.0, "9": 96.0})  # 240 clamped, the weaker member keeps scaling


def test_off_and_zero_turn_steering_off_without_validating_the_base(srv):
    unsteered = under(srv, {})
    for value in (0, "off"):
        r = chat(srv, profile="open", steering_intensity=value)
        assert r.headers[ECHO] == "0" and text(r) == unsteered
    # a profile invalid for the attached SAEs: 400 at 0.01, steering off at 0
    assert (
        httpx.post(srv.url + "/api/saes/attach", json={"model": MODEL, "sae": "demo:tiny:2"}, timeout=60).status_code
        == 200
    )
    r = httpx.post(
        srv.url + "/api/profiles",
        timeout=30,
        json={"name": "gone", "model": MODEL, "strengths": {"sae_demo_tiny_l2": {"3": 50}}},
    )
    assert r.status_code == 200, r.text
    assert (
        httpx.post(
            srv.url + "/api/saes/detach", json={"model": MODEL, "sae_id": "sae_demo_tiny_l2"}, timeout=30
        ).status_code
        == 200
    )
    r = chat(srv, profile="gone", steering_intensity=0.01)
    assert r.status_code == 400 and r.json()["error"]["code"] == "sae_not_attached", r.text
    r = chat(srv, profile="gone", steering_intensity=0)
    assert text(r) == unsteered


def test_without_steering_intensity_the_clusters_persistent_dial_applies(srv):
    r = dial(srv, "clusters", "open", 0.5)
    assert r.status_code == 200 and r.json()["cluster"]["intensity"] == 0.5, r.text
    assert r.json()["state"] is None  # not active: nothing live moved
    try:
        r = chat(srv, profile="open")
        assert ECHO not in r.headers  # not a dialled request
        assert text(r) == under(srv, {"5": 50.0})
        r = chat(srv, profile="open", steering_intensity=1)  # the request's λ overrides the stored one
        assert r.headers[ECHO] == "1" and text(r) == under(srv, {"5": 100.0})
    finally:
        assert dial(srv, "clusters", "open", 1.0).status_code == 200


@pytest.mark.parametrize("cluster,value", [("ranged", 1.7), ("open", 1.7), ("open", -0.1), ("open", "max")])
def test_the_persistent_dial_is_bounded_by_zero_and_the_cap(srv, cluster, value):
    r = dial(srv, "clusters", cluster, value)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parameter", r.text
    assert httpx.get(srv.url + f"/api/clusters/{cluster}", timeout=30).json()["intensity"] == 1.0


def test_dialling_down_the_persistent_dial_below_the_floor_is_honoured(srv):
    r = dial(srv, "clusters", "ranged", 0.1)
    assert r.status_code == 200 and r.json()["cluster"]["intensity"] == 0.1, r.text
    assert dial(srv, "clusters", "ranged", 1.0).status_code == 200


def test_the_base_is_the_active_cluster_when_no_profile_is_named(srv):
    r = httpx.post(srv.url + "/api/clusters/open/activate", timeout=30)
    assert r.status_code == 200 and r.json()["live"], r.text
    assert r.json()["strengths"] == {SAE_ID: {"5": 100.0}}
    assert r.json()["serving"] == {"kind": "cluster", "name": "open", "intensity": 1.0}
    r = chat(srv, steering_intensity=0.5)
    assert r.headers[ECHO] == "0.5" and text(r) == under(srv, {"5": 50.0})
    # its persistent dial, moved while it is active, re-applies the live values at once
    r = dial(srv, "clusters", "open", 0.3)
    assert r.status_code == 200 and r.json()["state"]["live"], r.text
    assert r.json()["state"]["strengths"] == {SAE_ID: {"5": 30.0}}
    assert text(chat(srv)) == under(srv, {"5": 30.0})
    assert dial(srv, "clusters", "open", 1.0).status_code == 200


def test_the_base_is_the_live_values_without_an_active_profile(srv):
    assert put(srv, {"strengths": {SAE_ID: {"9": -80}}}).json()["live"]
    r = chat(srv, steering_intensity=0.5)
    assert r.headers[ECHO] == "0.5" and text(r) == under(srv, {"9": -40.0})
    r = chat(srv, steering_intensity="min")  # no declared range: CLUSTER_INTENSITY_MIN
    assert r.headers[ECHO] == "0.5"


def test_a_named_profile_is_the_base_even_with_another_active(srv):
    assert httpx.post(srv.url + "/api/clusters/ranged/activate", timeout=30).json()["live"]
    r = chat(srv, profile="open", steering_intensity=0.5)
    assert r.headers[ECHO] == "0.5" and text(r) == under(srv, {"5": 50.0})


def test_no_echo_without_an_sae(srv):
    r = httpx.post(
        srv.url + "/v1/chat/completions", timeout=120, json={**CHAT, "model": BARE, "steering_intensity": 0.5}
    )
    assert r.status_code == 200 and ECHO not in r.headers, r.text


def test_no_echo_for_an_unknown_profile_at_zero_and_a_404_otherwise(srv):
    r = chat(srv, profile="nowhere", steering_intensity=0)
    assert r.status_code == 200 and ECHO not in r.headers, r.text
    r = chat(srv, profile="nowhere", steering_intensity=0.5)
    assert r.status_code == 404 and r.json()["error"]["code"] == "profile_not_found", r.text


def test_no_echo_for_a_dial_only_request_while_steering_is_disabled(srv):
    assert put(srv, {"strengths": {SAE_ID: {"5": 100}}, "enabled": False}).json()["live"]
    r = chat(srv, steering_intensity=1.5)
    assert ECHO not in r.headers and text(r) == under(srv, {})


def test_no_echo_for_an_empty_base(srv):
    r = chat(srv, steering_intensity=1.5)  # live values {} and nothing active
    assert ECHO not in r.headers and text(r) == under(srv, {})


@pytest.mark.parametrize("value", [2.5, -0.5, "loud", True, "1", [1]])
def test_an_invalid_steering_intensity_is_a_400(srv, value):
    r = chat(srv, steering_intensity=value)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("invalid_parameter", "steering_intensity")


@pytest.mark.parametrize(
    "doc,param",
    [
        ({"intensity_range": [1.5, 0.5]}, "intensity_range"),
        ({"intensity_range": [2.5, 3]}, "intensity_range"),
        ({"intensity": 3}, "intensity"),
        ({"members": [{"feature": 5, "strength": 250}]}, "members[0].strength"),
        ({"members": [{"feature": 99999, "strength": 10}]}, "members"),
        ({"members": []}, "members"),
        ({"sae_id": "sae_none"}, "sae_id"),
        ({"format": "other"}, "format"),
        ({"intensity_range": [0.5, 1.0], "intensity": 1.2}, "intensity"),  # the dial above its cap
    ],
)
def test_a_bad_cluster_document_is_refused(srv, doc, param):
    body = {"format": "greenroom.cluster.v1", "name": "bad", "model": MODEL, "sae_id": SAE_ID, "members": OPEN, **doc}
    r = httpx.post(srv.url + "/api/clusters/import", json=body, timeout=30)
    assert r.status_code in (400, 422) and r.json()["error"]["param"] == param, r.text
    assert httpx.get(srv.url + "/api/clusters/bad", timeout=30).status_code == 404


def test_deleting_the_active_cluster_leaves_no_base_to_dial(srv):
    unsteered = text(chat(srv))
    assert cluster_import(srv, "brief", OPEN).status_code == 200
    state = httpx.post(srv.url + "/api/clusters/brief/activate", timeout=30).json()
    assert state["active"] == {"kind": "profile", "name": "brief"}
    state = httpx.delete(srv.url + "/api/clusters/brief", timeout=30).json()["state"]
    assert (state["active"], state["serving"], state["strengths"]) == (None, None, {})  # deactivated
    r = chat(srv, steering_intensity=0.5)  # the base is the live values, now empty: no echo
    assert ECHO not in r.headers and text(r) == unsteered


def test_an_operator_write_during_a_dialled_request_wins(srv):
    with httpx.stream(
        "POST",
        srv.url + "/v1/chat/completions",
        timeout=120,
        json={
            **CHAT,
            "max_tokens": 400,
            "temperature": 1,
            "seed": 1,
            "stream": True,
            "profile": "open",
            "steering_intensity": 0.5,
        },
    ) as r:
        assert r.status_code == 200 and r.headers[ECHO] == "0.5"
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))  # generating now
        written = put(srv, {"strengths": {SAE_ID: {"9": -60}}})
        assert written.status_code == 200 and written.json()["live"], written.text
        frames = [line for line in lines if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]"
    state = httpx.get(srv.url + "/api/steering", timeout=30).json()["models"]
    mine = next(row for row in state if row["model"] == MODEL)
    assert mine["strengths"] == {SAE_ID: {"9": -60.0}} and mine["version"] == written.json()["version"]


def test_a_cluster_exports_to_the_document_import_takes(srv):
    assert (
        cluster_import(
            srv, "trip", RANGED, intensity_range=[0.5, 1.5], intensity=0.7, description="round trip"
        ).status_code
        == 200
    )
    doc = httpx.get(srv.url + "/api/clusters/trip/export", timeout=30).json()
    assert doc == {
        "format": "greenroom.cluster.v1",
        "name": "trip",
        "model": MODEL,
        "description": "round trip",
        "sae_id": SAE_ID,
        "members": RANGED,
        "intensity_range": [0.5, 1.5],
        "intensity": 0.7,
    }
    before = httpx.get(srv.url + "/api/clusters/trip", timeout=30).json()
    assert httpx.delete(srv.url + "/api/clusters/trip", timeout=30).status_code == 200
    assert httpx.post(srv.url + "/api/clusters/import", json=doc, timeout=30).status_code == 200
    after = httpx.get(srv.url + "/api/clusters/trip", timeout=30).json()
    assert {k: v for k, v in after.items() if not k.endswith("_at")} == {
        k: v for k, v in before.items() if not k.endswith("_at")
    }
