"""Strength units and SAE hook points against a live server on the demo model (the real model's
checks are in test_real_model.py): GET /api/saes and /api/saes/{sae_id} say what a strength
means (the calibrated residual norm, the decoder norms, the coefficient a strength of 1 is);
a strength given as `{"coefficient": c}` steers exactly as the equivalent percent strength, on
every route that takes strengths; malformed and unconvertible coefficients are typed 400s; SAEs on
attention and MLP out steer on transformers and are refused, naming the hook, where the engine
cannot serve them."""

from __future__ import annotations

import httpx
import pytest
from conftest import MODEL, Server
from fake_hub import server_cache

from greenroom.engines.demo.demo_model import default_cache_dir
from greenroom.engines.demo.demo_sae import ensure_demo_sae
from greenroom.engines.sae import SAE, load_sae, save_sae
from greenroom.strength_units import to_coefficient

SAE_ID = "sae_demo_tiny_l1"
COLD = "greenroom-demo-cold"  # not loaded until a test loads it
GGUF = "greenroom-demo-gguf:Q8_0"
CONFIG = f"""
npu_actors = []
[[models]]
id = "{MODEL}"
source = "demo:tiny"
sae = "demo:tiny"
[[models]]
id = "{COLD}"
source = "demo:tiny"
preload = false
[[models]]
id = "{GGUF}"
source = "demo-gguf:Q8_0"
engine = "llama.cpp"
preload = false
"""
HELLO = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    tmp = tmp_path_factory.mktemp("units")
    server = Server(tmp, server_cache(tmp, model_cache), CONFIG)
    yield server
    server.stop()


def on(srv: Server, hook: str, layer: int, tmp_path) -> str:
    """The demo SAE of `layer`'s weights saved as an SAE reading `hook` (a directory to attach)."""
    sae = load_sae(ensure_demo_sae(default_cache_dir(), "tiny", layer))
    weights = {k: getattr(sae, k) for k in ("W_enc", "W_dec", "b_enc", "b_dec")}
    out = tmp_path / hook.replace(".", "_")
    save_sae(out, SAE(weights, architecture="standard", hook_name=hook))
    return str(out)


