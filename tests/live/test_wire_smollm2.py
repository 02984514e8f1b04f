"""What the SDKs read on the wire, on the real model's two engines (transformers and llama.cpp):
usage streamed once, as LangChain adds it up; Anthropic's cumulative usage on `message_delta`;
a response's input items paged through the openai SDK; and chat completions, their chunks and
Responses, whole and streamed, in OpenAI's published shapes. test_openai_chat.py,
test_messages_api.py, test_responses_api.py and test_openai_schema.py hold each in full on the
demo models."""

from __future__ import annotations

import functools
import json
import operator

import anthropic
import httpx
import openai
import pytest
from conftest import SMOLLM2_MODELS
from langchain_openai import ChatOpenAI
from tools.openai_schemas import conforms

HELLO = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "max_tokens": 8}
GREEDY_ANTHROPIC = {"temperature": 0}  # its SDK takes sampling settings as extra fields


def sse(url: str, body: dict) -> list[dict]:
    """A stream's data objects, [DONE] left out (and checked to end it)."""
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200, r.read()
        data = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]" or "/responses" in url
    return [json.loads(d) for d in data if d != "[DONE]"]


@pytest.mark.parametrize("model", SMOLLM2_MODELS)
def test_chat_usage_is_streamed_once_in_openais_shapes(smollm2_server, model):
    url = smollm2_server.url + "/v1/chat/completions"
    body = {"model": model, "messages": HELLO, **GREEDY}
    whole = httpx.post(url, json=body, timeout=300).json()
    conforms("CreateChatCompletionResponse", whole)
    chunks = sse(url, {**body, "stream_options": {"include_usage": True}})
    for chunk in chunks:
        conforms("CreateChatCompletionStreamResponse", chunk)
    assert [c["usage"] for c in chunks] == [None] * (len(chunks) - 1) + [whole["usage"]]

    llm = ChatOpenAI(
        base_url=smollm2_server.url + "/v1", api_key="-", model=model, stream_usage=True, max_retries=0, **GREEDY
    )
    keys = ("input_tokens", "output_tokens", "total_tokens")
    summed = functools.reduce(operator.add, llm.stream(HELLO[0]["content"])).usage_metadata
    assert [summed[k] for k in keys] == [
        whole["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    ]


@pytest.mark.parametrize("model", SMOLLM2_MODELS)
def test_anthropic_stream_usage_is_cumulative(smollm2_server, model):
    client = anthropic.Anthropic(base_url=smollm2_server.url, api_key="-", max_retries=0, timeout=300)
    created = client.messages.create(model=model, max_tokens=8, messages=HELLO, extra_body=GREEDY_ANTHROPIC)
    with client.messages.stream(model=model, max_tokens=8, messages=HELLO, extra_body=GREEDY_ANTHROPIC) as stream:
        (delta,) = [e for e in stream if e.type == "message_delta"]
        final = stream.get_final_message()
    assert delta.usage.input_tokens == created.usage.input_tokens > 0
    assert delta.usage.output_tokens == created.usage.output_tokens and final.usage == created.usage


@pytest.mark.parametrize("model", SMOLLM2_MODELS)
def test_responses_and_their_input_items_in_openais_shapes(smollm2_server, model):
    url = smollm2_server.url + "/v1/responses"
    body = {"model": model, "instructions": "Be brief.", "max_output_tokens": 8, "temperature": 0}
    inputs = [{"role": "user", "content": text} for text in ("Hello", "What is the capital of France?", "Why?")]
    created = httpx.post(url, json={**body, "input": inputs}, timeout=300).json()
    conforms("Response", created)
    for event in sse(url, {**body, "input": "Hello", "store": False}):
        conforms("ResponseStreamEvent", event)
    client = openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="-", max_retries=0, timeout=300)
    pages = client.responses.input_items.list(created["id"], limit=2, order="asc")
    assert [item.content[0].text for item in pages] == [m["content"] for m in inputs]  # two pages, walked
    client.responses.delete(created["id"])
