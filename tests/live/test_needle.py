"""The Needle surface: x_needle on chat completions, /v1/needle/extract and /complete."""

import json

import httpx
import jsonschema
import pytest
from conftest import MODEL

INVOICE = {
    "type": "object",
    "properties": {"vendor": {"type": "string"}, "total": {"type": "number"}, "due_date": {"type": "string"}},
    "required": ["vendor", "total", "due_date"],
}
EXTRACT = {"text": "Invoice from Acme Corp", "name": "Invoice", "schema": INVOICE}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
FIELDS = {
    "type",
    "confidence",
    "reasoning",
    "validation",
    "prefill_tps",
    "decode_tps",
    "peak_ram_mb",
    "replayed_turns",
    "reinitialized",
    "queue_wait_seconds",
    "compute_seconds",
    "warnings",
}


def post(server, path, body):
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_x_needle_on_chat_completions(server):
    body = post(
        server,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "I don't want rain in Lagos"}],
            "max_tokens": 20,
            "foo": 1,
        },
    )
    x = body["x_needle"]
    assert set(x) == FIELDS
    assert x["type"] == "respond" and 0 < x["confidence"] <= 1
    assert x["validation"] == {"ungrounded": [], "negation": True}
    assert x["warnings"] == ["ignored field: foo"]
    assert x["prefill_tps"] > 0 and x["decode_tps"] > 0 and x["peak_ram_mb"] > 50
    assert x["queue_wait_seconds"] >= 0 and x["compute_seconds"] > 0
    assert x["replayed_turns"] == 1 and x["reinitialized"] is True


def test_x_needle_call_with_ungrounded_arguments(server):
    body = post(
        server,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Weather in Lagos?"}],
            "max_tokens": 80,
            "seed": 3,
            "tools": [TOOL],
            "tool_choice": "required",
        },
    )
    x, message = body["x_needle"], body["choices"][0]["message"]
    assert x["type"] == "call" and message["tool_calls"]
    expected = []
    for call in message["tool_calls"]:
        city = json.loads(call["function"]["arguments"])["city"]
        if city and city.lower() not in "weather in lagos?":
            expected.append("get_weather.city")
    assert x["validation"]["ungrounded"] == expected
    # the random model's numbers: its confidence is its own probability of what it wrote
    assert 0 < x["confidence"] <= 1


def test_x_needle_rides_on_the_streamed_finish_chunk(server):
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        timeout=60,
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True},
    ) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and set(finish[0]["x_needle"]) == FIELDS
    assert all("x_needle" not in c for c in chunks if c is not finish[0])


def test_extract_invoice(server):
    body = post(
        server,
        "/v1/needle/extract",
        {"text": "Invoice from Acme Corp, $1,200.00, due 2026-09-01", "name": "Invoice", "schema": INVOICE, "seed": 1},
    )
    assert body["object"] == "needle.extraction" and body["matched"] is True
    jsonschema.validate(body["data"], INVOICE)
    assert set(body["x_needle"]) == FIELDS


@pytest.mark.parametrize(
    "body,param",
    [
        ({"name": "Invoice", "schema": INVOICE}, "text"),
        ({"text": "x", "schema": INVOICE}, "name"),
        ({"text": "x", "name": "Invoice"}, "schema"),
        (
            {
                "text": "x",
                "name": "I",
                "schema": {"type": "object", "properties": {"a": {"type": "string", "format": "binary"}}},
            },
            "response_format",
        ),
    ],
)
def test_extract_refusals(server, body, param):
    r = httpx.post(server.url + "/v1/needle/extract", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_complete_with_query_and_flat_tools_as_string(server):
    tools = [{"name": "get_weather", "parameters": TOOL["function"]["parameters"]}]
    body = post(
        server,
        "/v1/needle/complete",
        {
            "query": "what is it like in Lagos right now?",
            "system": "Be brief.",
            "tools": json.dumps(tools),
            "max_tokens": 10,
        },
    )
    assert body["object"] == "needle.completion" and body["model"] == MODEL
    assert body["finish_reason"] in ("stop", "length", "tool_calls") and isinstance(body["tool_calls"], list)
    assert set(body["x_needle"]) == FIELDS


def test_complete_refusals_name_the_flat_tools_fields(server):
    """A refusal of the chat request a Needle request became names Needle's fields: a flat tool
    is chat's function (tools[0].name, not tools[0].function.name)."""
    tools = [{"name": "get weather", "parameters": {}}, {"name": "f", "parameters": {"type": 5}}]
    for sent, param in ((tools[:1], "tools[0].name"), (tools[1:], "tools[0].parameters")):
        r = httpx.post(server.url + "/v1/needle/complete", json={"query": "hi", "tools": sent}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert r.json()["error"]["message"].startswith(f"{param} "), r.text


def test_complete_with_messages_and_unknown_model_says_so(server):
    body = post(
        server,
        "/v1/needle/complete",
        {"model": "needle-2", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]},
    )
    assert body["model"] == MODEL
    assert any("needle-2" in w for w in body["x_needle"]["warnings"])


def test_no_extras_and_strict_model(own_server):
    srv = own_server(
        '[[models]]\nid = "greenroom-demo"\nsource = "demo:tiny"\n',
        extra_env={"NEEDLE_EXPOSE_EXTRAS": "false", "NEEDLE_STRICT_MODEL": "true"},
    )
    body = post(
        srv, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
    )
    assert "x_needle" not in body
    # NEEDLE_STRICT_MODEL=true: a model not served is a 404 on Needle's routes; none sent is the default one
    for path, body in (("/v1/needle/complete", {"query": "hello"}), ("/v1/needle/extract", EXTRACT)):
        r = httpx.post(srv.url + path, json={**body, "model": "needle-2", "max_tokens": 4}, timeout=60)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        assert httpx.post(srv.url + path, json={**body, "max_tokens": 4}, timeout=60).status_code == 200


def test_health_names_the_default_model_and_its_weights(server):
    health = httpx.get(server.url + "/health", timeout=10).json()
    assert health["model"] == MODEL and health["weights"] == f"{MODEL} (demo:tiny)"


def test_extract_out_of_range_number_is_not_matched(server):
    body = post(
        server,
        "/v1/needle/extract",
        {"text": "hello", "name": "x", "schema": {"type": "number"}, "seed": 7, "max_tokens": 64},
    )
    assert body["data"] is None or isinstance(body["data"], (int, float)) and abs(body["data"]) < float("inf")
    assert set(body["x_needle"]) == FIELDS
