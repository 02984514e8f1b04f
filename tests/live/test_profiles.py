"""Steering profiles (http/manage/steering_api.py, the steering coordinator's profile ops) against a
live server with a cache of its own: create, read, update, delete; activation, which steers
greedy output exactly as the same strengths set through PUT /api/steering; export → delete →
import; the typed refusals; profiles surviving a server restart."""

from __future__ import annotations

import types

import httpx
import pytest
from conftest import MODEL, Server
from fake_hub import server_cache

from .test_steering_api import CONFIG, SAE_ID, UNSTEERABLE, greedy, put, steering

U = "/api/profiles"
STRENGTHS = {SAE_ID: {"5": 150.0}}


@pytest.fixture(scope="module")
def site(tmp_path_factory, model_cache):
    """The server, and the cache it keeps its profiles in, for a restart onto the same cache."""
    tmp = tmp_path_factory.mktemp("profiles")
    site = types.SimpleNamespace(tmp=tmp, cache=server_cache(tmp, model_cache))
    site.server = Server(tmp, site.cache, CONFIG)
    yield site
    site.server.stop()


def call(site, method: str, path: str, body: dict | None = None) -> httpx.Response:
    return httpx.request(method, site.server.url + U + path, json=body, timeout=30)


def test_create_read_update_delete(site):
    r = call(site, "POST", "", {"name": "crud", "model": MODEL, "description": "loud", "strengths": STRENGTHS})
    assert r.status_code == 200, r.text
    made = r.json()
    assert (made["name"], made["model"], made["description"], made["strengths"]) == ("crud", MODEL, "loud", STRENGTHS)
    (sae,) = made["saes"]
    assert (sae["sae_id"], sae["width"], sae["layer"], sae["hook_point"]) == (
        SAE_ID,
        512,
        1,
        "blocks.1.hook_resid_post",
    )
    assert call(site, "GET", "/crud").json() == made
    assert made in call(site, "GET", "").json()["profiles"]
    again = call(site, "POST", "", {"name": "crud", "model": MODEL})
    assert again.status_code == 409 and again.json()["error"]["code"] == "profile_exists", again.text
    r = call(site, "PUT", "/crud", {"strengths": {SAE_ID: {"9": -20, "5": 0}}})
    assert r.status_code == 200, r.text
    assert r.json()["strengths"] == {SAE_ID: {"9": -20.0}} and r.json()["description"] == "loud"  # zeros dropped
    r = call(site, "PUT", "/crud", {"description": "quiet"})
    assert r.json()["strengths"] == {SAE_ID: {"9": -20.0}} and r.json()["description"] == "quiet"
    assert call(site, "DELETE", "/crud").json() == {"name": "crud", "deleted": True, "state": None}
    for method in ("GET", "DELETE", "PUT"):
        r = call(site, method, "/crud", {} if method == "PUT" else None)
        assert r.status_code == 404 and r.json()["error"]["code"] == "profile_not_found", (method, r.text)
    assert call(site, "POST", "/crud/activate").json()["error"]["code"] == "profile_not_found"


def test_activate_steers_as_the_same_strengths_set_directly(site):
    srv = site.server
    assert put(srv, {"strengths": {}}).json()["live"]
    unsteered = greedy(srv)
    assert put(srv, {"strengths": STRENGTHS}).json()["live"]
    steered = greedy(srv)
    assert steered != unsteered
    assert put(srv, {"strengths": {}}).json()["live"] and greedy(srv) == unsteered
    assert call(site, "POST", "", {"name": "loud", "model": MODEL, "strengths": STRENGTHS}).status_code == 200
    before = steering(srv)["version"]
    r = call(site, "POST", "/loud/activate")
    assert r.status_code == 200, r.text
    state = r.json()
    assert state["live"] and state["version"] == before + 1 and state["strengths"] == STRENGTHS
    assert state["model"] == MODEL and steering(srv)["strengths"] == STRENGTHS
    assert greedy(srv) == steered
    assert put(srv, {"strengths": {}}).json()["live"] and greedy(srv) == unsteered


def test_export_delete_import_round_trip(site):
    made = call(
        site,
        "POST",
        "",
        {"name": "trip", "model": MODEL, "description": "there and back", "strengths": {SAE_ID: {"3": 40, "11": -7.5}}},
    ).json()
    document = call(site, "GET", "/trip/export").json()
    assert document["format"] == "greenroom.steering_profile.v1"
    assert document["profile"] == {
        "name": "trip",
        "model": MODEL,
        "description": "there and back",
        "strengths": made["strengths"],
    }
    assert document["saes"] == made["saes"] and document["saes"][0]["sae_id"] == SAE_ID
    assert call(site, "DELETE", "/trip").status_code == 200
    r = call(site, "POST", "/import", document)
    assert r.status_code == 200, r.text
    back = call(site, "GET", "/trip").json()
    assert {k: back[k] for k in ("name", "model", "description", "strengths", "saes")} == {
        k: made[k] for k in ("name", "model", "description", "strengths", "saes")
    }
    again = call(site, "POST", "/import", document)
    assert again.status_code == 409 and again.json()["error"]["code"] == "profile_exists"


