"""Structured output, streamed (README: beyond the spec, which refuses it): the constrained text
goes out as it is decoded and the document is validated once complete — through the clients
that stream it (openai's `chat.completions.stream` and `responses.stream` helpers, LangChain's
`with_structured_output(...).stream()`, Anthropic's `messages.stream` with output_config.format,
the ollama SDK's `format` with `stream`) on both SmolLM2 engines; a complete document that does
not validate ends the stream with the error event and [DONE] (tests/unit/test_formatters.py)."""

from __future__ import annotations

import json

import anthropic
import httpx
import ollama
import pydantic
import pytest
from conftest import SMOLLM2_MODELS
from langchain_openai import ChatOpenAI
from openai import OpenAI

ENGINES = list(SMOLLM2_MODELS)
ASK = [{"role": "user", "content": "Describe Paris as a JSON object: its name and whether it is a capital."}]


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    capital: bool


SCHEMA = City.model_json_schema()


@pytest.fixture(scope="module")
def oai(smollm2_server):
    return OpenAI(base_url=smollm2_server.url + "/v1", api_key="-", max_retries=0, timeout=300)


@pytest.mark.parametrize("model", ENGINES)
def test_the_openai_helper_streams_and_parses(oai, model):
    kw = dict(model=model, messages=ASK, max_tokens=60, seed=3, response_format=City)
    with oai.chat.completions.stream(**kw) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert len(deltas) > 3  # the document arrived in pieces, as it was decoded
    choice = final.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, City)
    whole = oai.chat.completions.parse(**kw).choices[0]  # the same seed unstreamed: the same document
    assert "".join(deltas) == choice.message.content == whole.message.content


@pytest.mark.parametrize("model", ENGINES)
def test_a_document_cut_by_max_tokens_streams_with_length_unjudged(smollm2_server, model):
    body = {
        "model": model,
        "messages": ASK,
        "max_tokens": 4,
        "stream": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
    }
    with httpx.stream("POST", smollm2_server.url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200 and r.headers["X-miLLM-Constrained"] == 'json_schema;name="city"'
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


@pytest.mark.parametrize("model", ENGINES)
def test_responses_stream_parses_into_the_model(oai, model):
    kw = dict(model=model, input=ASK[0]["content"], text_format=City, max_output_tokens=100, temperature=0)
    with oai.responses.stream(**kw) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert len(deltas) > 3 and final.status == "completed"
    assert isinstance(final.output_parsed, City) and "".join(deltas) == final.output_text


@pytest.mark.parametrize("model", ENGINES)
def test_langchain_with_structured_output_streams(smollm2_server, model):
    llm = ChatOpenAI(
        model=model, base_url=smollm2_server.url + "/v1", api_key="-", max_tokens=60, temperature=0, max_retries=0
    )
    parts = list(llm.with_structured_output(City, method="json_schema").stream(ASK[0]["content"]))
    assert parts and isinstance(parts[-1], City)


@pytest.mark.parametrize("model", ENGINES)
def test_anthropic_streams_output_config_format(smollm2_server, model):
    client = anthropic.Anthropic(base_url=smollm2_server.url, api_key="-", max_retries=0, timeout=300)
    fmt = {"format": {"type": "json_schema", "schema": SCHEMA}}
    kw = dict(model=model, max_tokens=100, messages=ASK, output_config=fmt, extra_body={"temperature": 0})
    with client.messages.stream(**kw) as stream:
        texts = list(stream.text_stream)
        message = stream.get_final_message()
    assert len(texts) > 3 and message.stop_reason == "end_turn"
    City.model_validate_json(message.content[0].text)


@pytest.mark.parametrize("model", ENGINES)
def test_ollama_format_streams(smollm2_server, model):
    oc = ollama.Client(host=smollm2_server.url, timeout=300)
    options = {"temperature": 0, "num_predict": 60}
    parts = list(oc.chat(model=model, messages=ASK, format=SCHEMA, stream=True, options=options))
    assert len(parts) > 3 and parts[-1].done and parts[-1].done_reason == "stop"
    whole = oc.chat(model=model, messages=ASK, format=SCHEMA, options=options).message.content
    assert "".join(p.message.content for p in parts) == whole
    City.model_validate_json(whole)
    lines = list(oc.generate(model=model, prompt=ASK[0]["content"], format=SCHEMA, stream=True, options=options))
    assert len(lines) > 3 and lines[-1].done_reason == "stop"  # /api/generate alike
    City.model_validate_json("".join(line.response for line in lines))
