"""Request validation: every field is honoured, reported or refused (spec: "Request
validation", the field_not_honoured table, the no-change values, X-miLLM-Strict)."""

import http_sf
import httpx
import openai
import pytest
from conftest import MODEL

MSG = [{"role": "user", "content": "Hi"}]
CHAT = {"model": MODEL, "messages": MSG, "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
EMBEDDING = {"model": MODEL, "input": "Hi"}


def post(server, path, body, headers=None):
    return httpx.post(server.url + path, json=body, headers=headers or {}, timeout=60)


def refused(r, field):
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "field_not_honoured" and err["param"] == field, err
    assert field in err["message"]


def served(r):
    assert r.status_code == 200, r.text
    return r


# (field, a value that changes output) per endpoint, for the transformers engine
# scoring fields, response_format and tools are honoured on transformers: test_scoring.py, test_structured.py
CHAT_REFUSED = [  # profile and steering_intensity are honoured on transformers: test_intensity.py
    ("steering", {"0": 1}),
    ("dimensions", 8),
    ("logit_bias", {"5": 10}),
]
COMPLETION_REFUSED = [
    ("top_logprobs", 2),
    ("response_format", {"type": "json_object"}),
    ("profile", "honesty"),
    ("steering_intensity", 0.5),
    ("steering", {"0": 1}),
    ("dimensions", 8),
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("tool_choice", "auto"),
    ("logit_bias", {"5": 10}),
    ("n", 2),
    ("echo", True),
    ("best_of", 3),
    ("suffix", "end"),
]
EMBEDDING_REFUSED = [
    ("logprobs", True),
    ("allowed_token_ids", [1]),
    ("top_logprobs", 2),
    ("response_format", {"type": "json_object"}),
    ("seed", 3),
    ("n", 2),
    ("max_completion_tokens", 5),
    ("profile", "p"),
    ("steering_intensity", 1),
    ("steering", {"0": 1}),
    ("tools", [{"type": "function"}]),
    ("tool_choice", "auto"),
    ("logit_bias", {"5": 1}),
]


@pytest.mark.parametrize("field,value", CHAT_REFUSED)
def test_chat_refuses_what_it_cannot_honour(server, field, value):
    refused(post(server, "/v1/chat/completions", {**CHAT, field: value}), field)


@pytest.mark.parametrize("field,value", COMPLETION_REFUSED)
def test_completions_refuse_what_they_cannot_honour(server, field, value):
    refused(post(server, "/v1/completions", {**COMPLETION, field: value}), field)


@pytest.mark.parametrize("field,value", EMBEDDING_REFUSED)
def test_embeddings_refuse_what_they_cannot_honour(server, field, value):
    refused(post(server, "/v1/embeddings", {**EMBEDDING, field: value}), field)


def test_refused_even_in_a_streamed_request_and_before_anything_runs(server):
    before = server.actors()["cpu"]["counters"]["admitted"]
    refused(post(server, "/v1/chat/completions", {**CHAT, "stream": True, "logit_bias": {"1": 1}}), "logit_bias")
    assert server.actors()["cpu"]["counters"]["admitted"] == before


NO_CHANGE = {"n": 1, "logprobs": False, "response_format": {"type": "text"}, "tools": [], "logit_bias": {}}


@pytest.mark.parametrize("path,base", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
def test_no_change_values_and_null_are_accepted(server, path, base):
    r = served(
        post(
            server,
            path,
            {
                **base,
                **NO_CHANGE,
                "profile": None,
                "steering": None,
                "seed": None,
                "dimensions": None,
                "tool_choice": None,
            },
        )
    )
    assert "X-miLLM-Ignored-Fields" not in r.headers


def test_embeddings_accept_no_change_values(server):
    served(
        post(
            server,
            "/v1/embeddings",
            {
                **EMBEDDING,
                "n": 1,
                "logprobs": False,
                "tools": [],
                "logit_bias": {},
                "response_format": {"type": "text"},
                "dimensions": None,
            },
        )
    )


def test_max_completion_tokens_honoured_as_max_tokens(client):
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_completion_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def parse_sf_list(value: str) -> list[str]:
    """The header as an independent RFC 8941 parser (http-sf) reads it: a list of strings."""
    items = http_sf.parse(value.encode("ascii"), tltype="list")
    assert all(isinstance(v, str) and not params for v, params in items), value
    return [v for v, _ in items]


def test_unknown_and_unread_fields_are_reported_with_locations(server):
    body = {
        **CHAT,
        "foo": 1,
        "user": "me",
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "s", "name": "x"},
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {}}]},
        ],
    }
    r = served(post(server, "/v1/chat/completions", body))
    assert parse_sf_list(r.headers["X-miLLM-Ignored-Fields"]) == [
        "foo",
        "user",
        "messages[0].name",
        "messages[1].content[0].cache_control",
        "stream_options",
    ]
    clean = served(post(server, "/v1/chat/completions", CHAT))
    assert "X-miLLM-Ignored-Fields" not in clean.headers


def test_report_never_changes_the_body(server):
    a = served(post(server, "/v1/completions", {**COMPLETION, "temperature": 0, "max_tokens": 8})).json()
    b = served(post(server, "/v1/completions", {**COMPLETION, "temperature": 0, "max_tokens": 8, "zzz": [1]})).json()
    assert a["choices"] == b["choices"] and a["usage"] == b["usage"]


