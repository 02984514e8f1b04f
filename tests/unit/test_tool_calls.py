"""Tool-call parsing, whole and streamed, and the decoder's guard (pure text:
greenroom/engines/text/tool_calls.py)."""

import json

import pytest

from greenroom.engines.text.tool_calls import MAX_SAFE_INTEGER, CallGuard, ToolCall, ToolCallStream, load_json, parse

HERMES = (
    'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lagos"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
)


def test_hermes_form_with_parallel_calls_keeps_argument_text():
    content, calls = parse(HERMES)
    assert content == "Let me look."
    assert calls == [ToolCall("get_weather", '{"city": "Lagos"}'), ToolCall("add", '{"a": 1, "b": 2}')]


def test_llama3_json_form():
    assert parse(' {"name": "add", "parameters": {"a": 1,  "b": 2}} ') == ("", [ToolCall("add", '{"a": 1,  "b": 2}')])
    content, calls = parse('[{"name": "f", "parameters": {}}, {"name": "g", "arguments": {"x": "y"}}]')
    assert [c.name for c in calls] == ["f", "g"] and content == ""


@pytest.mark.parametrize("text", ["plain text", '{"not": "a call"}', "[1, 2]", "  spaced  ", "a < b"])
def test_non_calls_are_content(text):
    assert parse(text) == (text, [])


def test_a_block_that_is_not_a_call_is_neither_call_nor_content():
    assert parse("Hi.\n<tool_call>not json</tool_call>\n") == ("Hi.", [])


def test_call_cut_short_is_dropped():
    content, calls = parse(HERMES[: HERMES.rindex("</tool_call>") - 3])
    assert calls == [ToolCall("get_weather", '{"city": "Lagos"}')] and content == "Let me look."


@pytest.mark.parametrize("step", [1, 2, 5, 17, 1000])
def test_stream_gives_the_same_calls_in_any_pieces(step):
    stream, events = ToolCallStream(), []
    for i in range(0, len(HERMES), step):
        events += stream.feed(HERMES[i : i + step])
    events += stream.finish()
    content = "".join(e[1] for e in events if e[0] == "content")
    assert content.strip() == "Let me look."
    assert [e for e in events if e[0] != "content"] == [
        ("call", 0, "get_weather"),
        ("arguments", 0, '{"city": "Lagos"}'),
        ("call", 1, "add"),
        ("arguments", 1, '{"a": 1, "b": 2}'),
    ]
    assert stream.calls == parse(HERMES)[1]


def test_stream_drops_an_unclosed_call_and_releases_tag_prefixes_as_text():
    stream = ToolCallStream()
    assert stream.feed("a <tool") == [("content", "a")]  # the space waits: a call may follow it
    assert stream.feed("box") == [("content", " <toolbox")]
    assert stream.feed('<tool_call>{"name": "f", "argu') == []
    assert stream.finish() == []


def content_of(events) -> str:
    return "".join(e[1] for e in events if e[0] == "content")


def test_an_answer_cut_anywhere_gives_the_same_content_whole_and_streamed_and_never_markup():
    for cut in range(len(HERMES) + 1):  # max_tokens may cut it after any character
        text = HERMES[:cut]
        content, calls = parse(text)
        stream = ToolCallStream()
        events = [e for ch in text for e in stream.feed(ch)] + stream.finish()
        assert content_of(events) == content and stream.calls == calls, cut
        assert "Let me look.".startswith(content), (cut, content)
        assert calls == parse(HERMES)[1][: len(calls)]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
                "required": ["a"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "now"}},
]


