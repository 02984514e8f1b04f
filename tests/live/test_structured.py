"""Structured output (response_format) and tool calling, enforced by decoding, against
the random demo model through the openai SDK."""

import json
import math

import httpx
import jsonschema
import ollama
import pytest
from conftest import MODEL

MSG = [{"role": "user", "content": "Classify this joke."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["humor", "not_humor"]},
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 2, "maxItems": 3},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 12}]},
    },
    "required": ["label", "code", "tags", "score"],
    "additionalProperties": False,
    "$defs": {"tag": {"type": "string", "maxLength": 8}},
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "judge_v1", "strict": True, "schema": SCHEMA}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": 0, "maximum": 999},
                    "b": {"type": "integer", "minimum": 0, "maximum": 999},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def test_json_schema_validates_on_20_seeds(client):
    for seed in range(20):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MSG, max_tokens=200, seed=seed, response_format=FORMAT
        )
        r = raw.parse()
        assert raw.headers["X-miLLM-Constrained"] == 'json_schema;name="judge_v1"'
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_json_object(client):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MSG, max_tokens=300, seed=3, response_format={"type": "json_object"}
    )
    r = raw.parse()
    assert raw.headers["X-miLLM-Constrained"] == "json_object"
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: reported as such, never as a complete document
        assert r.choices[0].finish_reason == "length"


def held(text: str):
    """`text` parsed, every number checked to be one a client holds (the test's own rule:
    a finite double, an integer JavaScript holds exactly)."""

    def number(s):
        assert math.isfinite(float(s)), s
        return float(s)

    def integer(s):
        assert abs(int(s)) <= 2**53 - 1, s
        return int(s)

    return json.loads(text, parse_float=number, parse_int=integer)


NUMBER = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"], "additionalProperties": False}


@pytest.mark.parametrize(
    "fmt",
    [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "n", "schema": NUMBER}}],
    ids=["json_object", "number"],
)
def test_constrained_numbers_parse_to_values_clients_hold_on_16_seeds(client, fmt):
    # before the numbers were bounded: 500 constrained_output_invalid on 3 (json_object) and
    # 11 ({x: number}) of 15 seeds, for numbers such as 2501e6850
    finished = 0
    for seed in range(16):
        r = client.chat.completions.create(
            model=MODEL, messages=MSG, max_tokens=150, seed=seed, temperature=1, response_format=fmt
        )
        if r.choices[0].finish_reason == "stop":
            finished += 1
            doc = held(r.choices[0].message.content)
            assert isinstance(doc, dict)
            if fmt["type"] == "json_schema":
                jsonschema.validate(doc, NUMBER)
    assert finished >= (6 if fmt["type"] == "json_object" else 16)


def test_ollama_format_json_holds_finite_numbers(server):
    # before: a 500 constrained_output_invalid for seeds 4 and 11 on /api/generate, 4 on /api/chat
    oc = ollama.Client(host=server.url, timeout=120)
    for seed in range(16):
        r = oc.generate(model=MODEL, prompt="JSON", format="json", options={"seed": seed, "num_predict": 150})
        if r.done_reason == "stop":
            assert isinstance(held(r.response), dict)
    for seed in range(6):
        r = oc.chat(
            model=MODEL,
            messages=[{"role": "user", "content": "JSON"}],
            format="json",
            options={"seed": seed, "num_predict": 150},
        )
        if r.done_reason == "stop":
            assert isinstance(held(r.message.content), dict)


def test_length_means_cut(client):
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=5, seed=1, response_format=FORMAT)
    assert r.choices[0].finish_reason == "length"


def test_n_and_extra_messages_are_constrained_per_choice(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=MSG,
        max_tokens=200,
        seed=2,
        n=2,
        response_format=FORMAT,
        extra_body={"extra_messages": [[{"role": "user", "content": "Another"}]]},
    )
    assert len(r.choices) == 4
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), SCHEMA)


