"""OpenAI's Responses API (/v1/responses, http/openai/responses_api.py) with the openai SDK, on a
transformers and a GGUF model: created, streamed (the typed events in order), parsed into a
pydantic model, a function-tool round trip, stored and continued with previous_response_id
across a restart; the steering of one request identical through chat completions, responses
and messages; typed refusals. One server for the module (restarted by the last test)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import sqlite3

import anthropic
import httpx
import openai
import pydantic
import pytest
from conftest import MODEL, Server
from fake_hub import server_cache

from greenroom.store.responses import ResponseStore

GGUF = "greenroom-demo-gguf:Q8_0"
CONFIG = f"""
npu_actors = []
[[models]]
id = "{MODEL}"
source = "demo:tiny"
sae = "demo:tiny"
[[models]]
id = "{GGUF}"
source = "demo-gguf:Q8_0"
engine = "llama.cpp"
"""
SAE_ID = "sae_demo_tiny_l1"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
GREEDY = {"max_output_tokens": 8, "temperature": 0}


class Served:
    """The module's server, which the restart test replaces."""

    def __init__(self, tmp, cache):
        self.tmp, self.cache = tmp, cache
        self.srv = Server(tmp, cache, CONFIG)

    def restart(self) -> None:
        self.srv.stop()
        self.srv = Server(self.tmp, self.cache, CONFIG)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.srv.url + "/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def served(tmp_path_factory, model_cache):
    tmp = tmp_path_factory.mktemp("responses")
    served = Served(tmp, server_cache(tmp, model_cache))
    yield served
    served.srv.stop()


@pytest.mark.parametrize("model", [MODEL, GGUF])
def test_created_streamed_and_stored(served, model):
    client = served.client()
    created = client.responses.create(model=model, input="Hello there", **GREEDY)
    assert created.status == "incomplete" and created.incomplete_details.reason == "max_output_tokens"
    assert created.output_text and created.usage.output_tokens == 8 and created.usage.input_tokens > 0
    assert client.responses.retrieve(created.id).output_text == created.output_text
    with client.responses.stream(model=model, input="Hello there", **GREEDY) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-4].text == created.output_text == "".join(e.delta for e in events if hasattr(e, "delta"))
    assert events[-1].response.usage.output_tokens == 8
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    unstored = client.responses.create(model=model, input="Hello", store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    sunny: bool


@pytest.mark.parametrize("model", [MODEL, GGUF])
def test_parse_into_a_pydantic_model(served, model):
    parsed = served.client().responses.parse(
        model=model, input="A city?", text_format=City, max_output_tokens=64, temperature=0
    )
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, City)


@pytest.mark.parametrize("model", [MODEL, GGUF])
def test_a_function_tool_round_trip(served, model):
    client = served.client()
    ask = dict(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_output_tokens=64, temperature=0)
    called = client.responses.create(model=model, input="Weather in Paris?", **ask)
    (call,) = called.output
    assert called.status == "completed" and call.type == "function_call" and call.name == "get_weather"
    assert pydantic.TypeAdapter(dict).validate_json(call.arguments).keys() == {"city"}
    answered = client.responses.create(
        model=model,
        previous_response_id=called.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        **GREEDY,
    )
    # the same turn sent whole, the call as the SDK returned it
    whole = client.responses.with_raw_response.create(
        model=model,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        **GREEDY,
    )
    assert whole.parse().output_text == answered.output_text
    assert "X-miLLM-Ignored-Fields" not in whole.headers  # the call_id pairs the result with its call
    with client.responses.stream(model=model, input="Weather in Paris?", **ask) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    fragments = kinds.count("response.function_call_arguments.delta")
    assert fragments and kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * fragments,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.output[0].arguments == call.arguments


