"""SAE monitoring (issue 5 item 8): the engine's Monitor in-process (pre-steering maxima, nothing
read under suppression), then the front end against one live server with continuous batching on
(monitored requests fall back to the serial path): records from chat, text completions and
Ollama, per choice; pre-steering under strong steering, checked against return_sae_activations;
the live stream; scoring and embeddings record nothing; monitoring off records nothing; users'
feature labels on the records, the stream and scoring readouts (issue 33); each refusal typed;
the configuration surviving a restart."""

from __future__ import annotations

import json

import attrs
import httpx
import pytest
import torch
from conftest import MODEL, Server
from fake_hub import server_cache

from greenroom.engines.base import SamplingParams
from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model
from greenroom.engines.demo.demo_sae import demo_sae_dir, demo_sae_layers
from greenroom.engines.sae import load_sae
from greenroom.engines.steering import SteeringState
from greenroom.engines.transformers.transformers_engine import TransformersEngine

from .test_steering_api import CONFIG as STEERING_CONFIG
from .test_steering_api import UNSTEERABLE

SAE_ID = "sae_demo_tiny_l1"  # the default config's SAE: layer 1, 512 features
CONFIG = "continuous_batching = true\n" + STEERING_CONFIG  # the steering tests' models, batching on
CHAT = [{"role": "user", "content": "Tell me about the river and the old stone bridges"}]


# --- the engine, in-process -----------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(model_cache):
    engine = TransformersEngine(MODEL, ensure_demo_model(default_cache_dir(), "tiny"))
    engine.steering.attach("sae", load_sae(demo_sae_dir(default_cache_dir(), "tiny", demo_sae_layers("tiny")[0])))
    return engine


def _run(engine, ids, **observers) -> list[int]:
    fed = list(ids)
    for token, *_ in engine.generate_ids(ids, SamplingParams(max_tokens=6, temperature=0), **observers):
        fed.append(token)
        if len(fed) == len(ids) + 6:
            break
    return fed


def _maxima(entries: list[dict]) -> dict[int, float]:
    """Each feature's largest value over the positions read (a response's JSON, or the engine's
    readout as that JSON)."""
    out: dict[int, float] = {}
    for entry in entries:
        for f in entry["features"]:
            out[f["index"]] = max(out.get(f["index"], 0.0), f["value"])
    return out


def test_engine_monitor_reads_before_steering_and_nothing_under_suppression(engine):
    steering = engine.steering
    ids = engine.tokenize("Once upon a time, in a small village by the sea")
    monitor = steering.monitor("sae", top_k=8)
    _run(engine, ids, monitor=monitor)
    top = monitor.result().features[0].index
    steering.apply(SteeringState(steering.state.version + 1, True, {"sae": {top: 200.0}}))
    try:
        monitor, pre = (
            steering.monitor("sae", top_k=8),
            steering.readout(len(ids), positions="all", top_k=16, read_point="pre_steering"),
        )
        fed = _run(engine, ids, readout=pre, monitor=monitor)
        post = steering.readout(len(ids), positions="all", features=[top], read_point="post_steering")
        _run(engine, ids, readout=post)
    finally:
        steering.apply(SteeringState(steering.state.version + 1, True, {}))
    record = monitor.result()
    assert (record.sae_id, record.layer, record.positions) == ("sae", 1, len(fed) - 1)
    assert 0 < len(record.features) <= 8
    read = _maxima(attrs.asdict(pre.result(fed))["positions"])
    for f in record.features:  # the monitor's max is the pre-steering readout's, feature by feature
        assert f.max == pytest.approx(read[f.index], rel=1e-5)
        assert 0 < f.mean <= f.max
    monitored = {f.index: f.max for f in record.features}.get(top, 0.0)
    assert (
        _maxima(attrs.asdict(post.result(fed))["positions"])[top] > monitored + 10
    )  # after steering it jumps; the monitor never saw that
    assert steering.monitor("gone", top_k=8) is None  # an SAE not attached: no monitor, no error

    monitor = steering.monitor("sae", top_k=8)
    with steering.reading(None, monitor):  # scoring and embeddings run suppressed: nothing is read
        engine.score(ids, 1.0, None, 1)
        engine.embed([ids])
        with torch.inference_mode():
            engine.model(input_ids=torch.tensor([ids]), logits_to_keep=1)  # a plain forward here is read
    assert monitor.result().positions == len(ids)


