"""Schemas as real clients write them, and tool calls whose strings hold call markup, on both
SmolLM2 engines (transformers and llama.cpp) of the session's default-config server.

Annotations (`$schema`, `title`, `examples`, `default`, `x-…`) constrain nothing: pydantic (through
the openai SDK's `parse`, the anthropic and ollama SDKs and LangChain) and zod v4 (the bodies the
Vercel AI SDK's openai-compatible provider sends) write them into every schema, and every schema
they write is served. `format` is enforced where llguidance enforces it. A refusal names the field
that holds the schema. A call block ends where its JSON ends: braces, quotes, escapes, newlines,
unicode and `</tool_call>` inside a string argument are the string's, forced or not, streamed or
not, on /v1/chat/completions, /v1/messages and /v1/responses."""

from __future__ import annotations

import datetime
import json
from typing import Literal

import anthropic
import httpx
import ollama
import openai
import pydantic
import pytest
from conftest import SMOLLM2_MODELS
from langchain_openai import ChatOpenAI

HF_MODEL, GGUF_MODEL = SMOLLM2_MODELS
ASK = "What's the weather in Lagos today?"


class Weather(pydantic.BaseModel):
    """The weather in a city on a day."""

    city: str = pydantic.Field(max_length=20, title="City", examples=["Lagos"], description="The city's name")
    day: datetime.date  # format: date
    unit: Literal["c", "f"] = "c"  # default


# zod v4's toJSONSchema, as the AI SDK sends it: draft-07 (its target) or 2020-12 (zod's default)
DRAFT_07, DRAFT_2020 = "http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2020-12/schema"


def zod(dialect: str) -> dict:
    return {
        "$schema": dialect,
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20, "description": "The city"},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    }


def oai(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="-", max_retries=0, timeout=300)


def claude(srv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="-", max_retries=0, timeout=300)


@pytest.mark.parametrize("model", SMOLLM2_MODELS)
def test_pydantic_schemas_through_the_openai_sdk(smollm2_server, model):
    # before: 400 response_format_unsupported "unsupported keywords: /properties/city/title, …/format"
    client = oai(smollm2_server)
    ask = [{"role": "user", "content": ASK}]
    parsed = client.chat.completions.parse(
        model=model, messages=ask, response_format=Weather, max_tokens=80, temperature=0
    )
    assert isinstance(parsed.choices[0].message.parsed, Weather)
    called = client.chat.completions.parse(
        model=model,
        messages=ask,
        tools=[openai.pydantic_function_tool(Weather)],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
    )
    (call,) = called.choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, Weather)


@pytest.mark.parametrize("model", SMOLLM2_MODELS)
def test_pydantic_schemas_through_the_anthropic_and_ollama_sdks(smollm2_server, model):
    schema = Weather.model_json_schema()
    assert schema["properties"]["city"]["examples"] == ["Lagos"] and schema["properties"]["day"]["format"] == "date"
    tool = {"name": "weather", "description": "Report the weather", "input_schema": schema}
    message = claude(smollm2_server).messages.create(
        model=model,
        max_tokens=80,
        tools=[tool],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        messages=[{"role": "user", "content": ASK}],
        extra_body={"temperature": 0},
    )
    (use,) = message.content
    assert message.stop_reason == "tool_use" and Weather.model_validate(use.input)
    answer = ollama.Client(host=smollm2_server.url, timeout=300).chat(
        model=model, messages=[{"role": "user", "content": ASK}], format=schema, options={"temperature": 0}
    )
    assert answer.done_reason == "stop" and Weather.model_validate_json(answer.message.content)


@pytest.mark.parametrize("model", SMOLLM2_MODELS)
def test_langchain_structured_output_and_required_tools(smollm2_server, model):
    chat = ChatOpenAI(
        base_url=smollm2_server.url + "/v1", api_key="-", model=model, temperature=0, max_tokens=80, max_retries=0
    )
    assert isinstance(chat.with_structured_output(Weather).invoke(ASK), Weather)
    (call,) = chat.bind_tools([Weather], tool_choice="required", parallel_tool_calls=False).invoke(ASK).tool_calls
    assert call["name"] == "Weather" and Weather.model_validate(call["args"])


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=300)


