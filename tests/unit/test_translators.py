"""The surfaces' translators (Responses, Anthropic's Messages, Needle), as pure functions: each
foreign request → the surface-neutral ChatRequest it means (the one chat completions' parser
makes of the chat body each table row gives: the same meaning) and where each of its locations
came from (FieldPaths); and a refusal of that request renamed into the surface's fields — its
param by the longest named prefix, each mention in its message — with no server."""

from __future__ import annotations

import json

import pytest

from greenroom.engines.base import SamplingParams
from greenroom.errors import GreenroomError
from greenroom.http.anthropic import messages_api
from greenroom.http.openai import needle, openai_api, responses_api
from greenroom.http.pipeline.paths import FieldPaths
from greenroom.http.pipeline.request import ChatRequest, Streaming
from greenroom.http.pipeline.structured import Output

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
STORED = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]


def _checking(call_id: str, arguments) -> dict:
    """Chat's assistant turn that says "Checking." and calls get_weather."""
    call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return {"role": "assistant", "content": "Checking.", "tool_calls": [call]}


# Responses: instructions and a stored conversation shift the input; a function_call joins the
# assistant turn before it; a function_call_output is a tool message
RESPONSES = [
    (
        {"model": "m", "input": "Hello", "max_output_tokens": 8},
        [],
        {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
        {"messages[0]": "input", "messages[0].content": "input"},
    ),
    (
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Oslo?"}],
                },
                {"role": "assistant", "content": "Checking."},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "31 C"},
            ],
            "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}],
            "tool_choice": {"type": "function", "name": "get_weather"},
        },
        STORED,
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                *STORED,
                {"role": "user", "content": "Weather in Oslo?"},
                _checking("c1", '{"city": "Oslo"}'),
                {"role": "tool", "content": "31 C", "tool_call_id": "c1"},
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        {
            "messages[0]": "instructions",
            "messages[0].content": "instructions",
            "messages[1]": "previous_response_id",
            "messages[1].content": "previous_response_id",
            "messages[2]": "previous_response_id",
            "messages[2].content": "previous_response_id",
            "messages[3]": "input[0]",
            "messages[4]": "input[1]",
            "messages[4].tool_calls[0]": "input[2]",
            "messages[4].tool_calls[0].id": "input[2].call_id",
            "messages[4].tool_calls[0].function": "input[2]",
            "messages[5]": "input[3]",
            "messages[5].content": "input[3].output",
            "messages[5].tool_call_id": "input[3].call_id",
            "tools[0].function": "tools[0]",
        },
    ),
    (
        {
            "model": "m",
            "input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}],
            "text": {"format": {"type": "json_schema", "name": "city", "schema": WEATHER}},
        },
        [],
        {
            "model": "m",
            "messages": [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                }
            ],
            "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": WEATHER}},
        },
        {
            "messages[0]": "input[0]",
            "messages[0].tool_calls[0]": "input[0]",
            "messages[0].tool_calls[0].id": "input[0].call_id",
            "messages[0].tool_calls[0].function": "input[0]",
        },
    ),
]
# what every Responses request names the same way
RESPONSES_ALWAYS = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "response_format.json_schema": "text.format",
    "tool_choice.function": "tool_choice",
}


@pytest.mark.parametrize("body,history,chat,paths", RESPONSES)
def test_responses_translation(body, history, chat, paths):
    translated, own, _, field_paths = responses_api.translate(body, history)
    assert translated == openai_api.parse_chat(chat)
    assert own == chat["messages"][len(chat["messages"]) - len(own) :]  # what a stored response keeps
    assert field_paths.names == RESPONSES_ALWAYS | paths