# --- the server ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache(tmp_path_factory, model_cache):
    return server_cache(tmp_path_factory.mktemp("monitoring-cache"), model_cache)


@pytest.fixture(scope="module")
def srv(tmp_path_factory, cache):
    server = Server(tmp_path_factory.mktemp("monitoring"), cache, CONFIG)
    yield server
    server.stop()


def put(srv: Server, body: dict) -> httpx.Response:
    return httpx.put(srv.url + "/api/monitoring", json={"model": MODEL, **body}, timeout=30)


def records(srv: Server, since: int, **params) -> tuple[list[dict], int]:
    r = httpx.get(srv.url + "/api/monitoring/records", params={"since": since, **params}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["records"], r.json()["next"]


def chat(srv: Server, **body) -> dict:
    r = httpx.post(
        srv.url + "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 6, **body}, timeout=60
    )
    assert r.status_code == 200, r.text
    return r.json()


def readout_maxima(body: dict) -> dict[int, float]:
    return _maxima(body["millm"]["sae_activations"]["positions"])


def test_records_are_pre_steering_per_choice_from_every_generation_route(srv):
    r = put(srv, {"enabled": True})  # sae_id left out: the one attached
    assert r.status_code == 200, r.text
    assert r.json() == {"model": MODEL, "enabled": True, "sae_id": SAE_ID, "top_k": 8}
    assert httpx.get(srv.url + "/api/monitoring", timeout=30).json() == {"models": [r.json()]}  # OpenVINO not listed
    _, since = records(srv, 0)

    body = chat(srv)  # the fixed sampling: batchable, but monitored, so served serially
    (record,), since = records(srv, since)
    assert (record["model"], record["request_id"], record["endpoint"], record["choice"]) == (
        MODEL,
        body["id"],
        "/v1/chat/completions",
        0,
    )
    assert (record["sae_id"], record["layer"]) == (SAE_ID, 1)
    usage = body["usage"]
    assert record["positions"] == usage["prompt_tokens"] + usage["completion_tokens"] - 1  # the last never fed
    assert 0 < len(record["features"]) <= 8 and record["id"] == since

    # strong steering on the top feature: the monitor reads before it, as a pre_steering readout does
    top = record["features"][0]["index"]
    set_steering(srv, {SAE_ID: {str(top): 200}})
    try:
        read = {"sae_id": SAE_ID, "positions": "all", "top_k": 16}
        pre = chat(srv, temperature=0, return_sae_activations={**read, "read_point": "pre_steering"})
        (record,), since = records(srv, since)
        post = chat(
            srv, temperature=0, return_sae_activations={**read, "features": [top], "read_point": "post_steering"}
        )
        _, since = records(srv, since)
    finally:
        set_steering(srv, {})
    maxima = readout_maxima(pre)
    for f in record["features"]:
        assert f["max"] == pytest.approx(maxima[f["index"]], rel=1e-4)
    monitored = {f["index"]: f["max"] for f in record["features"]}.get(top, 0.0)
    assert readout_maxima(post)[top] > monitored + 10

    # n = 2: one record per choice; text completions and Ollama's routes too
    chat(srv, n=2)
    got, since = records(srv, since)
    assert [r["choice"] for r in got] == [0, 1]
    r = httpx.post(
        srv.url + "/v1/completions", json={"model": MODEL, "prompt": "Once upon", "max_tokens": 3}, timeout=60
    )
    assert r.status_code == 200, r.text
    for path, body in (("/api/generate", {"prompt": "Once upon"}), ("/api/chat", {"messages": CHAT})):
        r = httpx.post(
            srv.url + path, json={"model": MODEL, "stream": False, "options": {"num_predict": 3}, **body}, timeout=60
        )
        assert r.status_code == 200, r.text
    got, since = records(srv, since)
    assert [r["endpoint"] for r in got] == ["/v1/completions", "/api/generate", "/api/chat"]
    assert records(srv, 0, model=MODEL, limit=2)[0] == records(srv, 0)[0][:2]


def set_steering(srv: Server, strengths: dict) -> None:
    r = httpx.put(srv.url + "/api/steering", json={"model": MODEL, "strengths": strengths}, timeout=30)
    assert r.status_code == 200 and r.json()["live"], r.text


def test_stream_scoring_embeddings_and_monitoring_off(srv):
    assert put(srv, {"enabled": True, "top_k": 3}).status_code == 200
    _, since = records(srv, 0)
    with httpx.stream("GET", srv.url + "/api/monitoring/stream", params={"model": MODEL}, timeout=60) as stream:
        lines = stream.iter_lines()
        assert next(lines) == ": monitoring"  # subscribed from here on
        for path, body in (
            ("/v1/completions", {"prompt": "Once upon", "max_tokens": 1, "logprobs": 2}),
            ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "logprobs": True}),
            ("/v1/embeddings", {"input": "Once upon"}),
            ("/api/embed", {"input": "Once upon"}),
        ):
            r = httpx.post(srv.url + path, json={"model": MODEL, **body}, timeout=60)
            assert r.status_code == 200, (path, r.text)
        assert records(srv, since)[0] == []  # scoring and embeddings record nothing
        r = httpx.post(
            srv.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": CHAT, "max_tokens": 4, "stream": True},
            timeout=60,
        )
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"), r.text  # streamed: recorded too
        data = next(line for line in lines if line.startswith("data: "))
    record = json.loads(data.removeprefix("data: "))
    assert record["id"] == since + 1 and record["endpoint"] == "/v1/chat/completions"
    assert 0 < len(record["features"]) <= 3
    assert records(srv, since)[0] == [record]

    assert put(srv, {"enabled": False}).json() == {"model": MODEL, "enabled": False, "sae_id": SAE_ID, "top_k": 3}
    chat(srv)
    assert records(srv, record["id"])[0] == []


