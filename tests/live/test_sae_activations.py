"""return_sae_activations on /v1/chat/completions and /v1/completions against the session
server (the demo model with the demo SAE attached by the default config): the millm object,
streamed and not, every positions mode, pre vs post steering, each refusal, OpenVINO refused
before any load, scoring's X-miLLM-Steering: none and its unsteered readout. Tests that change steering restore it."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from conftest import MODEL, Server
from fake_hub import server_cache

SAE_ID = "sae_demo_tiny_l1"  # attached by the default config: layer 1, 512 features
NPU = "greenroom-demo-npu"  # OpenVINO: no SAE hooks (GGUF reads them: test_gguf_steering.py)
PROMPT = [1, 20, 30, 40, 50, 60]  # token ids: the prompt's positions are known


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=60)


def completion(server, read: dict, **body) -> dict:
    r = post(
        server,
        "/v1/completions",
        {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "return_sae_activations": read, **body},
    )
    assert r.status_code == 200, r.text
    return r.json()


def refused(r: httpx.Response, code: str, param: str) -> dict:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    return error


def steering(server) -> dict:
    rows = httpx.get(server.url + "/api/steering", timeout=30).json()["models"]
    return next(row for row in rows if row["model"] == MODEL)


def test_chat_answer_carries_the_millm_object(server):
    r = post(
        server,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 4,
            "temperature": 0,
            "return_sae_activations": {"sae_id": SAE_ID, "features": [12, 99], "top_k": 8, "positions": "completion"},
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    read = body["millm"]["sae_activations"]
    assert (read["sae_id"], read["layer"], read["read_point"]) == (SAE_ID, 1, "post_steering")
    assert "not an unsteered counterfactual" in read["note"]
    prompt, generated = body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]
    # the last sampled token is never fed back: it has no activation
    assert [p["position"] for p in read["positions"]] == list(range(prompt, prompt + generated - 1))
    for p in read["positions"]:  # a feature list: both listed at every position, zeros included
        assert sorted(f["index"] for f in p["features"]) == [12, 99]
        assert all(f["value"] >= 0 for f in p["features"])


def test_no_millm_key_without_the_field(server):
    r = post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2})
    assert r.status_code == 200 and "millm" not in r.json()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_streamed_activations_come_in_one_last_chunk_before_done(server, path):
    body = {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": PROMPT}
    with httpx.stream(
        "POST",
        server.url + path,
        timeout=60,
        json={
            "model": MODEL,
            **body,
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_sae_activations": {"positions": "all", "top_k": 3},
        },
    ) as r:
        assert r.status_code == 200
        data = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    last = chunks[-1]
    assert last["choices"] == [] and set(last["millm"]) == {"sae_activations"}
    assert [c for c in chunks if "millm" in c] == [last]
    usage = chunks[-2]["usage"]  # the usage-only chunk comes before it
    read = last["millm"]["sae_activations"]
    assert read["sae_id"] == SAE_ID
    fed = usage["prompt_tokens"] + usage["completion_tokens"] - 1
    assert [p["position"] for p in read["positions"]] == list(range(fed))
    assert all(len(p["features"]) <= 3 for p in read["positions"])


@pytest.mark.parametrize(
    "positions,expected",
    [
        ("last", lambda fed: [fed - 1]),
        ("prompt", lambda fed: list(range(len(PROMPT)))),
        ("completion", lambda fed: list(range(len(PROMPT), fed))),
        ("all", lambda fed: list(range(fed))),
        ({"start": 2, "end": 8}, lambda fed: list(range(2, min(8, fed)))),
    ],
)
def test_positions(server, positions, expected):
    body = completion(server, {"positions": positions, "top_k": 4})
    fed = len(PROMPT) + body["usage"]["completion_tokens"] - 1
    read = body["millm"]["sae_activations"]["positions"]
    assert [p["position"] for p in read] == expected(fed)
    for p in read:
        if p["position"] < len(PROMPT):
            assert p["token_id"] == PROMPT[p["position"]]
        values = [f["value"] for f in p["features"]]
        assert len(values) <= 4 and values == sorted(values, reverse=True)
        assert all(v > 0 for v in values)  # without a feature list, only active features


def test_pre_and_post_steering_differ_only_while_steering(server):
    def read(point: str) -> list:
        body = completion(server, {"features": [5], "positions": "prompt", "read_point": point})
        assert body["millm"]["sae_activations"]["read_point"] == point
        return [p["features"][0]["value"] for p in body["millm"]["sae_activations"]["positions"]]

    assert read("pre_steering") == read("post_steering")
    unsteered_text = completion(server, {"features": [5]})["choices"][0]["text"]
    before = steering(server)
    try:
        r = httpx.put(
            server.url + "/api/steering",
            timeout=30,
            json={"model": MODEL, "enabled": True, "strengths": {SAE_ID: {"5": 150}}},
        )
        assert r.status_code == 200 and r.json()["live"], r.text
        pre, post_ = read("pre_steering"), read("post_steering")
        assert all(b > a for a, b in zip(pre, post_))  # this layer's delta raises feature 5
        body = completion(server, {"features": [5], "read_point": "pre_steering"})
        assert "removes only this layer's own" in body["millm"]["sae_activations"]["note"]
        assert body["choices"][0]["text"] != unsteered_text  # and the logits moved: greedy output changed
    finally:
        r = httpx.put(
            server.url + "/api/steering",
            timeout=30,
            json={"model": MODEL, "enabled": before["enabled"], "strengths": before["strengths"]},
        )
        assert r.status_code == 200 and r.json()["live"], r.text


@pytest.mark.parametrize(
    "path,body,code,param",
    [
        ("/v1/chat/completions", {"n": 2}, "field_not_honoured", "n"),
        (
            "/v1/chat/completions",
            {"extra_messages": [[{"role": "user", "content": "Hey"}]]},
            "field_not_honoured",
            "extra_messages",
        ),
        ("/v1/completions", {"prompt": ["one", "two"]}, "field_not_honoured", "prompt"),
    ],
)
def test_refused_without_a_single_sequence(server, path, body, code, param):
    base = {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    refused(post(server, path, {**base, "max_tokens": 2, **body, "return_sae_activations": {}}), code, param)


def test_refused_for_an_sae_not_attached(server):
    error = refused(
        post(server, "/v1/completions", {"prompt": "Hi", "return_sae_activations": {"sae_id": "sae_nope"}}),
        "sae_not_attached",
        "return_sae_activations.sae_id",
    )
    assert SAE_ID in error["message"]


def test_refused_when_sae_id_is_ambiguous_naming_the_candidates(server):
    r = httpx.post(server.url + "/api/saes/attach", json={"model": MODEL, "sae": "demo:tiny:2"}, timeout=60)
    assert r.status_code == 200, r.text
    try:
        error = refused(
            post(server, "/v1/completions", {"prompt": "Hi", "return_sae_activations": {}}),
            "invalid_parameter",
            "return_sae_activations.sae_id",
        )
        assert SAE_ID in error["message"] and "sae_demo_tiny_l2" in error["message"]
        # named, either one reads
        read = completion(server, {"sae_id": "sae_demo_tiny_l2"})["millm"]["sae_activations"]
        assert (read["sae_id"], read["layer"]) == ("sae_demo_tiny_l2", 2)
    finally:
        r = httpx.post(server.url + "/api/saes/detach", json={"model": MODEL, "sae_id": "sae_demo_tiny_l2"}, timeout=30)
        assert r.status_code == 200, r.text


def test_refused_for_a_feature_past_the_width(server):
    refused(
        post(server, "/v1/completions", {"prompt": "Hi", "return_sae_activations": {"features": [3, 512]}}),
        "invalid_feature_index",
        "return_sae_activations.features",
    )


def test_refused_for_top_k_over_the_cap(server):
    error = refused(
        post(server, "/v1/completions", {"prompt": "Hi", "return_sae_activations": {"top_k": 65}}),
        "invalid_parameter",
        "return_sae_activations.top_k",
    )
    assert "SAE_ACTIVATIONS_MAX_TOP_K" in error["message"]
    completion(server, {"top_k": 64})  # the cap itself is served


@pytest.mark.parametrize(
    "positions,max_tokens",
    [
        ("completion", 1025),  # 1,025 × 64 > 65,536: max_tokens counted in full
        ("all", 1024),  # 1,024 alone fits; the prompt's tokens count too
    ],
)
def test_refused_when_the_worst_case_exceeds_the_entry_cap(server, positions, max_tokens):
    before = server.actors()["cpu"]["counters"]["tokens_generated"]
    refused(
        post(
            server,
            "/v1/completions",
            {
                "prompt": PROMPT,
                "max_tokens": max_tokens,
                "return_sae_activations": {"positions": positions, "top_k": 64},
            },
        ),
        "invalid_parameter",
        "return_sae_activations",
    )
    assert server.actors()["cpu"]["counters"]["tokens_generated"] == before  # nothing was generated


@pytest.mark.parametrize(
    "body",
    [
        {"positions": "first"},
        {"positions": {"start": 3, "end": 3}},
        {"read_point": "middle"},
        {"top_k": 0},
        {"features": []},
        {"layer": 1},
    ],
)
def test_refused_for_malformed_values(server, body):
    r = post(server, "/v1/completions", {"prompt": "Hi", "return_sae_activations": body})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parameter", r.text


def test_an_engine_without_sae_hooks_is_refused_before_any_load(server):
    def loaded() -> bool:
        return any(NPU in a["models"] for a in server.actors().values())

    was = loaded()
    r = httpx.post(
        server.url + "/v1/chat/completions",
        timeout=60,
        json={"model": NPU, "messages": [{"role": "user", "content": "Hi"}], "return_sae_activations": {}},
    )
    refused(r, "field_not_honoured", "return_sae_activations")
    assert loaded() == was


def test_scoring_reports_steering_none(server):
    r = post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 1, "logprobs": 2})
    assert r.status_code == 200 and r.headers["X-miLLM-Steering"] == "none"
    r = post(
        server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "logprobs": True},
    )
    assert r.status_code == 200 and r.headers["X-miLLM-Steering"] == "none"
    r = post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 1})
    assert "X-miLLM-Steering" not in r.headers  # a generation is steered as the server is


def test_scoring_reads_the_unsteered_pass(server):
    def score_read(**extra) -> dict:
        r = post(
            server,
            "/v1/completions",
            {
                "prompt": PROMPT,
                "max_tokens": 1,
                "logprobs": 2,
                **extra,
                "return_sae_activations": {"features": [5, 9], "positions": "all"},
            },
        )
        assert r.status_code == 200 and r.headers["X-miLLM-Steering"] == "none", r.text
        return r.json()["millm"]["sae_activations"]

    before = steering(server)
    unsteered = score_read()
    assert unsteered["read_point"] == "unsteered" and "unsteered model" in unsteered["note"]
    # the scored token is never fed: the positions are the prompt's, as a generation's prefill reads them
    assert [p["position"] for p in unsteered["positions"]] == list(range(len(PROMPT)))
    generation = completion(server, {"features": [5, 9], "positions": "prompt"})["millm"]["sae_activations"]
    try:
        r = httpx.put(
            server.url + "/api/steering",
            timeout=30,
            json={"model": MODEL, "enabled": True, "strengths": {SAE_ID: {"5": 150}}},
        )
        assert r.status_code == 200 and r.json()["live"], r.text
        assert score_read() == unsteered  # live steering changes nothing a scoring pass reads
        steered = completion(server, {"features": [5, 9], "positions": "prompt"})["millm"]["sae_activations"]
        assert steered["positions"] != unsteered["positions"]
    finally:
        r = httpx.put(
            server.url + "/api/steering",
            timeout=30,
            json={"model": MODEL, "enabled": before["enabled"], "strengths": before["strengths"]},
        )
        assert r.status_code == 200 and r.json()["live"], r.text
    if not before["strengths"]:  # the server unsteered: the generation's prefill read the same values
        assert generation["positions"] == unsteered["positions"]


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/completions", {"prompt": ["Hi", "Ho"], "max_tokens": 1, "logprobs": 1}, "prompt"),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 1,
                "logprobs": True,
                "extra_messages": [[{"role": "user", "content": "Ho"}]],
            },
            "extra_messages",
        ),
    ],
)
def test_scoring_with_several_rows_refuses_activations(server, path, body, param):
    refused(post(server, path, {**body, "return_sae_activations": {}}), "field_not_honoured", param)


def test_served_on_the_serial_path_under_continuous_batching(tmp_path, model_cache):
    config = f"""
continuous_batching = true
npu_actors = []
[[models]]
id = "{MODEL}"
source = "demo:tiny"
sae = "demo:tiny"
"""
    srv = Server(tmp_path, server_cache(tmp_path, model_cache), config)
    try:
        deadline = time.monotonic() + 30
        while not (steering(srv)["live"] and steering(srv)["saes"]):  # the default SAE, once pushed
            assert time.monotonic() < deadline, steering(srv)
            time.sleep(0.1)
        # the fixed sampling parameters: batchable but for the readout, which a batch row would not run
        body = completion(srv, {"positions": "completion"}, temperature=1.0)
        fed = len(PROMPT) + body["usage"]["completion_tokens"] - 1
        assert [p["position"] for p in body["millm"]["sae_activations"]["positions"]] == list(range(len(PROMPT), fed))
    finally:
        srv.stop()
