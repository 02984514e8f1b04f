"""SAE steering and readouts on a GGUF model (engines/llama_cpp/llama_steering.py) against a live server:
the demo model as the transformers checkpoint and as its F16 GGUF file (which answers greedy
exactly as the checkpoint: test_demo_gguf.py), each with the demo SAEs of layers 1 and 2 — so
every request is sent to both and must come back the same: live strengths, a detach and attach,
a profile, a dial, an active cluster (and its persistent dial) and circuit with their headers, `return_sae_activations` (values within 2e-3:
llama.cpp's F16 arithmetic against float32), monitoring records. Then what only llama.cpp can get
wrong: block 0 (no control vector there) refused at attach, the control vector swapped for a
request's own steering while other sequences decode beside it, a slot's cached prompt never
reused under other steering, an operator's write mid-stream winning, and embeddings and scoring
unsteered."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest
from conftest import MODEL, Server
from fake_hub import server_cache

GGUF = "greenroom-demo-gguf:F16"
BOTH = (MODEL, GGUF)
L1, L2 = "sae_demo_tiny_l1", "sae_demo_tiny_l2"
CONFIG = f"""
npu_actors = []
[[models]]
id = "{MODEL}"
source = "demo:tiny"
sae = "demo:tiny"
[[models]]
id = "{GGUF}"
source = "demo-gguf:F16"
engine = "llama.cpp"
n_ctx = 2048
sae = "demo:tiny"
"""
STRENGTHS = {L1: {"5": 120.0, "9": -60.0}, L2: {"7": 90.0}}
OTHER = {L1: {"3": -150.0}}
MESSAGES = [{"role": "user", "content": "Once upon a time, in a small village by the sea"}]
ECHO, RUNG = "X-miLLM-Steering-Intensity", "X-miLLM-Circuit-Rung"
TOLERANCE = 2e-3  # activations, llama.cpp F16 against transformers float32 (measured: ≤ 6e-4)


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    tmp = tmp_path_factory.mktemp("gguf-steering")
    server = Server(tmp, server_cache(tmp, model_cache), CONFIG)
    assert (
        post(server, "/api/models/load", {"model": GGUF}).status_code == 200
    )  # on demand: steering is live once loaded
    for model in BOTH:
        assert post(server, "/api/saes/attach", {"model": model, "sae": "demo:tiny:2"}).status_code == 200
        for doc in documents(model):
            r = post(server, f"/api/{doc.pop('kind')}", doc)
            assert r.status_code == 200, r.text
    yield server
    server.stop()


@pytest.fixture
def site(srv):
    """The server with both models unsteered and no active base."""
    for model in BOTH:
        assert put(srv, model, {"strengths": {}, "enabled": True}).json()["live"]
    return srv


def documents(model: str) -> list[dict]:
    """One profile, cluster and circuit per model, named after the model's engine."""
    tag = "g" if model == GGUF else "t"
    return [
        {"kind": "profiles", "name": f"loud-{tag}", "model": model, "strengths": STRENGTHS},
        {
            "kind": "clusters/import",
            "format": "greenroom.cluster.v1",
            "name": f"calm-{tag}",
            "model": model,
            "sae_id": L1,
            "members": [{"feature": 5, "strength": 100.0}, {"feature": 9, "strength": -40.0}],
            "intensity_range": [0.5, 1.5],
        },
        {
            "kind": "circuits/import",
            "format": "greenroom.circuit.v1",
            "name": f"edge-{tag}",
            "model": model,
            "rung": 2,
            "layers": [
                {"layer": 1, "members": [{"feature": 5, "strength": 80}]},
                {"layer": 2, "sae_id": L2, "members": [{"feature": 7, "strength": 180}]},
            ],
            "intensity_range": [0.5, 1.5],
        },
    ]