def label(srv: Server, index: int, text: str) -> None:
    r = httpx.put(
        srv.url + f"/api/saes/{SAE_ID}/features/{index}/label", json={"model": MODEL, "label": text}, timeout=30
    )
    assert r.status_code == 200, r.text


def test_records_the_stream_and_scoring_readouts_carry_labels(srv):
    """Issue 33: a label set on a feature comes back on it in the records (as read now, an older
    record too), on the stream and in a scoring request's readout; a feature without one has no
    `label` key, so an unlabelled record reads as before."""
    assert put(srv, {"enabled": True, "top_k": 8}).status_code == 200
    _, since = records(srv, 0)
    chat(srv, temperature=0)
    (bare,), since = records(srv, since)
    assert len(bare["features"]) > 1 and not any("label" in f for f in bare["features"])
    top, other = bare["features"][0]["index"], bare["features"][1]["index"]

    def labelled(features: list[dict]) -> bool:
        return all(f.get("label") == ("rivers" if f["index"] == top else None) for f in features)

    label(srv, top, "rivers")
    try:
        (again,), _ = records(srv, bare["id"] - 1, limit=1)
        assert again == {
            **bare,
            "features": [{**f, "label": "rivers"} if f["index"] == top else f for f in bare["features"]],
        }
        with httpx.stream("GET", srv.url + "/api/monitoring/stream", params={"model": MODEL}, timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(lines) == ": monitoring"
            chat(srv, temperature=0)  # greedy, the same prompt: the same features
            data = next(line for line in lines if line.startswith("data: "))
        streamed = json.loads(data.removeprefix("data: "))
        assert top in {f["index"] for f in streamed["features"]} and labelled(streamed["features"])
        assert records(srv, since)[0] == [streamed]

        read = {"sae_id": SAE_ID, "features": [top, other], "positions": "all"}
        r = httpx.post(
            srv.url + "/v1/completions",
            json={
                "model": MODEL,
                "prompt": "Once upon",
                "max_tokens": 1,
                "logprobs": 2,
                "return_sae_activations": read,
            },
            timeout=60,
        )
        assert r.status_code == 200, r.text
        scored = r.json()["millm"]["sae_activations"]
        features = [f for p in scored["positions"] for f in p["features"]]
        assert scored["read_point"] == "unsteered" and {f["index"] for f in features} == {top, other}
        assert labelled(features)
    finally:
        label(srv, top, "")
        put(srv, {"enabled": False})
    assert records(srv, bare["id"] - 1, limit=1)[0] == [bare]  # the label removed: as before


@pytest.mark.parametrize(
    "body,status,code,param",
    [
        ({"model": "nope", "enabled": True}, 404, "model_not_found", "model"),
        ({"model": UNSTEERABLE, "enabled": True}, 400, "steering_unsupported", "model"),
        ({"enabled": "yes"}, 400, "invalid_parameter", "enabled"),
        ({}, 400, "missing_parameter", "enabled"),
        ({"enabled": True, "top_k": 0}, 400, "invalid_parameter", "top_k"),
        ({"enabled": True, "top_k": 65}, 400, "invalid_parameter", "top_k"),
        ({"enabled": True, "top_k": True}, 400, "invalid_parameter", "top_k"),
        ({"enabled": True, "sae_id": "sae_elsewhere"}, 400, "sae_not_attached", "sae_id"),
        ({"enabled": True, "sae_id": 3}, 400, "invalid_parameter", "sae_id"),
        ({"enabled": True, "colour": "red"}, 400, "invalid_parameter", "colour"),
    ],
)
def test_put_refusals_are_typed(srv, body, status, code, param):
    r = httpx.put(srv.url + "/api/monitoring", json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]  # OpenAI's envelope, not Ollama's flat one
    assert (error["code"], error["param"]) == (code, param), error


@pytest.mark.parametrize(
    "path,params,status,code,param",
    [
        ("/api/monitoring/records", {"since": "-1"}, 400, "invalid_parameter", "since"),
        ("/api/monitoring/records", {"limit": "0"}, 400, "invalid_parameter", "limit"),
        ("/api/monitoring/records", {"limit": "1001"}, 400, "invalid_parameter", "limit"),
        ("/api/monitoring/records", {"model": "nope"}, 404, "model_not_found", "model"),
        ("/api/monitoring/stream", {"model": "nope"}, 404, "model_not_found", "model"),
    ],
)
def test_read_refusals_are_typed(srv, path, params, status, code, param):
    r = httpx.get(srv.url + path, params=params, timeout=30)
    assert r.status_code == status, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (code, param)


def test_several_saes_need_a_name_and_the_config_survives_a_restart(srv, cache, tmp_path):
    r = httpx.post(srv.url + "/api/saes/attach", json={"model": MODEL, "sae": "demo:tiny:2"}, timeout=60)
    assert r.status_code == 200, r.text
    second = next(s["sae_id"] for s in r.json()["saes"] if s["sae_id"] != SAE_ID)
    r = put(srv, {"enabled": True})
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_parameter", r.text
    assert SAE_ID in r.json()["error"]["message"] and second in r.json()["error"]["message"]
    assert put(srv, {"enabled": True, "sae_id": second, "top_k": 5}).status_code == 200
    srv.stop()
    again = Server(tmp_path, cache, CONFIG)
    try:
        config = {"model": MODEL, "enabled": True, "sae_id": second, "top_k": 5}
        assert httpx.get(again.url + "/api/monitoring", timeout=30).json() == {"models": [config]}
        chat(again)
        (record,), _ = records(again, 0)  # numbering starts again with the server
        assert (record["id"], record["sae_id"], record["layer"]) == (1, second, 2)
        assert len(record["features"]) <= 5
    finally:
        again.stop()