def block(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


@pytest.mark.parametrize(
    "arguments,name",
    [
        ('{"a": 1, "b": 1e999}', "add"),  # parses to inf
        ('{"a": 12345678901234567}', "add"),  # past 2**53: JSON.parse rounds it
        ('{"a": NaN}', "add"),
        ('{"a": 1.5}', "add"),  # not an integer
        ('{"b": 1}', "add"),  # a required argument missing
        ('{"a": 1, "c": 2}', "add"),  # additionalProperties false
        ('{"x": 1}', "now"),  # a function without parameters takes {}
        ("{}", "nope"),  # not one of the tools
    ],
)
def test_a_call_that_does_not_validate_is_dropped_whole_and_streamed(arguments, name):
    good = block("add", '{"a": 2}')
    text = f"Sure.\n{block(name, arguments)}\n{good}"
    assert parse(text, TOOLS) == ("Sure.", [ToolCall("add", '{"a": 2}')])
    stream = ToolCallStream(TOOLS)
    events = [e for i in range(0, len(text), 7) for e in stream.feed(text[i : i + 7])] + stream.finish()
    assert content_of(events) == "Sure." and stream.calls == [ToolCall("add", '{"a": 2}')]


def test_the_answer_ends_at_a_call_that_repeats_an_earlier_one():
    a, b = block("add", '{"a": 1}'), block("add", '{"a": 2}')
    text = "\n".join([a, b, block("add", '{"a":1}'), block("now", "{}")]) + "\nmore text"
    content, calls = parse(text, TOOLS)  # the same call written with other spacing is a repeat
    assert content == "" and calls == [ToolCall("add", '{"a": 1}'), ToolCall("add", '{"a": 2}')]
    json_form = '[{"name": "now", "parameters": {}}, {"name": "now", "parameters": {}}]'
    assert parse(json_form, TOOLS) == ("", [ToolCall("now", "{}")])


def test_the_json_form_streamed_gives_what_parse_gives():
    for text in [
        '{"name": "add", "parameters": {"a": 1}}',
        '{"name": "add", "parameters": {"a": 1e999}}',
        ' {"answer": 42}',
        '[1, 2] and <tool_call>{"name": "now", "arguments": {}}</tool_call>',
    ]:
        stream = ToolCallStream(TOOLS)
        events = [e for ch in text for e in stream.feed(ch)] + stream.finish()
        assert (content_of(events), stream.calls) == parse(text, TOOLS), text
    assert parse('{"name": "add", "parameters": {"a": 1e999}}', TOOLS)[1] == []  # content: not a valid call


def test_load_json_holds_what_every_client_holds():
    assert load_json('{"a": [1.5, -0.0, 9007199254740991, 1e308]}') == {"a": [1.5, -0.0, MAX_SAFE_INTEGER, 1e308]}
    for text in ["1e999", "-1e400", "NaN", "[Infinity]", "9007199254740992", "-" + "9" * 5000]:
        with pytest.raises(ValueError):
            load_json(text)


def test_the_guard_holds_a_call_until_it_is_known_not_to_repeat():
    functions = {t["function"]["name"]: t["function"].get("parameters") for t in TOOLS}
    guard = CallGuard(functions)
    first, again = block("add", '{"a": 1}'), block("add", '{"a": 1}')
    released = [guard.feed(ch) for ch in first + "\n" + again]
    assert "".join(released) == first + "\n" and guard.ended  # the repeat never released
    assert all(r in ("", first) for r in released[: len(first)])  # nothing of a call before it closes
    guard = CallGuard(functions)
    assert guard.feed(block("add", '{"a": "x"}')) == "" and "add" in guard.invalid and not guard.ended
    guard = CallGuard(functions)
    assert guard.feed('<tool_call>\n{"name": "ad') == "" and guard.flush() == '<tool_call>\n{"name": "ad'
    assert json.loads(parse(first, TOOLS)[1][0].arguments) == {"a": 1}


# strings holding what a block's end would be read from were its end the first brace or tag
ADVERSARIAL = [
    "def my_function(){return 10}}}",
    'print("</tool_call>")',
    'say \\"hi\\"}} "',
    "x\n}\n</tool_call>\n<tool_call>",
    "é😀 {[ \\",
    "Lagos}}</tool_call>",
]
PYTHON = [
    {
        "type": "function",
        "function": {"name": "python", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}},
    }
]


@pytest.mark.parametrize("code", ADVERSARIAL)
def test_a_block_ends_where_its_json_ends(code):
    # before: the block was cut at the first `</tool_call>`: the call dropped (auto), its markup
    # leaked into the content, and the guard failed the constrained answer ("not a call object")
    call = block("python", json.dumps({"code": code}, ensure_ascii=False))
    text = f"Sure.\n{call}\nDone."
    content, calls = parse(text, PYTHON)
    assert content == "Sure.\nDone." and [json.loads(c.arguments) for c in calls] == [{"code": code}]
    for step in (1, 3):  # streamed, in pieces that split escapes, tags and surrogate-free unicode
        stream, events = ToolCallStream(PYTHON), []
        for i in range(0, len(text), step):
            events += stream.feed(text[i : i + step])
        events += stream.finish()
        assert "".join(e[1] for e in events if e[0] == "content") == "Sure.\nDone." and stream.calls == calls
    guard = CallGuard({"python": PYTHON[0]["function"]["parameters"]})
    assert "".join(guard.feed(ch) for ch in call) == call and guard.invalid is None


def test_a_block_that_is_not_json_ends_at_the_tag_after_it_stops_being_json():
    text = 'A<tool_call>not json</tool_call>B<tool_call>{"name": <x></tool_call>C<tool_call></tool_call>D'
    assert parse(text, PYTHON) == ("ABCD", [])
    after = block("python", '{"code": "x"}').replace("}\n</tool_call>", "} junk</tool_call>")
    assert parse(after + "E", PYTHON) == ("E", [])  # text after the JSON: no call either


def test_the_arguments_are_the_members_own_text():
    assert parse(block("f", '{"code": "\\"arguments\\": {}"}'))[1] == [ToolCall("f", '{"code": "\\"arguments\\": {}"}')]
    both = '<tool_call>{"name": "f", "parameters": {"a": 1}, "arguments": {"b":  2}}</tool_call>'
    assert parse(both)[1] == [ToolCall("f", '{"b":  2}')]  # the member the call is read from