@pytest.mark.parametrize(
    "model, dialect", list(zip(SMOLLM2_MODELS, (DRAFT_07, DRAFT_2020))), ids=["draft-07", "2020-12"]
)
def test_the_ai_sdk_bodies(smollm2_server, model, dialect):
    """generateObject, tools with toolChoice "required", and streamText with tools, as the AI
    SDK's openai-compatible provider writes them from a zod v4 schema (before: 400
    "unsupported keywords: /$schema" for the first two). The dialect is read by the front end
    alone: each engine gets one."""
    schema = zod(dialect)
    base = {"model": model, "max_tokens": 60, "temperature": 0, "messages": [{"role": "user", "content": ASK}]}
    fmt = {"type": "json_schema", "json_schema": {"schema": schema, "strict": True, "name": "response"}}
    obj = post(smollm2_server, "/v1/chat/completions", {**base, "response_format": fmt})
    assert obj.status_code == 200, obj.text
    assert json.loads(obj.json()["choices"][0]["message"]["content"]).keys() == {"city", "unit"}
    tools = [
        {"type": "function", "function": {"name": "weather", "description": "Report the weather", "parameters": schema}}
    ]
    forced = post(smollm2_server, "/v1/chat/completions", {**base, "tools": tools, "tool_choice": "required"})
    assert forced.status_code == 200, forced.text
    assert forced.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "weather"
    streamed = post(
        smollm2_server,
        "/v1/chat/completions",
        {**base, "tools": tools, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]"), streamed.text
    assert all(
        "error" not in json.loads(line[6:]) for line in streamed.text.splitlines()[:-1] if line.startswith("data: {")
    )


UNENFORCEABLE = {"type": "object", "properties": {"site": {"type": "string", "format": "uri-reference"}}}


def test_a_refusal_names_the_field_that_holds_the_schema(smollm2_server):
    """What cannot be enforced (a format llguidance does not write) is refused naming the keyword
    and the field; count_tokens enforces nothing and checks nothing."""
    ask = [{"role": "user", "content": ASK}]
    bodies = {
        "tools[0].function.parameters": (
            "/v1/chat/completions",
            {"messages": ask, "tools": [{"type": "function", "function": {"name": "f", "parameters": UNENFORCEABLE}}]},
            {"tool_choice": "required"},
        ),
        "response_format": (
            "/v1/chat/completions",
            {"messages": ask},
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": UNENFORCEABLE}}},
        ),
        "tools[0].input_schema": (
            "/v1/messages",
            {"messages": ask, "max_tokens": 8, "tools": [{"name": "f", "input_schema": UNENFORCEABLE}]},
            {"tool_choice": {"type": "any"}},
        ),
        "tools[0].parameters": (
            "/v1/responses",
            {"input": ASK, "tools": [{"type": "function", "name": "f", "parameters": UNENFORCEABLE}]},
            {"tool_choice": "required"},
        ),
        "format": ("/api/chat", {"messages": ask, "stream": False}, {"format": UNENFORCEABLE}),
    }
    for param, (path, body, enforcing) in bodies.items():
        refused = post(smollm2_server, path, {"model": HF_MODEL, **body, **enforcing})
        assert refused.status_code == 400, refused.text
        error = refused.json()
        if path != "/api/chat":  # Ollama's envelope has no param
            assert error["error"]["param"] == param, error
        message = json.dumps(error)
        assert "/properties/site/format" in message and "uri-reference" in message and param in message
    counted = claude(smollm2_server).messages.count_tokens(
        model=HF_MODEL,
        messages=ask,
        tools=[{"name": "f", "input_schema": {"$schema": DRAFT_07, **UNENFORCEABLE}}],
        tool_choice={"type": "any"},
    )
    assert counted.input_tokens > 0


# -- a call block ends where its JSON ends ---------------------------------------------------------

# braces and brackets, quotes, an escaped quote, a backslash, the closing tag, a newline, unicode
ADVERSARIAL = 'def f(){return 10}}} # "q" \\" </tool_call>\n{[ é😀'
PYTHON = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}
ONLY = {"type": "object", "properties": {"code": {"const": ADVERSARIAL}}, "required": ["code"]}
EXAMPLE = "Run the example."