def refused(server, body, status=400, code="response_format_unsupported", param="response_format", path=None):
    r = httpx.post(server.url + (path or "/v1/chat/completions"), json=body, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["param"] == param, err
    return err["message"]


BASE = {"model": MODEL, "messages": MSG, "max_tokens": 50}


@pytest.mark.parametrize(
    "keyword,value,pointer",
    [
        ("uniqueItems", True, "/properties/tags/uniqueItems"),
        ("format", "binary", "/properties/code/format"),
        ("multipleOf", 2, "/properties/score/multipleOf"),
        ("not", {"type": "null"}, "/properties/code/not"),
    ],
)
def test_unsupported_keyword_is_refused_with_its_pointer(server, keyword, value, pointer):
    schema = json.loads(json.dumps(SCHEMA))
    target = pointer.split("/")[2]
    schema["properties"][target][keyword] = value
    message = refused(
        server, {**BASE, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    )
    assert keyword in message and pointer in message


def test_an_integer_past_64_bits_anywhere_in_a_schema_is_refused_even_on_a_load(server):
    """The schema travels to the engine as it came (msgpack: 64-bit integers); an Ollama request
    with no prompt only loads, but its format is checked all the same (the fuzzer's case)."""
    schema = {"type": "array", "items": {"maximum": -(2**63) - 1}, "default": [2**64]}
    message = refused(
        server, {**BASE, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    )
    assert "/items/maximum: an integer past 64 bits" in message and "/default/0" in message
    r = httpx.post(server.url + "/api/generate", json={"model": MODEL, "format": schema}, timeout=60)
    assert r.status_code == 400 and r.json()["code"] == "response_format_unsupported", r.text


def test_every_unsupported_keyword_is_named_at_once(server):
    schema = {
        "type": "object",
        "allOf": [],
        "properties": {"a": {"type": "string", "format": "uri-reference"}},
        "$anchor": "root",
    }
    message = refused(
        server, {**BASE, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    )
    for part in ("/allOf", "/properties/a/format", "/$anchor"):
        assert part in message


def test_limits(server):
    deep = {"type": "string"}
    for _ in range(33):
        deep = {"type": "array", "items": deep}
    refused(server, {**BASE, "response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": deep}}})
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(257)}}
    refused(server, {**BASE, "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": wide}}})
    big = {"type": "object", "properties": {"a": {"enum": ["x" * 1000] * 70}}}
    refused(server, {**BASE, "response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": big}}})


@pytest.mark.parametrize(
    "extra,path,code,param",
    [
        ({"stop": ["}"]}, None, "response_format_unsupported", "response_format"),
        ({"tools": TOOLS, "tool_choice": "required"}, None, "response_format_unsupported", "response_format"),
        ({"logprobs": True, "max_tokens": 1}, None, "field_not_honoured", "response_format"),
        ({"prompt": "x"}, "/v1/completions", "field_not_honoured", "response_format"),
        ({"input": "x"}, "/v1/embeddings", "field_not_honoured", "response_format"),
    ],
)
def test_combinations_refused_naming_response_format(server, extra, path, code, param):
    body = {**BASE, "response_format": FORMAT, **extra}
    refused(server, body, code=code, param=param, path=path)


def check_calls(calls, only=None):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in PARAMS and (only is None or call.function.name == only)
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


@pytest.mark.parametrize(
    "choice,only", [("required", None), ({"type": "function", "function": {"name": "add"}}, "add")]
)
def test_tool_choice_enforced_on_20_seeds_streamed_and_not(client, choice, only):
    for seed in range(20):
        kw = dict(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Lagos?"}],
            tools=TOOLS,
            tool_choice=choice,
            max_tokens=200,
            seed=seed,
        )
        r = client.chat.completions.create(**kw)
        # the random model often goes on to another parallel call: max_tokens may cut that one,
        # which is dropped; every call returned is complete and valid either way
        assert r.choices[0].finish_reason in ("tool_calls", "length"), r.choices[0].message
        check_calls(r.choices[0].message.tool_calls, only)
        calls: dict[int, dict] = {}
        finish = None
        for chunk in client.chat.completions.create(stream=True, **kw):
            delta = chunk.choices[0].delta
            for tc in delta.tool_calls or []:
                if tc.id:  # the name and id come first, arguments after
                    assert tc.index not in calls and tc.function.name and tc.function.arguments == ""
                    calls[tc.index] = {"name": tc.function.name, "arguments": ""}
                else:
                    calls[tc.index]["arguments"] += tc.function.arguments
            finish = chunk.choices[0].finish_reason or finish
        assert finish == r.choices[0].finish_reason
        assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
            (t.function.name, t.function.arguments) for t in r.choices[0].message.tool_calls
        ]


def test_parallel_tool_calls_false_gives_one_call(client):
    for seed in range(5):
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=120,
            seed=seed,
        )
        assert len(r.choices[0].message.tool_calls) == 1 and r.choices[0].finish_reason == "tool_calls"


def test_deprecated_functions_and_function_call(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=120,
        seed=4,
        functions=[t["function"] for t in TOOLS],
        function_call={"name": "add"},
    )
    check_calls(r.choices[0].message.tool_calls, "add")


