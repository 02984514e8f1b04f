"""Feature dashboards, labels, search and contrast (issue 33 items 2 and 3) on the demo models —
the transformers checkpoint and its F16 GGUF file, each with the demo SAE: **plumbing only** (the
demo model and its SAE are random weights; tests/live/test_dashboards_smollm2.py has the real model
and an SAE with real structure). A job in the engine's spare time, its progress and results in
SQLite; the logit effects equal W_dec · W_Uᵀ computed here, in-process, on each engine's own
weights; search by text, label and token; contrast and its saved profile; cancel; every refusal
typed; jobs, results and labels surviving a restart, a job running at the stop marked interrupted.
"""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
import torch
from conftest import MODEL, Server
from fake_hub import server_cache

from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model
from greenroom.engines.demo.demo_sae import demo_sae_dir, demo_sae_layers
from greenroom.engines.random_sae import WIDTH_PER_DIM
from greenroom.engines.sae import load_sae

from .test_gguf_steering import CONFIG, GGUF  # the demo model, and its F16 GGUF file: each with the demo SAE

SAE = "sae_demo_tiny_l1"  # 512 features at layer 1, attached to both models by CONFIG
ONE = f"""
npu_actors = []
[[models]]
id = "{MODEL}"
source = "demo:tiny"
sae = "demo:tiny"
"""
TEXTS = [
    "The river winds through the valley, past orchards and under old stone bridges.",
    "Paris is the capital of France, and the Seine runs through it.",
    "def add(a, b):\n    return a + b\n",
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    tmp = tmp_path_factory.mktemp("dashboards")
    server = Server(tmp, server_cache(tmp, model_cache), CONFIG)
    # on demand: loaded first, its steering live (its SAE attached) once the load answers
    assert call(server, "POST", "/api/models/load", {"model": GGUF}).status_code == 200
    yield server
    server.stop()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "a.txt").write_text("\n\n".join(TEXTS[:2]))
    (folder / "b.jsonl").write_text(json.dumps(TEXTS[2]) + "\n" + json.dumps({"text": TEXTS[1]}) + "\n")
    return [str(folder / "a.txt"), str(folder / "b.jsonl")]


def call(srv: Server, method: str, path: str, body=None, **params) -> httpx.Response:
    return httpx.request(method, srv.url + path, json=body, params=params or None, timeout=120)