def forced_and_auto(surface: str, model: str, forced: bool) -> dict:
    """One request's keyword arguments on `surface`. Forced: the call is required and its
    argument constrained to the adversarial string. Auto: a conversation in which the call was
    made before, which the model repeats, greedy, when asked again."""
    params = ONLY if forced else PYTHON
    code = json.dumps({"code": ADVERSARIAL})
    if surface == "chat":
        messages = [{"role": "user", "content": EXAMPLE}]
        if not forced:
            call = {"id": "call_1", "type": "function", "function": {"name": "python", "arguments": code}}
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]}, messages[0]]
        return dict(
            model=model,
            messages=messages,
            tools=[{"type": "function", "function": {"name": "python", "parameters": params}}],
            tool_choice="required" if forced else "auto",
            parallel_tool_calls=False,
            max_tokens=80,
            temperature=0,
        )
    if surface == "messages":
        messages = [{"role": "user", "content": EXAMPLE}]
        if not forced:
            use = {"type": "tool_use", "id": "toolu_1", "name": "python", "input": {"code": ADVERSARIAL}}
            messages += [{"role": "assistant", "content": [use]}, messages[0]]
        return dict(
            model=model,
            messages=messages,
            tools=[{"name": "python", "input_schema": params}],
            tool_choice={"type": "any" if forced else "auto", "disable_parallel_tool_use": True},
            max_tokens=80,
            extra_body={"temperature": 0},
        )
    items = [{"role": "user", "content": EXAMPLE}]
    if not forced:
        items += [{"type": "function_call", "call_id": "call_1", "name": "python", "arguments": code}, items[0]]
    return dict(
        model=model,
        input=items,
        tools=[{"type": "function", "name": "python", "parameters": params}],
        tool_choice="required" if forced else "auto",
        parallel_tool_calls=False,
        max_output_tokens=80,
        temperature=0,
        store=False,
    )


def calls_and_text(srv, surface: str, streamed: bool, kw: dict) -> tuple[list[dict], str]:
    """The answer's calls' arguments (parsed) and its text, through the surface's SDK."""
    if surface == "chat":
        if not streamed:
            message = oai(srv).chat.completions.create(**kw).choices[0].message
            return [json.loads(c.function.arguments) for c in message.tool_calls or []], message.content or ""
        calls: dict[int, str] = {}
        text = ""
        for chunk in oai(srv).chat.completions.create(stream=True, **kw):
            for delta in chunk.choices:
                text += delta.delta.content or ""
                for c in delta.delta.tool_calls or []:
                    calls[c.index] = calls.get(c.index, "") + (c.function.arguments or "")
        return [json.loads(a) for _, a in sorted(calls.items())], text
    if surface == "messages":
        if streamed:
            with claude(srv).messages.stream(**kw) as stream:
                message = stream.get_final_message()
        else:
            message = claude(srv).messages.create(**kw)
        blocks = message.content
        return [b.input for b in blocks if b.type == "tool_use"], "".join(b.text for b in blocks if b.type == "text")
    if streamed:
        with oai(srv).responses.stream(**kw) as stream:
            response = stream.get_final_response()
    else:
        response = oai(srv).responses.create(**kw)
    return [json.loads(i.arguments) for i in response.output if i.type == "function_call"], response.output_text


# each surface forced and not, once; the engines alternate so that each sees both modes
MARKUP_CASES = [
    pytest.param(surface, forced, SMOLLM2_MODELS[(i + forced) % 2], id=f"{surface}-{'forced' if forced else 'auto'}")
    for i, surface in enumerate(["chat", "messages", "responses"])
    for forced in (True, False)
]


@pytest.mark.parametrize(("surface", "forced", "model"), MARKUP_CASES)
def test_string_arguments_holding_call_markup(smollm2_server, surface, forced, model):
    """Before: forced, a 500 constrained_output_invalid "not a call object" (the block cut at
    the `</tool_call>` inside the string); auto, the call dropped and `"}}\\n</tool_call>` in
    the content."""
    for streamed in (False, True):
        calls, text = calls_and_text(smollm2_server, surface, streamed, forced_and_auto(surface, model, forced))
        assert calls == [{"code": ADVERSARIAL}], (streamed, calls, text)
        assert "tool_call" not in text and "}" not in text, (streamed, text)


# the tool of the unseeded run (no additionalProperties: false, so a call may add a property)
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Get the current weather in a city", "parameters": CITY},
}


def test_the_seed_that_wrote_the_closing_tag_into_a_key(smollm2_server):
    """Unseeded, 2 of 251 required calls of this tool answered 500 on transformers SmolLM2. This
    seed's call (on the machine the fix was made on) writes `</tool_call>` inside a property
    name — before: 500 constrained_output_invalid; now the call, as the grammar let it be
    written, and valid."""
    body = {
        "model": HF_MODEL,
        "messages": [{"role": "user", "content": "What's the weather in Lagos?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "seed": 15,
        "max_tokens": 200,
    }
    answer = post(smollm2_server, "/v1/chat/completions", body)
    assert answer.status_code == 200, answer.text
    message = answer.json()["choices"][0]["message"]
    assert "tool_call" not in (message["content"] or "")
    for call in message.get("tool_calls") or []:
        assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