# Messages: a system prompt shifts every message; a user's tool results are tool messages and
# its text around them turns of their own; an assistant's tool_use blocks its calls
MESSAGES = [
    (
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hello"}]},
        {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
        {"messages[0]": "messages[0]"},
    ),
    (
        {
            "model": "m",
            "max_tokens": 8,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Here:"},
                        {"type": "tool_result", "tool_use_id": "t1", "content": "31 C"},
                        {"type": "text", "text": "Thanks."},
                    ],
                },
            ],
            "tools": [{"name": "get_weather", "input_schema": WEATHER}],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
        },
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Oslo?"},
                _checking("t1", {"city": "Oslo"}),
                {"role": "user", "content": "Here:"},
                {"role": "tool", "content": "31 C", "tool_call_id": "t1"},
                {"role": "user", "content": "Thanks."},
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False,
            "stop": ["END"],
            "max_tokens": 8,
        },
        {
            "messages[0]": "system",
            "messages[0].content": "system",
            "messages[1]": "messages[0]",
            "messages[2]": "messages[1]",
            "messages[2].tool_calls[0]": "messages[1].content[1]",
            "messages[2].tool_calls[0].function": "messages[1].content[1]",
            "messages[2].tool_calls[0].function.arguments": "messages[1].content[1].input",
            "messages[3]": "messages[2]",
            "messages[4]": "messages[2].content[1]",
            "messages[4].content": "messages[2].content[1].content",
            "messages[4].tool_call_id": "messages[2].content[1].tool_use_id",
            "messages[5]": "messages[2]",
            "tools[0].function": "tools[0]",
            "tools[0].function.parameters": "tools[0].input_schema",
        },
    ),
    (
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "A city?"}],
            "output_config": {"format": {"type": "json_schema", "schema": WEATHER}},
        },
        {
            "model": "m",
            "messages": [{"role": "user", "content": "A city?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": WEATHER}},
            "max_tokens": 8,
        },
        {"messages[0]": "messages[0]"},
    ),
]
MESSAGES_ALWAYS = {
    "response_format": "output_config.format",
    "response_format.json_schema": "output_config.format",
    "tool_choice.function": "tool_choice",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
}


@pytest.mark.parametrize("body,chat,paths", MESSAGES)
def test_messages_translation(body, chat, paths):
    translated, _, field_paths = messages_api.translate(body)
    assert translated == openai_api.parse_chat(chat)
    assert field_paths.names == MESSAGES_ALWAYS | paths


# Needle: extract's text is the user message; complete's query (and system) the conversation,
# its flat tools the functions of chat's tools (OpenAI's are taken as they are)
FLAT = {"name": "get_weather", "parameters": WEATHER}
OPENAI_TOOL = {"type": "function", "function": FLAT}
NEEDLE = [
    (
        needle.extraction_chat,
        {"text": "Invoice from Acme", "name": "Due date", "schema": WEATHER, "max_tokens": 9, "extra": 1},
        {
            "messages": [
                {
                    "role": "system",
                    "content": "Extract the Due date from the user's text as JSON matching this schema: "
                    + json.dumps(WEATHER),
                },
                {"role": "user", "content": "Invoice from Acme"},
            ],
            "response_format": {"type": "json_schema", "json_schema": {"name": "Due_date", "schema": WEATHER}},
            "max_tokens": 9,
        },
        {
            "messages[1]": "text",
            "messages[1].content": "text",
            "response_format.json_schema.name": "name",
            "response_format.json_schema.schema": "schema",
        },
    ),
    (
        needle.completion_chat,
        {"query": "Weather in Oslo?", "system": "Be brief.", "tools": json.dumps([FLAT, OPENAI_TOOL])},
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}],
            "tools": [OPENAI_TOOL, OPENAI_TOOL],
        },
        {
            "messages[0]": "system",
            "messages[0].content": "system",
            "messages[1]": "query",
            "messages[1].content": "query",
            "tools[0].function": "tools[0]",
        },
    ),
    (
        needle.completion_chat,
        {"messages": [{"role": "user", "content": "Hi"}], "seed": 3},
        {"messages": [{"role": "user", "content": "Hi"}], "seed": 3},
        {},
    ),
]


@pytest.mark.parametrize("translate,body,chat,paths", NEEDLE)
def test_needle_translation(translate, body, chat, paths):
    translated, field_paths = translate(body)
    assert translated == openai_api.parse_chat(chat)
    assert field_paths.names == paths