def test_header_is_capped_with_plus_n_more(server):
    body = {**CHAT, **{f"unused_field_number_{i:03d}": i for i in range(100)}}
    value = served(post(server, "/v1/chat/completions", body)).headers["X-miLLM-Ignored-Fields"]
    assert len(value.encode()) <= 1024
    items = parse_sf_list(value)
    assert items[-1] == f"+{100 - (len(items) - 1)} more" and items[0] == "unused_field_number_000"


def test_non_ascii_field_names_are_percent_encoded(server):
    value = served(post(server, "/v1/chat/completions", {**CHAT, "größe": 1, 'q"uote': 2})).headers[
        "X-miLLM-Ignored-Fields"
    ]
    assert value.isascii()
    assert parse_sf_list(value) == ["gr%C3%B6%C3%9Fe", 'q"uote']


def test_reported_on_streaming_responses_too(client):
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=MSG, max_tokens=3, stream=True, extra_body={"foo": True}
    ) as r:
        assert parse_sf_list(r.headers["X-miLLM-Ignored-Fields"]) == ["foo"]
        assert "data: [DONE]" in r.read().decode()


def test_embeddings_report_user(server):
    r = served(post(server, "/v1/embeddings", {**EMBEDDING, "user": "u1"}))
    assert parse_sf_list(r.headers["X-miLLM-Ignored-Fields"]) == ["user"]


@pytest.mark.parametrize("value", ["true", "1", "TRUE"])
def test_strict_refuses_every_unused_location(server, value):
    body = {**CHAT, "foo": 1, "user": "u", "messages": [{"role": "user", "content": "x", "name": "n"}]}
    r = post(server, "/v1/chat/completions", body, {"X-miLLM-Strict": value})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "unused_fields_refused"
    for location in ("foo", "user", "messages[0].name"):
        assert location in err["message"]


@pytest.mark.parametrize("value", ["false", "0"])
def test_strict_false_keeps_reporting(server, value):
    r = served(post(server, "/v1/chat/completions", {**CHAT, "foo": 1}, {"X-miLLM-Strict": value}))
    assert parse_sf_list(r.headers["X-miLLM-Ignored-Fields"]) == ["foo"]


def test_strict_with_nothing_unused_is_served(server):
    served(post(server, "/v1/chat/completions", CHAT, {"X-miLLM-Strict": "true"}))


def test_strict_other_value_is_refused_naming_the_header(server):
    r = post(server, "/v1/chat/completions", CHAT, {"X-miLLM-Strict": "yes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-miLLM-Strict"


def test_unused_fields_are_logged_by_location_never_value(server):
    served(post(server, "/v1/chat/completions", {**CHAT, "secret_field": "hunter2-value"}))
    log = server.log()
    assert "request_fields_unused" in log and "secret_field" in log
    assert "hunter2-value" not in log


def test_sdk_sees_refusals_as_bad_request(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=MSG, logit_bias={"3": 5})
    assert exc.value.code == "field_not_honoured"


def test_extra_messages_locations_are_reported(server):
    body = {
        **CHAT,
        "extra_messages": [[{"role": "user", "content": "a"}, {"role": "user", "content": "b", "weight": 2}]],
    }
    r = served(post(server, "/v1/chat/completions", body))
    assert parse_sf_list(r.headers["X-miLLM-Ignored-Fields"]) == ["extra_messages[0][1].weight"]
    assert [c["index"] for c in r.json()["choices"]] == [0, 1]
    assert r.headers.get("X-miLLM-Seed") is None


@pytest.mark.parametrize(
    "path,fmt,where",
    [
        (
            "/v1/chat/completions",
            {"type": "json_object", "schema": {"type": "object", "required": ["a"]}},
            ["response_format.schema"],
        ),
        ("/v1/chat/completions", {"type": "text", "strict": True}, ["response_format.strict"]),
        (
            "/v1/chat/completions",
            {"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "schemma": {}}, "extra": 1},
            ["response_format.json_schema.schemma", "response_format.extra"],
        ),
        ("/v1/responses", {"type": "json_object", "schema": {"type": "object"}}, ["text.format.schema"]),
        ("/v1/responses", {"type": "text", "verbosity": "low"}, ["text.format.verbosity"]),
    ],
)
def test_unread_keys_inside_a_response_format_are_reported_and_refused_when_strict(server, path, fmt, where):
    """Before: dropped silently, strict mode too ({"type": "json_object", "schema": …} answered any
    JSON object; {"type": "text", <extra key>} was a 400 about json_schema.name)."""
    if path == "/v1/chat/completions":
        body = {**CHAT, "max_tokens": 40, "response_format": fmt}
    else:
        body = {"model": MODEL, "input": "Hi", "max_output_tokens": 40, "store": False, "text": {"format": fmt}}
    r = served(post(server, path, body))
    assert parse_sf_list(r.headers["X-miLLM-Ignored-Fields"]) == where
    strict = post(server, path, body, {"X-miLLM-Strict": "true"})
    assert strict.status_code == 400 and strict.json()["error"]["code"] == "unused_fields_refused", strict.text
    assert strict.json()["error"]["param"] == where[0]


def test_a_text_format_with_a_key_of_its_own_through_the_sdk(client):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MSG, max_tokens=3, response_format={"type": "text", "text": {"verbosity": "low"}}
    )
    assert raw.parse().choices[0].message.content and raw.headers["X-miLLM-Ignored-Fields"] == '"response_format.text"'