def chat(srv: Server, model: str = MODEL) -> str:
    r = httpx.post(srv.url + "/v1/chat/completions", json={"model": model, **HELLO}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def put(srv: Server, body: dict, model: str = MODEL) -> httpx.Response:
    return httpx.put(srv.url + "/api/steering", json={"model": model, **body}, timeout=60)


def described(srv: Server, sae_id: str = SAE_ID, **params) -> dict:
    r = httpx.get(f"{srv.url}/api/saes/{sae_id}", params=params, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def coefficient(sae: dict, feature: int, strength: float) -> float:
    return to_coefficient(strength, sae["residual_norm"], sae["decoder_norms"][feature])


def test_the_sae_says_what_a_strength_means(srv):
    listed = next(m for m in httpx.get(srv.url + "/api/saes", timeout=30).json()["models"] if m["model"] == MODEL)
    (record,) = listed["saes"]
    rho = record["residual_norm"]
    assert 5 < rho < 30  # the demo's layer-1 residual (≈12), measured when the model loaded
    assert record["reads"] == "the residual stream after block 1"
    assert record["decoder_norm"] == pytest.approx({"min": 1, "median": 1, "max": 1}, abs=1e-5)  # unit rows
    assert record["coefficient_per_strength"]["median"] == pytest.approx(rho / 100, rel=1e-5)
    one = described(srv, model=MODEL)
    assert {k: v for k, v in one.items() if k not in ("model", "decoder_norms")} == record
    assert one["model"] == MODEL and len(one["decoder_norms"]) == record["width"] == 512
    assert min(one["decoder_norms"]) == record["decoder_norm"]["min"]


@pytest.mark.parametrize(
    "sae_id, params, code, param",
    [
        ("sae_nope", {}, "sae_not_attached", "sae_id"),
        (SAE_ID, {"model": COLD}, "sae_not_attached", "sae_id"),
        (SAE_ID, {"model": "no-such-model"}, "model_not_found", "model"),
    ],
)
def test_an_sae_not_attached_is_typed(srv, sae_id, params, code, param):
    r = httpx.get(f"{srv.url}/api/saes/{sae_id}", params=params, timeout=30)
    assert r.status_code in (400, 404) and r.json()["error"]["code"] == code, r.text
    assert r.json()["error"]["param"] == param


def test_a_coefficient_steers_as_its_strength_does(srv):
    """A feature whose decoder row is not unit-norm makes the conversion count: the SAE's
    decoder rows are unit, so the equivalence is checked at three strengths, both signs."""
    sae = described(srv)
    plain = chat(srv)
    try:
        for strength in (20.0, -60.0, 150.0):
            assert put(srv, {"strengths": {SAE_ID: {"5": strength}}}).json()["live"]
            percent = chat(srv)
            c = coefficient(sae, 5, strength)
            r = put(srv, {"strengths": {SAE_ID: {"5": {"coefficient": c}}}})
            assert r.status_code == 200 and r.json()["live"], r.text
            assert r.json()["strengths"][SAE_ID]["5"] == pytest.approx(strength, rel=1e-12)  # stored in percent
            assert chat(srv) == percent
        assert percent != plain  # 150 % of the residual norm changes the demo's answer
    finally:
        put(srv, {"strengths": {}})
    assert chat(srv) == plain


def test_profiles_clusters_and_circuits_take_coefficients(srv):
    sae = described(srv)
    c5, c9 = coefficient(sae, 5, 80.0), coefficient(sae, 9, -40.0)
    r = httpx.post(
        srv.url + "/api/profiles",
        json={"name": "coef", "model": MODEL, "strengths": {SAE_ID: {"5": {"coefficient": c5}}}},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["strengths"][SAE_ID]["5"] == pytest.approx(80.0), r.text
    r = httpx.put(srv.url + "/api/profiles/coef", json={"strengths": {SAE_ID: {"9": {"coefficient": c9}, "5": 12}}})
    assert r.status_code == 200 and r.json()["strengths"] == {SAE_ID: {"5": 12, "9": pytest.approx(-40.0)}}, r.text
    assert httpx.delete(srv.url + "/api/profiles/coef").status_code == 200
    r = httpx.post(
        srv.url + "/api/clusters/import",
        json={
            "format": "greenroom.cluster.v1",
            "name": "coefc",
            "model": MODEL,
            "sae_id": SAE_ID,
            "members": [{"feature": 5, "strength": {"coefficient": c5}}, {"feature": 9, "strength": -40}],
        },
    )
    assert r.status_code == 200, r.text
    assert [m["strength"] for m in r.json()["members"]] == [pytest.approx(80.0), pytest.approx(-40.0)]
    assert httpx.delete(srv.url + "/api/clusters/coefc").status_code == 200
    r = httpx.post(
        srv.url + "/api/circuits/import",
        json={
            "format": "greenroom.circuit.v1",
            "name": "coefk",
            "model": MODEL,
            "rung": 1,
            "layers": [{"layer": 1, "members": [{"feature": 5, "strength": {"coefficient": c5}}]}],
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["layers"][0]["members"] == [{"feature": 5, "strength": pytest.approx(80.0)}]
    assert httpx.delete(srv.url + "/api/circuits/coefk").status_code == 200


def _bad_bodies(sae: dict) -> list[tuple[str, str, dict, str, str]]:
    past = {"coefficient": coefficient(sae, 5, 201.0)}
    steering = ("PUT", "/api/steering")
    where = f"strengths.{SAE_ID}.5"

    def strengths(value) -> dict:
        return {"model": MODEL, "strengths": {SAE_ID: {"5": value}}}

    def cluster(strength) -> dict:
        return {
            "format": "greenroom.cluster.v1",
            "name": "c",
            "model": MODEL,
            "sae_id": SAE_ID,
            "members": [{"feature": 5, "strength": strength}],
        }

    return [
        (*steering, strengths({"coefficient": "x"}), "invalid_parameter", where),
        (*steering, strengths({"coefficient": 1, "unit": "c"}), "invalid_parameter", where),
        (*steering, strengths({"percent": 1}), "invalid_parameter", where),
        (*steering, strengths({"coefficient": None}), "invalid_parameter", where),
        (*steering, strengths("1c"), "invalid_parameter", where),
        (*steering, strengths(past), "invalid_parameter", where),
        (
            *steering,
            {"model": MODEL, "strengths": {SAE_ID: {"512": {"coefficient": 1}}}},
            "invalid_feature_index",
            f"strengths.{SAE_ID}.512",
        ),
        (
            *steering,
            {"model": MODEL, "strengths": {"sae_nope": {"5": {"coefficient": 1}}}},
            "sae_not_attached",
            "strengths.sae_nope",
        ),
        ("POST", "/api/profiles", {"name": "p", **strengths(past)}, "invalid_parameter", where),
        ("POST", "/api/clusters/import", cluster(past), "invalid_parameter", "members"),
        ("POST", "/api/clusters/import", cluster({"coefficient": 0}), "invalid_parameter", "members[0].strength"),
        (
            "POST",
            "/api/circuits/import",
            {
                "format": "greenroom.circuit.v1",
                "name": "k",
                "model": MODEL,
                "rung": 0,
                "layers": [{"layer": 3, "members": [{"feature": 5, "strength": {"coefficient": 1}}]}],
            },
            "sae_not_attached",
            "layers[0].layer",
        ),
    ]


def test_malformed_and_unconvertible_coefficients_are_typed(srv):
    before = httpx.get(srv.url + "/api/steering").json()
    for method, path, body, code, param in _bad_bodies(described(srv)):
        r = httpx.request(method, srv.url + path, json=body, timeout=30)
        assert r.status_code == 400, (path, body, r.text)
        assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (code, param), (path, r.text)
    assert httpx.get(srv.url + "/api/steering").json() == before  # nothing refused changed the state
    for kind, name in (("profiles", "p"), ("clusters", "c"), ("circuits", "k")):
        assert httpx.get(f"{srv.url}/api/{kind}/{name}").status_code == 404


def test_a_coefficient_waits_for_the_residual_norm(srv):
    """An SAE attached to a model not loaded has no residual norm yet: coefficients are refused
    (percent strengths are not); loading the model measures it."""
    r = httpx.post(srv.url + "/api/saes/attach", json={"model": COLD, "sae": "demo:tiny:2"}, timeout=60)
    assert r.status_code == 200, r.text
    try:
        (record,) = r.json()["saes"]
        assert record["residual_norm"] is None and record["coefficient_per_strength"] is None
        r = put(srv, {"strengths": {record["sae_id"]: {"7": {"coefficient": 1}}}}, COLD)
        assert r.status_code == 400 and "not measured yet" in r.json()["error"]["message"], r.text
        assert put(srv, {"strengths": {record["sae_id"]: {"7": 10}}}, COLD).status_code == 200
        assert httpx.post(srv.url + "/api/models/load", json={"model": COLD}, timeout=120).status_code == 200
        measured = described(srv, record["sae_id"], model=COLD)["residual_norm"]
        assert 5 < measured < 60
        r = put(srv, {"strengths": {record["sae_id"]: {"7": {"coefficient": measured / 10}}}}, COLD)
        assert r.status_code == 200 and r.json()["strengths"][record["sae_id"]]["7"] == pytest.approx(10.0), r.text
    finally:
        httpx.post(srv.url + "/api/saes/detach", json={"model": COLD, "sae_id": "sae_demo_tiny_l2"}, timeout=60)
        httpx.post(srv.url + "/api/models/unload", json={"model": COLD}, timeout=60)


def test_attention_and_mlp_out_steer_on_transformers(srv, tmp_path):
    """An SAE on block 2's MLP out adds its delta where the block's output gets it too (a
    Llama block adds its MLP's output to the residual last): the same coefficient steers the
    same greedy text as on blocks.2.hook_resid_post. On attention out it changes the answer,
    readouts read it, and detached the answer is as before."""
    url = srv.url + "/api/saes"
    plain = chat(srv)
    answers = {}
    for hook in ("blocks.2.hook_resid_post", "blocks.2.hook_mlp_out", "blocks.2.hook_attn_out"):
        r = httpx.post(url + "/attach", json={"model": MODEL, "sae": on(srv, hook, 2, tmp_path), "sae_id": "s"})
        assert r.status_code == 200, r.text
        try:
            sae = described(srv, "s")
            assert sae["hook_point"] == hook and sae["residual_norm"] > 0
            assert (
                sae["reads"]
                == {
                    "resid_post": "the residual stream after block 2",
                    "mlp_out": "block 2's MLP output",
                    "attn_out": "block 2's attention output",
                }[hook.split("hook_")[1]]
            )
            r = put(srv, {"strengths": {"s": {"7": {"coefficient": 1.5 * sae["residual_norm"]}}}})
            assert r.status_code == 200 and r.json()["live"], r.text
            answers[hook] = chat(srv)
            read = httpx.post(
                srv.url + "/v1/chat/completions",
                json={"model": MODEL, **HELLO, "return_sae_activations": {"sae_id": "s", "positions": "prompt"}},
                timeout=60,
            ).json()["millm"]["sae_activations"]
            assert read["layer"] == 2 and read["positions"], read
        finally:
            put(srv, {"strengths": {}})
            assert httpx.post(url + "/detach", json={"model": MODEL, "sae_id": "s"}).status_code == 200
        assert chat(srv) == plain
    assert answers["blocks.2.hook_attn_out"] != plain


def test_the_mlp_out_delta_is_the_block_outputs(srv, tmp_path):
    """The same coefficients (80 % of the MLP output's typical norm, a smaller part of the
    residual's) on block 2's MLP out and on its output steer the same greedy text."""
    url, answers, coefficients = srv.url + "/api/saes", [], None
    for hook in ("blocks.2.hook_mlp_out", "blocks.2.hook_resid_post"):
        r = httpx.post(url + "/attach", json={"model": MODEL, "sae": on(srv, hook, 2, tmp_path), "sae_id": "m"})
        assert r.status_code == 200, r.text
        try:
            if coefficients is None:
                rho = described(srv, "m")["residual_norm"]
                coefficients = {"7": {"coefficient": 0.8 * rho}, "11": {"coefficient": -0.5 * rho}}
            r = put(srv, {"strengths": {"m": coefficients}})
            assert r.status_code == 200 and r.json()["live"], r.text
            answers.append(chat(srv))
        finally:
            put(srv, {"strengths": {}})
            httpx.post(url + "/detach", json={"model": MODEL, "sae_id": "m"})
    assert answers[0] == answers[1] != chat(srv)


@pytest.mark.parametrize(
    "model, hook, says",
    [
        (GGUF, "blocks.2.hook_attn_out", "llama.cpp models steer resid_post, resid_pre hook points only"),
        (GGUF, "blocks.2.hook_mlp_out", "llama.cpp models steer resid_post, resid_pre hook points only"),
    ],
)
def test_a_hook_point_the_engine_cannot_serve_is_refused_naming_it(srv, tmp_path, model, hook, says):
    r = httpx.post(srv.url + "/api/saes/attach", json={"model": model, "sae": on(srv, hook, 2, tmp_path)}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_sae", r.text
    assert hook in r.json()["error"]["message"] and says in r.json()["error"]["message"]


def test_an_unknown_hook_is_refused_naming_it(srv, tmp_path):
    path = on(srv, "blocks.2.hook_resid_post", 2, tmp_path)
    cfg = tmp_path / "blocks_2_hook_resid_post" / "cfg.json"
    cfg.write_text(cfg.read_text().replace("blocks.2.hook_resid_post", "blocks.2.hook_z"))
    r = httpx.post(srv.url + "/api/saes/attach", json={"model": MODEL, "sae": path}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_sae", r.text
    assert "'blocks.2.hook_z' is not a hook point" in r.json()["error"]["message"]