def test_steering_is_the_same_through_every_surface(served):
    """Live strengths, then a request's own steering_intensity: the same greedy text through
    chat completions, responses and messages, and the same echoed λ."""
    url = served.srv.url
    chat = served.client()
    messages = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)

    def answers(extra: dict) -> set[tuple[str, str | None]]:
        prompt = "Hello there"
        out = [
            chat.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=8,
                temperature=0,
                extra_body=extra,
            ),
            chat.responses.with_raw_response.create(model=MODEL, input=prompt, store=False, extra_body=extra, **GREEDY),
            messages.messages.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=8,
                extra_body={"temperature": 0, **extra},
            ),
        ]
        texts = [
            out[0].parse().choices[0].message.content,
            out[1].parse().output_text,
            out[2].parse().content[0].text,
        ]
        return {(text, raw.headers.get("X-miLLM-Steering-Intensity")) for text, raw in zip(texts, out)}

    (unsteered,) = answers({})
    r = httpx.put(url + "/api/steering", json={"model": MODEL, "strengths": {SAE_ID: {"5": 150}}}, timeout=30)
    assert r.status_code == 200 and r.json()["live"], r.text
    try:
        (steered,) = answers({})
        (dialled,) = answers({"steering_intensity": 0.5})
    finally:
        httpx.put(url + "/api/steering", json={"model": MODEL, "strengths": {}}, timeout=30)
    assert len({unsteered[0], steered[0], dialled[0]}) == 3
    assert dialled[1] == "0.5"


def test_sae_activations_ride_on_both_answers(served):
    """return_sae_activations, as chat completions read it: on the Response, and on the Message
    (streamed: on message_delta)."""
    read = {"return_sae_activations": {"top_k": 2}}
    response = served.client().responses.create(model=MODEL, input="Hi", store=False, extra_body=read, **GREEDY)
    assert response.millm["sae_activations"]["sae_id"] == SAE_ID
    messages = anthropic.Anthropic(base_url=served.srv.url, api_key="x", max_retries=0)
    message = messages.messages.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}], extra_body=read
    )
    assert message.millm["sae_activations"]["sae_id"] == SAE_ID
    with messages.messages.stream(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}], extra_body=read
    ) as stream:
        delta = next(e for e in stream if e.type == "message_delta")
    assert delta.millm["sae_activations"]["positions"]


@pytest.mark.parametrize("model", [MODEL, GGUF])
def test_both_surfaces_on_pooled_clients_while_other_streams_run(served, model):
    """One pooled client per SDK, 6 requests each, while chat streams decode beside them: the
    greedy answers are the ones a quiet server gives."""
    client = served.client()
    messages = anthropic.Anthropic(base_url=served.srv.url, api_key="x", max_retries=0, timeout=60)
    prompts = [f"Story {i}" for i in range(6)]

    def response(prompt: str) -> str:
        return client.responses.create(model=model, input=prompt, **GREEDY).output_text

    def message(prompt: str) -> str:
        answer = messages.messages.create(
            model=model, max_tokens=8, messages=[{"role": "user", "content": prompt}], extra_body={"temperature": 0}
        )
        return answer.content[0].text if answer.content else ""

    quiet = [(response(p), message(p)) for p in prompts]

    def stream(i: int) -> int:
        chunks = served.client().chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Talk {i}"}], max_tokens=64, stream=True
        )
        return sum(1 for _ in chunks)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        beside = [pool.submit(stream, i) for i in range(3)]
        busy = [(response(p), message(p)) for p in prompts]
        assert all(f.result() > 1 for f in beside)
    assert busy == quiet