def _document(strengths: dict, **changes):
    """An import document for the SAE attached (its identity read from the server), with `changes`
    to that identity or (format, saes) to the document."""
    fields = {k: v for k, v in changes.items() if k in ("format", "saes")}
    sae_changes = {k: v for k, v in changes.items() if k not in fields}

    def document(sae: dict) -> dict:
        identity = {k: sae[k] for k in ("sae_id", "source", "layer", "hook_point", "width", "d_in", "architecture")}
        return {
            "format": "greenroom.steering_profile.v1",
            "saes": [{**identity, **sae_changes}],
            "profile": {"name": "p", "model": MODEL, "strengths": strengths},
            **fields,
        }

    return document


@pytest.mark.parametrize(
    "path,body,status,code,param",
    [
        (
            "",
            {"name": "p", "model": MODEL, "strengths": {SAE_ID: {"5": 201}}},
            400,
            "invalid_parameter",
            f"strengths.{SAE_ID}.5",
        ),
        (
            "",
            {"name": "p", "model": MODEL, "strengths": {SAE_ID: {"512": 1}}},
            400,
            "invalid_feature_index",
            f"strengths.{SAE_ID}.512",
        ),
        (
            "",
            {"name": "p", "model": MODEL, "strengths": {SAE_ID: {"x": 1}}},
            400,
            "invalid_feature_index",
            f"strengths.{SAE_ID}.x",
        ),
        (
            "",
            {"name": "p", "model": MODEL, "strengths": {"sae_nope": {"5": 1}}},
            400,
            "sae_not_attached",
            "strengths.sae_nope",
        ),
        ("", {"name": "no spaces", "model": MODEL}, 400, "invalid_parameter", "name"),
        ("", {"model": MODEL}, 400, "missing_parameter", "name"),
        ("", {"name": "p", "model": MODEL, "enabled": True}, 400, "invalid_parameter", "enabled"),
        ("", {"name": "p", "model": UNSTEERABLE}, 400, "steering_unsupported", "model"),
        ("", {"name": "p", "model": "nope"}, 404, "model_not_found", "model"),
        ("/import", _document({"sae_other": {"5": 1}}, sae_id="sae_other"), 400, "sae_not_attached", "saes[0]"),
        ("/import", _document({SAE_ID: {"5": 1}}, width=1024), 400, "sae_not_attached", "saes[0]"),
        ("/import", _document({SAE_ID: {"600": 1}}), 400, "invalid_feature_index", f"strengths.{SAE_ID}.600"),
        ("/import", _document({}, format="other"), 400, "invalid_parameter", "format"),
        ("/import", _document({}, saes=[{"sae_id": SAE_ID}]), 400, "invalid_parameter", "saes"),
        ("/import", _document({SAE_ID: {"5": 1}}, saes=[]), 400, "invalid_parameter", f"strengths.{SAE_ID}"),
    ],
)
def test_refusals_are_typed(site, path, body, status, code, param):
    before = call(site, "GET", "").json()
    if callable(body):
        body = body(next(sae for sae in steering(site.server)["saes"] if sae["sae_id"] == SAE_ID))
    r = call(site, "POST", path, body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["param"] == param
    assert call(site, "GET", "").json() == before  # nothing was made


def test_activating_a_profile_whose_sae_was_detached_is_refused(site):
    srv = site.server
    r = httpx.post(srv.url + "/api/saes/attach", json={"model": MODEL, "sae": "demo:tiny:2"}, timeout=60)
    assert r.status_code == 200, r.text
    assert call(site, "POST", "", {"name": "l2", "model": MODEL, "strengths": {"sae_demo_tiny_l2": {"1": 9}}}).json()
    assert (
        httpx.post(
            srv.url + "/api/saes/detach", json={"model": MODEL, "sae_id": "sae_demo_tiny_l2"}, timeout=30
        ).status_code
        == 200
    )
    before = steering(srv)["version"]
    r = call(site, "POST", "/l2/activate")
    assert r.status_code == 400 and r.json()["error"]["code"] == "sae_not_attached", r.text
    assert steering(srv)["version"] == before
    assert call(site, "DELETE", "/l2").status_code == 200


def test_profiles_survive_a_restart(site):
    r = call(site, "POST", "", {"name": "kept", "model": MODEL, "description": "d", "strengths": STRENGTHS})
    assert r.status_code == 200, r.text
    listed = call(site, "GET", "").json()
    site.server.stop()
    site.server = Server(site.tmp, site.cache, CONFIG)
    assert call(site, "GET", "").json() == listed
    r = call(site, "POST", "/kept/activate")
    assert r.status_code == 200 and r.json()["strengths"] == STRENGTHS, r.text
