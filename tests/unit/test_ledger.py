"""The field ledger (greenroom/http/core/ledger.py) as a function of a body and an engine's
capabilities: honoured, reported (with locations) or refused (typed, naming the field and
why). No server; tests/live/test_field_ledger.py drives the same rules through a live one."""

from __future__ import annotations

import attrs
import pytest

from greenroom.engines.capabilities import ENGINES, WHY_NOT, Capabilities
from greenroom.errors import GreenroomError
from greenroom.http.core import contracts, ledger
from greenroom.http.openai import openai_api, openai_params

ALL = ENGINES["transformers"]
NONE = Capabilities()
WHERE = "on chat completions"


def refusal(body: dict, caps=NONE, table=openai_api.CHAT) -> GreenroomError:
    with pytest.raises(GreenroomError) as e:
        ledger.check(table, body, caps, WHERE)
    return e.value


def test_used_fields_are_neither_reported_nor_refused():
    assert (
        ledger.check(openai_api.CHAT, {"model": "m", "messages": [], "temperature": 0.5, "max_tokens": 3}, NONE, WHERE)
        == []
    )


def test_unknown_and_unread_fields_are_reported_with_locations():
    body = {
        "model": "m",
        "foo": 1,
        "user": "u",
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {}}], "name": "n"}],
        "extra_messages": [[{"role": "user", "content": "x", "weight": 2}]],
    }
    assert ledger.check(openai_api.CHAT, body, ALL, WHERE) == [
        "foo",
        "user",
        "messages[0].name",
        "messages[0].content[0].cache_control",
        "extra_messages[0][0].weight",
        "stream_options",
    ]  # stream_options: only a stream reads them


@pytest.mark.parametrize(
    "field,value,capability",
    [
        ("seed", 1, "seed"),
        ("frequency_penalty", 0.5, "penalties"),
        ("response_format", {"type": "json_object"}, "response_format"),
        ("logprobs", True, "token_logprobs"),
        ("allowed_token_ids", [1], "scoring"),
        ("tools", [{"type": "function"}], "tools"),
        ("steering_intensity", 1, "steering"),
    ],
)
def test_a_field_the_engine_lacks_is_refused_naming_why(field, value, capability):
    e = refusal({field: value})
    assert e.code == "field_not_honoured" and e.param == field
    assert WHY_NOT[capability] in e.message and WHERE in e.message
    ledger.check(openai_api.CHAT, {field: value}, ALL, WHERE)  # the engine with it honours it


@pytest.mark.parametrize(
    "field,value",
    [
        ("seed", None),
        ("frequency_penalty", 0),
        ("frequency_penalty", 0.0),
        ("response_format", {"type": "text"}),
        ("logprobs", False),
        ("tools", []),
    ],
)
def test_a_no_change_value_is_never_refused(field, value):
    assert ledger.check(openai_api.CHAT, {field: value}, NONE, WHERE) == []


def test_no_change_is_by_type_too():
    assert refusal({"frequency_penalty": False}).param == "frequency_penalty"  # false is not 0


def test_required_or_named_tool_choice_needs_constrained_decoding():
    caps = Capabilities(tools=True)
    tools = [{"type": "function", "function": {"name": "f"}}]
    for choice in ("auto", "none"):
        ledger.check(openai_api.CHAT, {"tools": tools, "tool_choice": choice}, caps, WHERE)
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        assert refusal({"tools": tools, "tool_choice": choice}, caps).param == "tool_choice"
        ledger.check(openai_api.CHAT, {"tools": tools, "tool_choice": choice}, ALL, WHERE)


def test_embeddings_refuse_generation_fields():
    assert refusal({"seed": 1}, ALL, openai_params.EMBEDDING).param == "seed"
    assert ledger.check(openai_params.EMBEDDING, {"model": "m", "input": "x", "logprobs": False}, ALL, WHERE) == []


def test_strict_mode_refuses_what_would_be_reported():
    assert ledger.settle(["foo"], strict=False) == '"foo"'
    with pytest.raises(GreenroomError) as e:
        ledger.settle(["foo", "bar"], strict=True)
    assert e.value.code == "unused_fields_refused" and e.value.param == "foo"
    assert ledger.settle([], strict=True) is None