def test_chat_completions_body_is_the_typed_request():
    """Chat completions' own translator: every field the pipeline reads, typed; the plan's and
    miLLM's fields as sent (checked once the server's state is known)."""
    body = {
        "model": "m",
        "messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}, {"role": "user"}],
        "extra_messages": [[{"role": "user", "content": "Yo"}]],
        "n": 2,
        "stream": False,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 5,
        "stop": "END",
        "presence_penalty": 1.0,
        "logprobs": True,
        "top_logprobs": 2,
        "return_tokens_as_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": False},
        "tools": [OPENAI_TOOL],
        "tool_choice": "auto",
        "return_sae_activations": {"top_k": 3},
        "steering_intensity": "max",
    }
    assert openai_api.parse_chat(body) == ChatRequest(
        "m",
        [
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ""}],
            [{"role": "user", "content": "Yo"}],
        ],
        SamplingParams(max_tokens=5, stop=("END",), repetition_penalty=1.5, logprobs=2),
        Streaming(False, False),
        2,
        {"enable_thinking": False},
        Output(tools=[OPENAI_TOOL], tool_choice="auto", stop=True),
        as_ids=True,
        sae_activations={"top_k": 3},
        steering_intensity="max",
    )


def test_the_request_is_typed_and_names_no_surface():
    """One Messages request as the typed request, spelled out: its conversation checked (a system
    prompt a message of its own), its sampling parsed, its output's tools as function tools."""
    body = {
        "model": "m",
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "tools": [{"name": "f", "input_schema": WEATHER}],
        "seed": 3,
        "profile": "calm",
    }
    translated, unread, _ = messages_api.translate(body)
    assert unread == []
    assert translated == ChatRequest(
        "m",
        [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]],
        SamplingParams(max_tokens=8, temperature=0.0, seed=3),
        Streaming(True, False),
        output=Output(tools=[{"type": "function", "function": {"name": "f", "parameters": WEATHER}}]),
        profile="calm",
    )


@pytest.mark.parametrize(
    "translate,body,refused",
    [
        # checked as the request is built, named as sent
        (
            lambda b: responses_api.translate(b, []),
            {"model": "m", "input": "a", "top_p": 2},
            ("'top_p' must be between 0 and 1, got 2", "top_p"),
        ),
        (messages_api.translate, {**MESSAGES[0][0], "stream": "yes"}, ("'stream' must be a boolean", "stream")),
        (
            needle.completion_chat,
            {"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]},
            (
                "'messages[1].role' must be one of system, developer, user, assistant, tool, function",
                "messages[1].role",
            ),
        ),
        (
            needle.completion_chat,
            {"query": "q", "max_tokens": 0},
            ("'max_tokens' must be between 1 and 2147483647, got 0", "max_tokens"),
        ),
        (  # a count enforces no schema, but one that is not an object is no schema (found by the OpenAPI fuzz)
            lambda b: messages_api.translate(b, generating=False),
            {**MESSAGES[0][0], "output_config": {"format": {"type": "json_schema", "schema": 0.0}}},
            ("'output_config.format.schema' must be a JSON schema (an object)", "output_config.format.schema"),
        ),
    ],
)
def test_a_translator_refuses_in_the_surface_fields(translate, body, refused):
    with pytest.raises(GreenroomError) as exc:
        translate(body)
    assert (exc.value.message, exc.value.param) == refused


def _responses(**extra) -> FieldPaths:
    body = {"model": "m", "input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}] * 2}
    return responses_api.translate({**body, **extra}, [])[3]


def _messages(**extra) -> FieldPaths:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "a"}] * 3}
    return messages_api.translate({**body, **extra})[2]


