"""Tool-call parsing, whole and streamed (pure text: greenroom/engines/tool_calls.py)."""

import pytest

from greenroom.engines.tool_calls import ToolCall, ToolCallStream, parse

HERMES = ('Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lagos"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')


def test_hermes_form_with_parallel_calls_keeps_argument_text():
    content, calls = parse(HERMES)
    assert content == "Let me look."
    assert calls == [ToolCall("get_weather", '{"city": "Lagos"}'), ToolCall("add", '{"a": 1, "b": 2}')]


def test_llama3_json_form():
    assert parse(' {"name": "add", "parameters": {"a": 1,  "b": 2}} ') == ("", [ToolCall("add", '{"a": 1,  "b": 2}')])
    content, calls = parse('[{"name": "f", "parameters": {}}, {"name": "g", "arguments": {"x": "y"}}]')
    assert [c.name for c in calls] == ["f", "g"] and content == ""


@pytest.mark.parametrize("text", ["plain text", '{"not": "a call"}', "<tool_call>not json</tool_call>", "[1, 2]"])
def test_non_calls_are_content(text):
    assert parse(text) == (text, [])


def test_call_cut_short_is_dropped():
    content, calls = parse(HERMES[: HERMES.rindex("</tool_call>") - 3])
    assert calls == [ToolCall("get_weather", '{"city": "Lagos"}')] and content == "Let me look."


@pytest.mark.parametrize("step", [1, 2, 5, 17, 1000])
def test_stream_gives_the_same_calls_in_any_pieces(step):
    stream, events = ToolCallStream(), []
    for i in range(0, len(HERMES), step):
        events += stream.feed(HERMES[i:i + step])
    events += stream.finish()
    content = "".join(e[1] for e in events if e[0] == "content")
    assert content.strip() == "Let me look."
    assert [e for e in events if e[0] != "content"] == [
        ("call", 0, "get_weather"), ("arguments", 0, '{"city": "Lagos"}'), ("call", 1, "add"),
        ("arguments", 1, '{"a": 1, "b": 2}')]
    assert stream.calls == parse(HERMES)[1]


def test_stream_drops_an_unclosed_call_and_releases_tag_prefixes_as_text():
    stream = ToolCallStream()
    assert stream.feed("a <tool") == [("content", "a ")]
    assert stream.feed("box") == [("content", "<toolbox")]
    assert stream.feed('<tool_call>{"name": "f", "argu') == []
    assert stream.finish() == []