def test_tool_results_render_back_through_the_template(client):
    messages = [
        {"role": "user", "content": "Weather in Lagos?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Lagos"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "31 C, sunny"},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=8, seed=1)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_auto_and_none(client):
    auto = client.chat.completions.create(model=MODEL, messages=MSG, tools=TOOLS, max_tokens=10, seed=1)
    none = client.chat.completions.create(
        model=MODEL, messages=MSG, tools=TOOLS, tool_choice="none", max_tokens=10, seed=1
    )
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "text"}}}]},
            "tools[0].function.parameters",
        ),  # auto: calls are validated against it, so it must be a schema
        (
            {
                "tools": TOOLS
                + [
                    {
                        "type": "function",
                        "function": {
                            "name": "x",
                            "parameters": {"type": "object", "properties": {"a": {"type": "string", "format": "iri"}}},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools[2].function.parameters",
        ),
    ],
)
def test_bad_tool_requests(server, extra, param):
    body = {**BASE, "tools": TOOLS, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_tool_choice_without_tools(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={**BASE, "tool_choice": "required"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


@pytest.mark.parametrize("name", ["a\nb", "é", "a b", "", "x" * 65])
def test_schema_names_are_openai_names(server, name):
    refused(server, {**BASE, "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": {}}}})


def test_chat_scoring_renders_tools_and_reports_tool_choice(server):
    body = {"model": MODEL, "messages": MSG, "max_tokens": 1, "logprobs": True, "tools": TOOLS, "tool_choice": "auto"}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["X-miLLM-Ignored-Fields"] == '"tool_choice"'
    plain = httpx.post(
        server.url + "/v1/chat/completions", json={**body, "tools": None, "tool_choice": None}, timeout=60
    ).json()
    assert r.json()["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]  # the tools were rendered
    bad = httpx.post(
        server.url + "/v1/chat/completions",
        timeout=60,
        json={**body, "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
    )
    assert bad.status_code == 400


def test_scoring_accepts_the_no_change_response_format(server):
    body = {"model": MODEL, "messages": MSG, "max_tokens": 1, "logprobs": True, "response_format": {"type": "text"}}
    assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200


SCALE = [
    {
        "type": "function",
        "function": {
            "name": "scale",
            "parameters": {
                "type": "object",
                "properties": {"factor": {"type": "number"}, "times": {"type": "integer"}},
                "required": ["factor", "times"],
                "additionalProperties": False,
            },
        },
    }
]


def test_tool_call_arguments_hold_finite_numbers_on_15_seeds(client):
    # before: every seed answered 200 with arguments such as {"factor": 2501e6850…}, inf in clients
    for seed in range(15):
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Scale it."}],
            tools=SCALE,
            tool_choice="required",
            max_tokens=120,
            seed=seed,
        )
        for call in r.choices[0].message.tool_calls or []:
            jsonschema.validate(held(call.function.arguments), SCALE[0]["function"]["parameters"])


def test_a_call_cut_by_max_tokens_leaves_no_markup_streamed_or_not(client):
    # before: content "<tool", "<tool_c", "<tool_call>\n{\"name\": \"" non-streamed, "" streamed
    for max_tokens in range(1, 16):
        kw = dict(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            tools=TOOLS,
            tool_choice="required",
            max_tokens=max_tokens,
            seed=1,
        )
        r = client.chat.completions.create(**kw)
        streamed = "".join(
            c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw) if c.choices
        )
        assert r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls
        assert r.choices[0].message.content == streamed == "", max_tokens


REPEATING = [  # the demo model calls these again and again: nothing but their arguments can differ
    [{"type": "function", "function": {"name": "now"}}],
    [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "parameters": {
                    "type": "object",
                    "properties": {"unit": {"enum": ["c", "f"]}},
                    "required": ["unit"],
                    "additionalProperties": False,
                },
            },
        }
    ],
]


@pytest.mark.parametrize("tools", REPEATING, ids=["no_parameters", "enum"])
def test_required_parallel_calls_end_at_a_repeat(client, tools):
    # before: 7 and 8 of 8 seeds repeated one call until max_tokens (9 identical calls, "length")
    lengths = []
    for seed in range(6):
        kw = dict(
            model=MODEL,
            messages=[{"role": "user", "content": "Now?"}],
            tools=tools,
            tool_choice="required",
            max_tokens=300,
            seed=seed,
        )
        r = client.chat.completions.create(**kw)
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls]
        assert r.choices[0].finish_reason == "tool_calls", calls
        assert all(calls.count(c) == 1 for c in calls), calls
        lengths.append(len(calls))
        if seed < 2:  # the stream ends at the same call
            chunks = list(client.chat.completions.create(stream=True, **kw))
            assert chunks[-1].choices[0].finish_reason == "tool_calls"
            assert sum(1 for c in chunks for tc in c.choices[0].delta.tool_calls or [] if tc.id) == len(calls)
    if tools[0]["function"].get("parameters"):
        assert max(lengths) == 2  # parallel calls to the same function with other arguments still come


def test_cut_short_call_leaves_no_tag_text(client):
    for seed in range(8):
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            tools=TOOLS,
            tool_choice="required",
            max_tokens=48,
            seed=seed,
        )
        assert "<tool" not in (r.choices[0].message.content or "")
