"""Tool results paired with their calls by id (chat's tool_call_id, Anthropic's tool_use_id,
Responses' call_id): a normal agent turn — a call, its result, the answer — through the openai
and anthropic SDKs on both SmolLM2 engines, in strict mode (every field read, none reported), and
a result naming no earlier call refused naming its field. How the ids reach a chat template:
test_chat_templates.py."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from conftest import SMOLLM2_MODELS

STRICT = {"X-miLLM-Strict": "true"}
ASK = "What's the weather in Lagos?"
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
GREEDY = {"temperature": 0}


def oai(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=300, default_headers=STRICT)


def claude(srv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="-", max_retries=0, timeout=300, default_headers=STRICT)


@pytest.mark.parametrize("model", SMOLLM2_MODELS)
def test_an_agent_turn_in_strict_mode_on_every_surface(smollm2_server, model):
    """Before: the result turn of each was 400 unused_fields_refused (messages[2].tool_call_id,
    messages[2].content[0].tool_use_id, input[2].call_id)."""
    client = oai(smollm2_server)
    ask = [{"role": "user", "content": ASK}]
    called = client.chat.completions.create(
        model=model, messages=ask, tools=[CHAT_TOOL], tool_choice="required", parallel_tool_calls=False, **GREEDY
    ).choices[0]
    (call,) = called.message.tool_calls
    result = {"role": "tool", "tool_call_id": call.id, "content": "31 C, sunny"}
    answer = client.chat.completions.create(
        model=model,
        messages=[*ask, called.message.model_dump(exclude_none=True), result],
        tools=[CHAT_TOOL],
        max_tokens=24,
        **GREEDY,
    )
    assert answer.choices[0].message.content

    tool = {"name": "get_weather", "description": "The weather in a city", "input_schema": PARAMETERS}
    used = claude(smollm2_server).messages.create(
        model=model,
        max_tokens=80,
        tools=[tool],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        messages=ask,
        extra_body=GREEDY,
    )
    (use,) = used.content
    answered = claude(smollm2_server).messages.create(
        model=model,
        max_tokens=24,
        tools=[tool],
        messages=[
            *ask,
            {"role": "assistant", "content": used.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "31 C, sunny"}]},
        ],
        extra_body=GREEDY,
    )
    assert answered.content[0].type == "text"

    function = {"type": "function", "name": "get_weather", "parameters": PARAMETERS, "strict": True}
    first = client.responses.create(
        model=model,
        input=ASK,
        tools=[function],
        tool_choice="required",
        parallel_tool_calls=False,
        store=False,
        **GREEDY,
    )
    (item,) = first.output
    then = client.responses.create(
        model=model,
        input=[
            {"role": "user", "content": ASK},
            item.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": item.call_id, "output": "31 C, sunny"},
        ],
        tools=[function],
        max_output_tokens=24,
        store=False,
        **GREEDY,
    )
    assert then.output_text


MODEL = SMOLLM2_MODELS[0]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Lagos"})},
}


@pytest.mark.parametrize(
    "path,body,param",
    [
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": ASK},
                    {"role": "assistant", "content": None, "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "call_2", "content": "31 C"},
                ],
                "max_tokens": 4,
            },
            "messages[2].tool_call_id",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": ASK}, {"role": "tool", "tool_call_id": 1, "content": "31 C"}]},
            "messages[1].tool_call_id",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 4,
                "messages": [
                    {"role": "user", "content": ASK},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}],
                    },
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "31 C"}]},
                ],
            },
            "messages[2].content[0].tool_use_id",
        ),
        (
            "/v1/responses",
            {
                "input": [
                    {"role": "user", "content": ASK},
                    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "call_2", "output": "31 C"},
                ]
            },
            "input[2].call_id",
        ),
    ],
)
def test_a_result_naming_no_earlier_call_is_refused(smollm2_server, path, body, param):
    r = httpx.post(smollm2_server.url + path, json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_parameter" and r.json()["error"]["param"] == param, r.text