TOOLS = {"tools": [{"type": "function", "name": "f", "parameters": WEATHER}]}
SCHEMA_REFUSAL = "the JSON schema in '{}' is outside greenroom's supported subset: unsupported keywords: /format"
CONTEXT = (
    "This model's maximum context length is 2048 tokens. However, you requested 40012 tokens (12 in the "
    "messages, 40000 in the completion). Please reduce the length of the messages or completion."
)
# a refusal of the chat request (code, message, param) → as the surface names it (message, param)
RENAMED = [
    # a nested content part under a message that instructions shift
    (
        _responses(instructions="Be brief."),
        ("invalid_parameter", "'messages[3].content[1].text' must be a string", "messages[3].content[1].text"),
        ("'input[2].content[1].text' must be a string", "input[2].content[1].text"),
    ),
    # as today: max_tokens, and the messages, in Responses' words
    (
        _responses(),
        ("context_length_exceeded", CONTEXT, "max_tokens"),
        (CONTEXT.replace("messages", "input"), "max_output_tokens"),
    ),
    (
        _responses(**TOOLS, tool_choice="required"),
        (
            "response_format_unsupported",
            SCHEMA_REFUSAL.format("tools[0].function.parameters"),
            "tools[0].function.parameters",
        ),
        (SCHEMA_REFUSAL.format("tools[0].parameters"), "tools[0].parameters"),
    ),
    (
        _responses(),
        (
            "response_format_unsupported",
            "'response_format.json_schema' must be an object whose 'name' is 1–64 letters, digits, '_' or '-'",
            "response_format",
        ),
        ("'text.format' must be an object whose 'name' is 1–64 letters, digits, '_' or '-'", "text.format"),
    ),
    # a system prompt shifts every message by one, renamed in one pass: messages[1] is Anthropic's
    # messages[0], not then the system prompt that chat's messages[0] is; messages[10] is not
    # messages[1]
    (
        _messages(system="Be brief."),
        ("invalid_parameter", "'messages[1].content': messages[0] is fine, messages[10] too", "messages[1].content"),
        ("'messages[0].content': system is fine, messages[10] too", "messages[0].content"),
    ),
    (
        _messages(tools=[{"name": "f", "input_schema": WEATHER}], tool_choice={"type": "any"}),
        (
            "invalid_parameter",
            "tools[0].function.name must be 1–64 letters, digits, '_' or '-'",
            "tools[0].function.name",
        ),
        ("tools[0].name must be 1–64 letters, digits, '_' or '-'", "tools[0].name"),
    ),
    (
        _messages(tools=[{"name": "f", "input_schema": WEATHER}], tool_choice={"type": "any"}),
        (
            "response_format_unsupported",
            SCHEMA_REFUSAL.format("tools[0].function.parameters"),
            "tools[0].function.parameters",
        ),
        (SCHEMA_REFUSAL.format("tools[0].input_schema"), "tools[0].input_schema"),
    ),
    (
        _messages(),
        ("response_format_unsupported", "'response_format.json_schema.schema' must be an object", "response_format"),
        ("'output_config.format.schema' must be an object", "output_config.format"),
    ),
    # Needle's flat tools are the functions; extract's response_format keeps chat's name (it is
    # made of name and schema together)
    (
        needle.completion_chat({"query": "q", "tools": [FLAT]})[1],
        (
            "invalid_parameter",
            "tools[0].function.parameters is not a valid JSON schema: x",
            "tools[0].function.parameters",
        ),
        ("tools[0].parameters is not a valid JSON schema: x", "tools[0].parameters"),
    ),
    (
        needle.extraction_chat({"text": "t", "name": "n", "schema": WEATHER})[1],
        ("response_format_unsupported", SCHEMA_REFUSAL.format("response_format"), "response_format"),
        (SCHEMA_REFUSAL.format("response_format"), "response_format"),
    ),
    # a name inside another name, a path or a URL is not a mention
    (
        _responses(),
        ("invalid_parameter", "extra_messages, $.messages, /v1/messages and max_tokens_x stay", "stop"),
        ("extra_messages, $.messages, /v1/messages and max_tokens_x stay", "stop"),
    ),
]


@pytest.mark.parametrize("paths,refused,renamed", RENAMED)
def test_a_refusal_names_the_surface_fields(paths, refused, renamed):
    out = paths.renamed(GreenroomError(*refused))
    assert (out.code, out.message, out.param) == (refused[0], *renamed)


def test_an_error_naming_no_field_keeps_its_words():
    """An invalid document's error quotes the answer's keys, which are not the request's fields:
    left as it is (it has no param), before the answer or in its stream alike."""
    document = GreenroomError(
        "constrained_output_invalid",
        "the constrained output is complete but does not validate: 'max_tokens' is a required property",
    )
    assert _responses().renamed(document) is document


def test_renaming_raises_the_renamed_refusal():
    with pytest.raises(GreenroomError) as exc, _responses().renaming():
        raise GreenroomError("invalid_parameter", "'max_tokens' must be positive", "max_tokens")
    assert (exc.value.message, exc.value.param) == ("'max_output_tokens' must be positive", "max_output_tokens")
