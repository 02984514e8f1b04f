"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens, http/anthropic/messages_api.py) with
the anthropic SDK, on a transformers and a GGUF model: created, streamed with the SDK's helpers
(Anthropic's event sequence), a tool_use/tool_result round trip with tool_choice tool and any,
the token count, and typed exceptions in Anthropic's envelope — 400s, 404, and overloaded (529)
on a full queue. One server for the module, with a queue of one request per engine actor."""

from __future__ import annotations

import concurrent.futures
import functools
import operator
import time

import anthropic
import httpx
import pytest
from conftest import MODEL, UNENDING, Server
from fake_hub import server_cache

GGUF = "greenroom-demo-gguf:Q8_0"
CONFIG = f"""
npu_actors = []
max_queue = 1
[[models]]
id = "{MODEL}"
source = "demo:tiny"
[[models]]
id = "{GGUF}"
source = "demo-gguf:Q8_0"
engine = "llama.cpp"
"""
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
HELLO = [{"role": "user", "content": "Hello there"}]
GREEDY = {"temperature": 0}  # the SDK sends sampling settings as extra fields


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    tmp = tmp_path_factory.mktemp("messages")
    server = Server(tmp, server_cache(tmp, model_cache), CONFIG)
    yield server
    server.stop()


def client(srv: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=60)


@pytest.mark.parametrize("model", [MODEL, GGUF])
def test_a_stop_sequence_is_named(srv, model):
    whole = client(srv).messages.create(model=model, max_tokens=16, messages=HELLO, extra_body=GREEDY)
    text = whole.content[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # a string the greedy answer holds
    created = client(srv).messages.create(
        model=model, max_tokens=16, messages=HELLO, stop_sequences=["\u2603", stop], extra_body=GREEDY
    )
    assert (created.stop_reason, created.stop_sequence) == ("stop_sequence", stop)
    assert text.startswith(created.content[0].text) and stop not in created.content[0].text
    with client(srv).messages.stream(
        model=model, max_tokens=16, messages=HELLO, stop_sequences=[stop], extra_body=GREEDY
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == (
        "stop_sequence",
        stop,
        created.content[0].text,
    )


@pytest.mark.parametrize("model", [MODEL, GGUF])
def test_created_streamed_and_counted(srv, model):
    created = client(srv).messages.create(model=model, max_tokens=8, messages=HELLO, extra_body=GREEDY)
    (block,) = created.content
    assert created.stop_reason == "max_tokens" and block.type == "text" and block.text
    assert created.usage.output_tokens == 8
    counted = client(srv).messages.count_tokens(model=model, messages=HELLO)
    assert counted.input_tokens == created.usage.input_tokens
    with client(srv).messages.stream(model=model, max_tokens=8, messages=HELLO, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == block.text and final.content[0].text == block.text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    assert final.usage.input_tokens == created.usage.input_tokens
    r = httpx.post(
        srv.url + "/v1/messages",
        json={"model": model, "max_tokens": 3, "messages": HELLO, "stream": True},
        timeout=60,
    )
    names = [line.removeprefix("event: ") for line in r.text.splitlines() if line.startswith("event: ")]
    deltas = names.count("content_block_delta")
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


@pytest.mark.parametrize("model", [MODEL, GGUF])
def test_streamed_usage_is_cumulative(srv, model):
    """message_delta's usage is the SDK's MessageDeltaUsage: cumulative, the input included (what
    langchain-anthropic reads), with the cache fields; the streamed message's usage is the created one's."""
    created = client(srv).messages.create(model=model, max_tokens=8, messages=HELLO, extra_body=GREEDY)
    assert created.usage.model_dump(exclude_none=True) == {
        "input_tokens": created.usage.input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 8,
    }
    with client(srv).messages.stream(model=model, max_tokens=8, messages=HELLO, extra_body=GREEDY) as stream:
        (delta,) = [e for e in stream if e.type == "message_delta"]
        final = stream.get_final_message()
    assert delta.usage.model_dump(exclude_none=True) == created.usage.model_dump(exclude_none=True)
    assert final.usage == created.usage
    if model == MODEL:
        from langchain_anthropic import ChatAnthropic

        llm = ChatAnthropic(base_url=srv.url, api_key="x", model=model, max_tokens=8, temperature=0, max_retries=0)
        whole = llm.invoke("Hello there")
        streamed = functools.reduce(operator.add, llm.stream("Hello there"))
        keys = ("input_tokens", "output_tokens", "total_tokens")
        assert [streamed.usage_metadata[k] for k in keys] == [whole.usage_metadata[k] for k in keys]
        assert streamed.usage_metadata["input_tokens"] == created.usage.input_tokens


@pytest.mark.parametrize("model", [MODEL, GGUF])
def test_a_tool_round_trip(srv, model):
    one = {"disable_parallel_tool_use": True}
    called = client(srv).messages.create(
        model=model,
        max_tokens=64,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather", **one},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        extra_body=GREEDY,
    )
    (use,) = called.content
    assert called.stop_reason == "tool_use" and use.type == "tool_use" and use.id.startswith("toolu_")
    assert use.name == "get_weather" and use.input.keys() == {"city"}
    answered = client(srv).messages.create(
        model=model,
        max_tokens=8,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": called.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]},
        ],
        extra_body=GREEDY,
    )
    assert answered.content[0].type == "text"
    with client(srv).messages.stream(
        model=model,
        max_tokens=64,
        tools=[WEATHER],
        tool_choice={"type": "any", **one},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        extra_body=GREEDY,
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].input == use.input


def test_typed_exceptions(srv):
    with pytest.raises(anthropic.BadRequestError) as exc:
        client(srv).messages.create(model=MODEL, max_tokens=0, messages=HELLO)
    assert exc.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "'max_tokens' must be between 1 and 2147483647, got 0",
        "code": "invalid_parameter",
        "param": "max_tokens",
    }
    with pytest.raises(anthropic.BadRequestError) as exc:
        client(srv).messages.create(
            model=MODEL, max_tokens=8, messages=HELLO, thinking={"type": "enabled", "budget_tokens": 1024}
        )
    assert exc.value.body["error"]["code"] == "field_not_honoured" and exc.value.body["error"]["param"] == "thinking"
    with pytest.raises(anthropic.NotFoundError):
        client(srv).messages.create(model="no-such-model", max_tokens=8, messages=HELLO)
    r = httpx.post(srv.url + "/v1/messages/batches", json={}, timeout=30)
    assert r.status_code == 404 and r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    "body,code,param",
    [
        ({"max_tokens": None}, "missing_parameter", "max_tokens"),
        ({"messages": []}, "invalid_parameter", "messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "field_not_honoured",
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
            "invalid_parameter",
            "messages[0].content[0]",
        ),
        (  # any JSON value may arrive as a block's type
            {"messages": [{"role": "user", "content": [{"type": ["image"], "text": "x"}]}]},
            "invalid_parameter",
            "messages[0].content[0]",
        ),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "field_not_honoured", "tools[0]"),
        ({"tools": [{"name": "a b", "input_schema": {}}]}, "invalid_parameter", "tools[0].name"),
        ({"tool_choice": {"type": "any"}}, "invalid_parameter", "tool_choice"),
        ({"stop_sequences": "x"}, "invalid_parameter", "stop_sequences"),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {"not": {}}}}},
            "response_format_unsupported",
            "output_config.format",
        ),
        ({"output_config": {"effort": "high"}}, "field_not_honoured", "output_config.effort"),
        ({"max_tokens": 40000}, "context_length_exceeded", "max_tokens"),
    ],
)
def test_refusals_are_typed_400s(srv, body, code, param):
    r = httpx.post(
        srv.url + "/v1/messages", json={"model": MODEL, "max_tokens": 8, "messages": HELLO, **body}, timeout=60
    )
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["param"] == param, r.text


def test_a_full_queue_is_overloaded(srv):
    """max_queue = 1: a second request while one runs is Anthropic's 529 overloaded_error."""
    busy = {"model": MODEL, "max_tokens": 1500, "messages": HELLO, **UNENDING}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(httpx.post, srv.url + "/v1/messages", json=busy, timeout=120)
        deadline = time.monotonic() + 10
        while srv.actors()["cpu"]["queue_depth"] + srv.actors()["cpu"]["counters"]["active"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(anthropic.OverloadedError) as exc:
            client(srv).messages.create(model=MODEL, max_tokens=2, messages=HELLO)
        assert running.result().status_code == 200
    assert exc.value.status_code == 529 and exc.value.body["error"]["type"] == "overloaded_error"
    assert exc.value.response.headers["Retry-After"]