def post(srv: Server, path: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def put(srv: Server, model: str, body: dict) -> httpx.Response:
    return httpx.put(srv.url + "/api/steering", json={"model": model, **body}, timeout=60)


def chat(srv: Server, model: str, max_tokens: int = 32, **extra) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def text(r: httpx.Response) -> str:
    return r.json()["choices"][0]["message"]["content"]


def on_both(srv: Server, **extra) -> tuple[str, dict]:
    """The request's greedy text and steering headers, the same from both engines."""
    answers = []
    for model in BOTH:
        tag = "g" if model == GGUF else "t"
        named = {k: v.format(tag=tag) if isinstance(v, str) else v for k, v in extra.items()}
        r = chat(srv, model, **named)
        answers.append((text(r), {h: r.headers.get(h) for h in (ECHO, RUNG)}))
    assert answers[0] == answers[1], answers
    return answers[0]


def activations(srv: Server, model: str, **spec) -> list[dict]:
    r = chat(srv, model, max_tokens=6, return_sae_activations={"positions": "all", **spec})
    return r.json()["millm"]["sae_activations"]["positions"]


def test_block_0_cannot_be_steered_on_llama_cpp(srv):
    r = post(srv, "/api/saes/attach", {"model": GGUF, "sae": "demo:tiny:0"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("invalid_sae", "sae") and "llama.cpp cannot steer" in err["message"]
    state = httpx.get(srv.url + "/api/steering", timeout=30).json()["models"]
    saes = {row["model"]: [s["sae_id"] for s in row["saes"]] for row in state}
    assert saes[GGUF] == saes[MODEL] == [L1, L2]  # the configured default SAE, then layer 2


def test_live_strengths_steer_both_engines_alike_and_clearing_restores(site):
    plain, _ = on_both(site)
    for model in BOTH:
        assert put(site, model, {"strengths": STRENGTHS}).json()["live"]
    steered, headers = on_both(site)
    assert steered != plain and headers == {ECHO: None, RUNG: None}
    for model in BOTH:
        assert put(site, model, {"enabled": False}).json()["live"]
    assert on_both(site)[0] == plain
    for model in BOTH:
        assert put(site, model, {"enabled": True}).json()["live"]
    assert on_both(site)[0] == steered
    for model in BOTH:  # detached, layer 2's strengths go with it; attached again, it starts unsteered
        assert post(site, "/api/saes/detach", {"model": model, "sae_id": L2}).json()["live"]
    only_l1, _ = on_both(site)
    assert only_l1 not in (plain, steered)
    for model in BOTH:
        assert post(site, "/api/saes/attach", {"model": model, "sae": "demo:tiny:2"}).json()["live"]
    assert on_both(site)[0] == only_l1


@pytest.mark.parametrize("read_point", ["pre_steering", "post_steering"])
@pytest.mark.parametrize("sae_id", [L1, L2])
def test_activations_read_the_same_layer_as_transformers(site, sae_id, read_point):
    """blocks.L.hook_resid_post is llama.cpp's l_out-L: read on both engines, position by position,
    the same features to within TOLERANCE (an off-by-one would read another layer's residual)."""
    features = [5, 7, 9, 3, 100, 200, 300, 400]
    for model in BOTH:
        assert put(site, model, {"strengths": STRENGTHS}).json()["live"]
    spec = {"sae_id": sae_id, "read_point": read_point, "features": features, "top_k": len(features)}
    tf, gguf = (activations(site, model, **spec) for model in BOTH)
    assert [p["position"] for p in tf] == [p["position"] for p in gguf] and len(tf) > 20
    for a, b in zip(tf, gguf):
        assert a["token_id"] == b["token_id"]
        va, vb = ({f["index"]: f["value"] for f in p["features"]} for p in (a, b))
        assert va.keys() == vb.keys() == set(features)
        assert all(abs(va[i] - vb[i]) <= TOLERANCE * max(1.0, abs(va[i])) for i in features), (a, b)
    steered = {f["index"]: f["value"] for f in tf[-1]["features"]}
    if read_point == "post_steering" and sae_id == L1:  # the steered feature reads what was added
        assert steered[5] > 1


def test_a_profile_a_dial_a_cluster_and_a_circuit_serve_alike(site):
    assert on_both(site, profile="loud-{tag}")[0] != on_both(site)[0]
    for model in BOTH:
        assert put(site, model, {"strengths": STRENGTHS}).json()["live"]
    live = on_both(site)[0]
    assert on_both(site, steering_intensity=0.5)[1][ECHO] == "0.5"
    assert on_both(site)[0] == live  # a dialled request leaves the live state as it was
    for model in BOTH:
        tag = "g" if model == GGUF else "t"
        assert post(site, f"/api/clusters/calm-{tag}/activate").json()["live"]
    assert on_both(site, steering_intensity="max")[1][ECHO] == "1.5"
    for model in BOTH:  # the cluster's persistent dial re-applies it at once
        tag = "g" if model == GGUF else "t"
        r = httpx.put(site.url + f"/api/clusters/calm-{tag}/intensity", json={"intensity": 0.7}, timeout=30)
        assert r.status_code == 200 and r.json()["state"]["live"], r.text
    assert on_both(site)[0] == on_both(site, steering_intensity=0.7)[0]
    for model in BOTH:
        tag = "g" if model == GGUF else "t"
        assert post(site, f"/api/circuits/edge-{tag}/activate").json()["live"]
    circuit, headers = on_both(site)
    assert headers[RUNG] == '2; language="causally validated (edge)"'
    assert on_both(site, steering_intensity=0.1)[1] == {ECHO: "0.5", RUNG: headers[RUNG]}  # clamped to the floor
    assert circuit != live


def test_monitoring_records_what_transformers_records(site):
    for model in BOTH:
        assert put(site, model, {"strengths": STRENGTHS}).json()["live"]
        r = httpx.put(site.url + "/api/monitoring", json={"model": model, "enabled": True, "sae_id": L2}, timeout=30)
        assert r.status_code == 200, r.text
    since = httpx.get(site.url + "/api/monitoring/records", timeout=30).json()["next"]
    on_both(site, max_tokens=8)
    records = httpx.get(site.url + "/api/monitoring/records", params={"since": since}, timeout=30).json()["records"]
    for model in BOTH:
        assert httpx.put(site.url + "/api/monitoring", json={"model": model, "enabled": False}, timeout=30)
    tf, gguf = (next(r for r in records if r["model"] == model) for model in BOTH)
    assert (tf["positions"], tf["layer"]) == (gguf["positions"], gguf["layer"]) == (tf["positions"], 2)
    maxima = [{f["index"]: f["max"] for f in r["features"]} for r in (tf, gguf)]
    common = maxima[0].keys() & maxima[1].keys()
    assert len(common) >= len(maxima[0]) - 1  # a near tie at the top-k's edge may differ
    assert all(abs(maxima[0][i] - maxima[1][i]) <= TOLERANCE * max(1.0, maxima[0][i]) for i in common)


def test_a_requests_own_steering_decodes_beside_others_under_the_live_vector(site):
    """llama.cpp's control vector is per context: a profile's request decodes alone, its vector
    swapped in for its steps and the live one back for the other sequences' steps."""
    assert put(site, GGUF, {"strengths": OTHER}).json()["live"]
    live = text(chat(site, GGUF, max_tokens=48))
    profiled = text(chat(site, GGUF, max_tokens=48, profile="loud-g"))
    assert live != profiled
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [
            pool.submit(lambda p: text(chat(site, GGUF, max_tokens=48, **p)), {"profile": "loud-g"} if i % 3 else {})
            for i in range(6)
        ]
        answers = [f.result() for f in futures]
    assert answers == [live, profiled, profiled] * 2
    # the same prompt under the live vector again: the slots' cached prompts were prefilled under
    # the profile's vector, so none is reused, and the answer is the live one
    assert text(chat(site, GGUF, max_tokens=48)) == live


def test_a_steering_write_mid_stream_wins(site):
    body = {
        "model": GGUF,
        "messages": MESSAGES,
        "max_tokens": 400,
        "temperature": 1,
        "seed": 1,
        "stream": True,
        "profile": "loud-g",
    }
    with httpx.stream("POST", site.url + "/v1/chat/completions", timeout=120, json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))  # generating now
        written = put(site, GGUF, {"strengths": OTHER})
        assert written.status_code == 200 and written.json()["live"], written.text
        frames = [line for line in lines if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]" and all("error" not in json.loads(f[6:]) for f in frames[:-1])
    state = next(m for m in httpx.get(site.url + "/api/steering", timeout=30).json()["models"] if m["model"] == GGUF)
    assert state["strengths"] == OTHER and state["live"]


def test_embeddings_and_scoring_are_never_steered(site):
    def embedding() -> list[float]:
        return post(site, "/v1/embeddings", {"model": GGUF, "input": "the sea"}).json()["data"][0]["embedding"]

    def scored() -> tuple[dict, list]:
        """A scoring request's log-probabilities and what its return_sae_activations read."""
        read = {"sae_id": L1, "positions": "all", "top_k": 4}
        body = {"model": GGUF, "prompt": "the sea is", "max_tokens": 1, "logprobs": 3, "return_sae_activations": read}
        r = post(site, "/v1/completions", body)
        assert r.status_code == 200 and r.headers["X-miLLM-Steering"] == "none", r.text
        millm = r.json()["millm"]["sae_activations"]
        assert millm["read_point"] == "unsteered" and millm["positions"][0]["features"]
        return r.json()["choices"][0]["logprobs"], millm["positions"]

    plain = (embedding(), scored())
    assert put(site, GGUF, {"strengths": STRENGTHS}).json()["live"]
    assert text(chat(site, GGUF, max_tokens=8)) != text(chat(site, GGUF, max_tokens=8, steering_intensity=0))
    assert (embedding(), scored()) == plain  # bit for bit: the scoring and embedding contexts hold no vector