@pytest.mark.parametrize("value,strict", [(None, False), ("true", True), ("1", True), (" FALSE ", False), ("0", False)])
def test_the_strict_header(value, strict):
    assert ledger.strict_mode(value) is strict


def test_a_bad_strict_header_is_a_typed_400():
    with pytest.raises(GreenroomError) as e:
        ledger.strict_mode("yes")
    assert e.value.code == "invalid_parameter" and e.value.param == "X-miLLM-Strict"


def test_a_reported_field_that_asks_for_nothing_is_not_reported():
    """The `ollama` CLI sends `system`, `template` and `options` on every /api/show, empty."""
    from greenroom.http.ollama import ollama_api

    cli = {"model": "", "system": "", "template": "", "verbose": False, "options": None, "name": "m"}
    assert ledger.check(ollama_api.SHOW_REQUEST, cli, NONE, "on /api/show") == []
    assert ledger.check(ollama_api.SHOW_REQUEST, {**cli, "options": {}}, NONE, "on /api/show") == []
    sent = {**cli, "system": "Be brief.", "options": {"seed": 1}}
    assert ledger.check(ollama_api.SHOW_REQUEST, sent, NONE, "on /api/show") == ["system", "options"]
    assert ledger.check(openai_api.CHAT, {"user": None, "foo": None}, ALL, WHERE) == ["user", "foo"]  # no no-op listed


# (body, reported locations): the nested keys are read off the declarations (the message,
# content part and stream_options Shapes), each location as it was with the hand-kept key sets
NESTED = [
    ({"messages": [{"role": "user", "content": "x", "name": None}]}, ["messages[0].name"]),
    ({"messages": [{"role": "tool", "content": "4", "tool_call_id": "c"}]}, []),
    ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}, ["messages[0].tool_call_id"]),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "x": 1}]}]}, []),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, "b", {"x": 1}]}]},
        ["messages[0].content[2].x"],
    ),
    ({"messages": ["m", {"role": "user", "content": "x", "w": 1}]}, ["messages[1].w"]),
    (
        {"extra_messages": [[{"role": "user", "content": [{"type": "text", "text": "a", "c": 1}]}]]},
        ["extra_messages[0][0].content[0].c"],
    ),
    ({"stream": True, "stream_options": {"include_usage": True, "x": 1}}, ["stream_options.x"]),
    ({"stream": False, "stream_options": {"include_usage": True}}, ["stream_options"]),
    ({"stream_options": "x"}, []),
    ({"response_format": {"type": "json_object", "x": 1}}, ["response_format.x"]),
]


@pytest.mark.parametrize("body,locations", NESTED)
def test_nested_keys_are_reported_as_their_declarations_say(body, locations):
    assert ledger.check(openai_api.CHAT, body, ALL, WHERE) == locations


def test_a_key_added_to_a_nested_declaration_is_read_and_documented_there():
    message = openai_params.MESSAGE.field
    weighted = attrs.evolve(message, fields={**message.fields, "weight": contracts.Number(description="How much")})
    chat = attrs.evolve(
        openai_api.CHAT,
        fields={**openai_api.CHAT.fields, "messages": contracts.ListOf(items=weighted)},
    )
    body = {"messages": [{"role": "user", "content": "x", "weight": 2, "name": "n"}]}
    assert ledger.check(openai_api.CHAT, body, ALL, WHERE) == ["messages[0].weight", "messages[0].name"]
    assert ledger.check(chat, body, ALL, WHERE) == ["messages[0].name"]
    rendered = message.render({})
    assert rendered["description"].endswith(contracts.UNKNOWN)
    assert rendered["properties"]["tool_call_id"]["description"].endswith(
        'Read where role is "tool"; elsewhere reported in X-miLLM-Ignored-Fields'
    )
    assert rendered["properties"]["name"]["description"] == "Not read: reported in X-miLLM-Ignored-Fields"


def test_ollama_messages_report_what_their_declaration_does_not_read():
    """Ollama's message declares images (refused unless empty), not tool_call_id (not read)."""
    from greenroom.http.ollama import ollama_api

    body = {"messages": [{"role": "tool", "content": "4", "images": [], "tool_call_id": "c", "thinking": ""}]}
    assert ledger.check(ollama_api.CHAT_REQUEST, body, ALL, WHERE) == [
        "messages[0].tool_call_id",
        "messages[0].thinking",
    ]