def finished(srv: Server, job: dict, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while job["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
        job = call(srv, "GET", f"/api/saes/{job['sae_id']}/dashboards/{job['id']}").json()
    return job


def start(srv: Server, model: str, **body) -> dict:
    r = call(srv, "POST", f"/api/saes/{SAE}/dashboards", {"model": model, **body})
    assert r.status_code == 200, r.text
    return r.json()


def w_u(model: str) -> torch.Tensor:
    """The unembedding each engine computes with, read here: the checkpoint's lm_head, or the GGUF
    file's output tensor."""
    cache = default_cache_dir()
    if model == MODEL:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(ensure_demo_model(cache, "tiny")).lm_head.weight.detach().float()
    from gguf import GGUFReader, dequantize

    from greenroom.engines.demo.demo_gguf import ensure_demo_gguf

    tensors = {t.name: t for t in GGUFReader(ensure_demo_gguf(cache, "F16")).tensors}
    weight = tensors.get("output.weight") or tensors["token_embd.weight"]
    return torch.from_numpy(np.array(dequantize(weight.data, weight.tensor_type), dtype=np.float32))


@pytest.mark.parametrize("model", [MODEL, GGUF])
def test_a_job_computes_dashboards_and_the_logit_effects_are_w_dec_times_w_u(srv, corpus, model):
    job = start(srv, model, features={"start": 0, "end": 64}, corpus={"files": corpus}, context_tokens=16, logit_k=5)
    assert job["status"] in ("queued", "running") and job["features"] == list(range(64))
    job = finished(srv, job)
    assert job["status"] == "done", job
    assert job["progress"]["contexts"] >= 3 and job["progress"]["logit_features"] == 64
    sae = load_sae(demo_sae_dir(default_cache_dir(), "tiny", demo_sae_layers("tiny")[0]))
    effects = sae.W_dec[:64] @ w_u(model).reshape(-1, sae.d_in).T  # in-process: W_dec · W_Uᵀ
    active = 0
    for index in range(64):
        feature = call(srv, "GET", f"/api/saes/{SAE}/features/{index}", model=model).json()
        logits = feature["logit_effects"]
        top, bottom = effects[index].topk(5), effects[index].topk(5, largest=False)
        assert [t["id"] for t in logits["promoted"]] == top.indices.tolist()
        assert [t["id"] for t in logits["suppressed"]] == bottom.indices.tolist()
        got = torch.tensor([t["value"] for t in logits["promoted"] + logits["suppressed"]])
        assert torch.allclose(got, torch.cat([top.values, bottom.values]), atol=1e-5, rtol=0)
        assert feature["jobs"] == {"logit_effects": job["id"], "corpus": job["id"]}
        counts = feature["histogram"]["counts"]
        assert sum(counts) == round(feature["density"] * feature["tokens"])
        if feature["contexts"]:
            active += 1
            best = feature["contexts"][0]
            peak = max(t["activation"] for t in best["tokens"][1:])  # per-token values rounded to 1e-5
            assert best["max"] == pytest.approx(peak, abs=1e-5)
            assert best["tokens"][best["max_position"]]["activation"] == peak
            assert [c["max"] for c in feature["contexts"]] == sorted(
                (c["max"] for c in feature["contexts"]), reverse=True
            )
    assert active > 10


def test_search_by_text_label_and_token(srv, corpus):
    job = finished(srv, start(srv, MODEL, features={"start": 0, "end": 512}, corpus={"files": corpus}))
    assert job["status"] == "done"
    found = call(
        srv, "POST", f"/api/saes/{SAE}/features/search", {"model": MODEL, "text": "Paris is the capital", "top_k": 5}
    ).json()
    assert found["model"] == MODEL and found["tokens"][0] and len(found["features"]) == 5
    values = [f["value"] for f in found["features"]]
    assert values == sorted(values, reverse=True) and values[0] > 0
    assert all(p["position"] > 0 and p["value"] > 0 for f in found["features"] for p in f["positions"])
    best = found["features"][0]
    # the label is returned wherever the feature is: the dashboard, search by text and by label
    r = call(srv, "PUT", f"/api/saes/{SAE}/features/{best['index']}/label", {"model": MODEL, "label": "Capital cities"})
    assert r.status_code == 200 and r.json()["label"] == "Capital cities"
    again = call(srv, "POST", f"/api/saes/{SAE}/features/search", {"model": MODEL, "text": "Paris is the capital"})
    assert again.json()["features"][0] == {**best, "label": "Capital cities"}
    by_label = call(srv, "POST", f"/api/saes/{SAE}/features/search", {"model": MODEL, "label": "CAPITAL"}).json()
    assert by_label["features"] == [{"index": best["index"], "label": "Capital cities"}]
    # by token: the features whose logit effects promote it, largest first
    feature = call(srv, "GET", f"/api/saes/{SAE}/features/7", model=MODEL).json()
    token = feature["logit_effects"]["promoted"][0]
    hits = call(srv, "POST", f"/api/saes/{SAE}/features/search", {"model": MODEL, "token": token["text"]}).json()
    assert {"index": 7, "label": None, "value": token["value"]} in hits["features"]
    assert [h["value"] for h in hits["features"]] == sorted((h["value"] for h in hits["features"]), reverse=True)
    call(srv, "PUT", f"/api/saes/{SAE}/features/{best['index']}/label", {"model": MODEL, "label": ""})
    assert call(srv, "GET", f"/api/saes/{SAE}/features/{best['index']}", model=MODEL).json()["label"] is None


def test_contrast_ranks_features_and_saves_a_profile(srv):
    positive, negative = ["Paris is in France", "The French capital is lovely"], ["def f(x): return x", "import os"]
    r = call(srv, "POST", f"/api/saes/{SAE}/contrast", {"model": MODEL, "positive": positive, "negative": negative})
    assert r.status_code == 200, r.text
    ranked = r.json()["features"]
    assert len(ranked) == 5 and r.json()["measure"] is None and r.json()["profile"] is None
    assert [f["difference"] for f in ranked] == sorted((f["difference"] for f in ranked), reverse=True)
    for f in ranked:
        assert f["difference"] == pytest.approx(f["mean_positive"] - f["mean_negative"])
    body = {"model": MODEL, "positive": positive, "negative": negative, "top_k": 3, "held_out": "Tell me about"}
    saved = call(srv, "POST", f"/api/saes/{SAE}/contrast", {**body, "save_as": "contrasted"}).json()
    measure = saved["measure"]
    assert [t["strength"] for t in measure["tried"]] == [5.0, 10.0, 20.0, 40.0]
    assert measure["suggested"] in (5.0, 10.0, 20.0, 40.0)
    profile = call(srv, "GET", "/api/profiles/contrasted").json()
    assert profile == saved["profile"]
    assert profile["strengths"] == {
        SAE: {str(f["index"]): measure["suggested"] for f in saved["features"] if f["difference"] > 0}
    }
    # a label set on one of its features comes back with the profile
    first = next(iter(profile["strengths"][SAE]))
    call(srv, "PUT", f"/api/saes/{SAE}/features/{first}/label", {"model": MODEL, "label": "frenchness"})
    again = call(srv, "GET", "/api/profiles/contrasted").json()
    assert again == {**profile, "labels": {SAE: {first: "frenchness"}}}
    listed = call(srv, "GET", "/api/profiles").json()["profiles"]
    assert again in listed
    call(srv, "PUT", f"/api/saes/{SAE}/features/{first}/label", {"model": MODEL, "label": ""})
    assert call(srv, "DELETE", "/api/profiles/contrasted").status_code == 200


def test_a_job_yields_to_requests_and_can_be_cancelled(srv):
    job = start(srv, MODEL, features=[1, 2, 3], corpus={"generated_tokens": 1024}, max_tokens=10_000_000)
    time.sleep(1.0)
    # requests are served while it runs (it runs only while nothing else does)
    chat = call(
        srv,
        "POST",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8},
    )
    assert chat.status_code == 200
    running = call(srv, "GET", f"/api/saes/{SAE}/dashboards/{job['id']}").json()
    assert running["status"] == "running" and running["progress"]["logit_features"] == 3
    cancelled = call(srv, "DELETE", f"/api/saes/{SAE}/dashboards/{job['id']}").json()
    assert cancelled["status"] == "cancelled"
    time.sleep(1.5)  # past its next progress write: it has stopped
    after = call(srv, "GET", f"/api/saes/{SAE}/dashboards/{job['id']}").json()
    assert after["status"] == "cancelled" and after["progress"] == cancelled["progress"]
    listed = call(srv, "GET", f"/api/saes/{SAE}/dashboards", model=MODEL).json()["jobs"]
    assert after in listed


@pytest.mark.parametrize(
    "method, path, body, status, code, param",
    [
        ("POST", f"/api/saes/{SAE}/dashboards", {"features": [512]}, 400, "invalid_feature_index", "features"),
        (
            "POST",
            f"/api/saes/{SAE}/dashboards",
            {"features": {"start": 5, "end": 5}},
            400,
            "invalid_feature_index",
            "features",
        ),
        ("POST", f"/api/saes/{SAE}/dashboards", {"features": [-1]}, 400, "invalid_parameter", "features"),
        ("POST", f"/api/saes/{SAE}/dashboards", {"top_k": 0}, 400, "invalid_parameter", "top_k"),
        ("POST", f"/api/saes/{SAE}/dashboards", {"corpus": {"files": []}}, 400, "invalid_parameter", "corpus.files"),
        ("POST", f"/api/saes/{SAE}/dashboards", {"corpus": {"bogus": 1}}, 400, "invalid_parameter", "corpus.bogus"),
        (
            "POST",
            f"/api/saes/{SAE}/dashboards",
            {"corpus": {"files": ["/nonexistent.txt"]}},
            400,
            "invalid_parameter",
            "corpus.files",
        ),
        ("POST", f"/api/saes/{SAE}/dashboards", {"colour": 1}, 400, "invalid_parameter", "colour"),
        ("POST", "/api/saes/nope/dashboards", {}, 400, "sae_not_attached", "sae_id"),
        ("GET", f"/api/saes/{SAE}/dashboards/dash_0000000000000000", None, 404, "dashboard_job_not_found", "job_id"),
        ("DELETE", f"/api/saes/{SAE}/dashboards/dash_0000000000000000", None, 404, "dashboard_job_not_found", "job_id"),
        ("GET", f"/api/saes/{SAE}/features/512", None, 400, "invalid_feature_index", "index"),
        ("GET", f"/api/saes/{SAE}/features/x", None, 400, "invalid_feature_index", "index"),
        ("PUT", f"/api/saes/{SAE}/features/3/label", {}, 400, "missing_parameter", "label"),
        ("PUT", f"/api/saes/{SAE}/features/3/label", {"label": 5}, 400, "invalid_parameter", "label"),
        ("PUT", f"/api/saes/{SAE}/features/3/label", {"label": "x" * 201}, 400, "invalid_parameter", "label"),
        ("POST", f"/api/saes/{SAE}/features/search", {}, 400, "missing_parameter", "text"),
        ("POST", f"/api/saes/{SAE}/features/search", {"text": "a", "label": "b"}, 400, "invalid_parameter", "label"),
        ("POST", f"/api/saes/{SAE}/features/search", {"text": ""}, 400, "invalid_parameter", "text"),
        ("POST", f"/api/saes/{SAE}/contrast", {"positive": ["a"]}, 400, "missing_parameter", "negative"),
        (
            "POST",
            f"/api/saes/{SAE}/contrast",
            {"positive": [], "negative": ["b"]},
            400,
            "invalid_parameter",
            "positive",
        ),
        (
            "POST",
            f"/api/saes/{SAE}/contrast",
            {"positive": ["a"], "negative": ["b"], "save_as": "p"},
            400,
            "missing_parameter",
            "held_out",
        ),
        (
            "POST",
            f"/api/saes/{SAE}/contrast",
            {"positive": ["a"], "negative": [3]},
            400,
            "invalid_parameter",
            "negative[0]",
        ),
    ],
)
def test_bad_input_is_typed(srv, method, path, body, status, code, param):
    """Left without `model`, the SAE id names it while one model has it: the demo SAE is attached to
    both models here, so each call names the transformers one."""
    if body is not None:
        body = {"model": MODEL, **body}
    r = call(srv, method, path, body, **({} if body is not None else {"model": MODEL}))
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["param"] == param


def test_the_model_is_named_when_several_have_the_sae(srv):
    r = call(srv, "POST", f"/api/saes/{SAE}/features/search", {"text": "Hi"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_parameter"
    assert MODEL in r.json()["error"]["message"] and GGUF in r.json()["error"]["message"]


def test_jobs_results_and_labels_survive_a_restart(tmp_path, model_cache, corpus):
    cache = server_cache(tmp_path, model_cache)
    server = Server(tmp_path, cache, ONE)
    try:
        done = finished(server, start(server, MODEL, features=[3, 4], corpus={"files": corpus}))
        call(server, "PUT", f"/api/saes/{SAE}/features/3/label", {"label": "kept"})
        before = call(server, "GET", f"/api/saes/{SAE}/features/3").json()
        running = start(server, MODEL, features=[5], corpus={"generated_tokens": 1024}, max_tokens=10_000_000)
        time.sleep(1.0)
        assert call(server, "GET", f"/api/saes/{SAE}/dashboards/{running['id']}").json()["status"] == "running"
    finally:
        server.stop()
    server = Server(tmp_path, cache, ONE)
    try:
        assert call(server, "GET", f"/api/saes/{SAE}/features/3").json() == before
        assert before["label"] == "kept" and before["contexts"] is not None
        assert call(server, "GET", f"/api/saes/{SAE}/dashboards/{done['id']}").json() == done
        interrupted = call(server, "GET", f"/api/saes/{SAE}/dashboards/{running['id']}").json()
        assert interrupted["status"] == "interrupted" and "stopped" in interrupted["error"]
    finally:
        server.stop()


def test_a_readout_carries_the_labels(srv):
    call(srv, "PUT", f"/api/saes/{SAE}/features/12/label", {"model": MODEL, "label": "twelve"})
    try:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 3,
            "return_sae_activations": {"sae_id": SAE, "features": [12, 99], "positions": "prompt"},
        }
        read = call(srv, "POST", "/v1/chat/completions", body).json()["millm"]["sae_activations"]
        features = [f for p in read["positions"] for f in p["features"]]
        assert {f["index"] for f in features} == {12, 99}
        assert all(f.get("label") == ("twelve" if f["index"] == 12 else None) for f in features)
        # on the GGUF model the same SAE id is another model's: its features are not labelled
        answer = call(srv, "POST", "/v1/chat/completions", {**body, "model": GGUF})
        assert answer.status_code == 200, answer.text
        gguf = answer.json()["millm"]["sae_activations"]
        assert not any("label" in f for p in gguf["positions"] for f in p["features"])
    finally:
        call(srv, "PUT", f"/api/saes/{SAE}/features/12/label", {"model": MODEL, "label": ""})


def test_a_second_architecture_gemma3_gets_units_dashboards_and_search(tmp_path, model_cache, gemma3):
    """Gemma 3 270M (sliding-window attention, tied embeddings: its logit effects go through the
    token embeddings) with a random SAE after block 6: plumbing on a second architecture. Its
    window is 4096, not the 32k sized from memory: the test's prompts are short, and 4 × 32k
    cells of cache cost its start ~2.4 GB."""
    config = (
        f'engine_actors = ["cpu"]\nnpu_actors = []\n[[models]]\nid = "gemma"\nsource = "{gemma3}"\n'
        'engine = "llama.cpp"\nn_ctx = 4096\n'
    )
    srv = Server(tmp_path, model_cache, config)
    try:
        r = httpx.post(
            srv.url + "/api/saes/attach", json={"model": "gemma", "sae": "random:640:6", "sae_id": "g"}, timeout=120
        )
        assert r.status_code == 200, r.text
        body = {"features": [0, 1, 2, 3], "corpus": {"seeds": ["The city of Paris"], "generated_tokens": 16}}
        job = httpx.post(srv.url + "/api/saes/g/dashboards", json=body, timeout=60).json()["id"]
        deadline = time.monotonic() + 120
        while (state := httpx.get(srv.url + f"/api/saes/g/dashboards/{job}", timeout=60).json())["status"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < deadline, state
            time.sleep(0.5)
        assert state["status"] == "done", state
        feature = httpx.get(srv.url + "/api/saes/g/features/2", timeout=60).json()
        assert feature["contexts"] and len(feature["logit_effects"]["promoted"]) == 10
        found = httpx.post(srv.url + "/api/saes/g/features/search", json={"text": "Paris is lovely"}, timeout=60).json()
        assert found["features"] and found["features"][0]["positions"]
        # loaded, its residual norm is measured: a coefficient converts and steers
        described = httpx.get(srv.url + "/api/saes/g", timeout=60).json()
        assert described["residual_norm"] > 0 and len(described["decoder_norms"]) == 640 * WIDTH_PER_DIM, described
        r = httpx.put(
            srv.url + "/api/steering",
            json={"model": "gemma", "strengths": {"g": {"1": {"coefficient": 5}}}},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["strengths"]["g"]["1"] > 0, r.text
    finally:
        srv.stop()