@pytest.mark.parametrize(
    "body,code,param",
    [
        ({"reasoning": {"effort": "high"}}, "field_not_honoured", "reasoning"),
        ({"background": True}, "field_not_honoured", "background"),
        ({"tools": [{"type": "web_search"}]}, "field_not_honoured", "tools[0]"),
        ({"max_output_tokens": 0}, "invalid_parameter", "max_output_tokens"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "invalid_parameter", "input[0].type"),
        ({"input": [{"type": "input_image"}]}, "invalid_parameter", "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "field_not_honoured",
            "input[0].content[0]",
        ),
        ({"input": None}, "missing_parameter", "input"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "not": {}}}}},
            "response_format_unsupported",
            "text.format",
        ),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "invalid_parameter", "tool_choice"),
        ({"metadata": {"k": 1}}, "invalid_parameter", "metadata"),
        ({"max_output_tokens": 40000}, "context_length_exceeded", "max_output_tokens"),
    ],
)
def test_refusals_are_typed_400s(served, body, code, param):
    r = httpx.post(served.srv.url + "/v1/responses", json={"model": MODEL, "input": "x", **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["param"] == param, r.text


def test_unknown_previous_response_is_404(served):
    with pytest.raises(openai.NotFoundError) as exc:
        served.client().responses.create(model=MODEL, input="x", previous_response_id="resp_nope", **GREEDY)
    assert exc.value.body["code"] == "response_not_found"


def test_input_items_are_listed_and_paged_as_openai_lists_them(served):
    """The SDK's responses.input_items.list: the response's own input (not the turns
    previous_response_id brought), newest first by default, paged by after and limit (the SDK
    follows has_more), include[] taken; bad values 400 naming them, an unknown response 404."""
    client = served.client()
    first = client.responses.create(model=MODEL, input="Hello there", **GREEDY)
    sent = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}], "id": "msg_mine"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "snow"},
        {"role": "assistant", "content": "It snows."},
    ]
    second = client.responses.create(model=MODEL, input=sent, previous_response_id=first.id, **GREEDY)
    listed = list(client.responses.input_items.list(second.id, limit=2, order="asc"))  # three pages
    assert [(i.type, getattr(i, "role", None)) for i in listed] == [
        ("message", "developer"),
        ("message", "user"),
        ("function_call", None),
        ("function_call_output", None),
        ("message", "assistant"),
    ]
    assert listed[1].id == "msg_mine" and listed[1].content[0].text == "Weather in Oslo?"
    assert (listed[2].call_id, listed[2].arguments, listed[3].output) == ("c1", '{"city": "Oslo"}', "snow")
    assert listed[4].content[0].type == "output_text" and all(i.status == "completed" for i in listed)
    newest = client.responses.input_items.list(second.id, include=["message.input_image.image_url"])
    assert [i.id for i in newest.data] == [i.id for i in reversed(listed)] and not newest.has_more
    page = client.responses.input_items.list(second.id, after="msg_mine", limit=1)
    assert ([i.role for i in page.data], page.first_id, page.last_id, page.has_more) == (
        ["developer"],
        listed[0].id,
        listed[0].id,
        False,
    )
    only = client.responses.input_items.list(first.id)
    assert [(i.role, i.content[0].text) for i in only.data] == [("user", "Hello there")]
    url = f"{served.srv.url}/v1/responses/{second.id}/input_items"
    for query, param in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=x", "limit"),
        ("order=up", "order"),
        ("after=msg_nope", "after"),
        ("include=everything", "include"),
    ]:
        r = httpx.get(f"{url}?{query}", timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (query, r.text)
    r = httpx.get(f"{url}?before=x", headers={"X-miLLM-Strict": "true"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unused_fields_refused", r.text
    assert httpx.get(f"{url}?before=x", timeout=30).headers["X-miLLM-Ignored-Fields"] == '"before"'
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.input_items.list("resp_nope")
    assert exc.value.body["code"] == "response_not_found"
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(second.id)


def test_a_response_stored_before_input_items_were_kept(tmp_path):
    """A responses.sqlite3 an older greenroom wrote gains the column; its rows have no items."""
    store = ResponseStore(str(tmp_path))
    store.path.parent.mkdir(parents=True)
    with contextlib.closing(sqlite3.connect(store.path)) as db, db:
        db.execute(
            "CREATE TABLE responses (id TEXT PRIMARY KEY, response TEXT NOT NULL, conversation TEXT NOT NULL, "
            "stored_at REAL NOT NULL)"
        )
        db.execute("INSERT INTO responses VALUES ('resp_old', '{}', '[]', 0)")
    assert store.get("resp_old").input_items is None
    store.put({"id": "resp_new"}, [], [{"id": "msg_1"}])
    assert store.get("resp_new").input_items == [{"id": "msg_1"}]


def test_a_stored_conversation_survives_a_restart(served):
    """Last: it restarts the module's server."""
    client = served.client()
    first = client.responses.create(model=GGUF, input="Hello there", instructions="Be brief.", **GREEDY)
    again = client.responses.create(model=GGUF, input="And then?", previous_response_id=first.id, **GREEDY)
    served.restart()
    client = served.client()
    assert client.responses.retrieve(first.id).output_text == first.output_text
    after = client.responses.create(model=GGUF, input="And then?", previous_response_id=first.id, **GREEDY)
    assert after.output_text == again.output_text and after.previous_response_id == first.id
