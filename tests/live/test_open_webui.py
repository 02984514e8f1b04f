"""Open WebUI's default chat: it sends its built-in tools with every message typed in its UI
(36 function tools, ~28 kB of JSON: tests/data/open_webui_tools.json has that shape) and
streams. On the Ollama surface every served model answers it (the prompt is cut to num_ctx by
Ollama's rule); on /v1 every model whose trained window holds the rendered prompt answers it,
and the spec's 400 comes only where the window truly cannot — every model but the real one
(SLOW_TO_PREFILL)."""

import json
import time

import httpx
import ollama
import openai
import pytest
from conftest import ROOT

TOOLS = json.loads((ROOT / "tests" / "data" / "open_webui_tools.json").read_text())
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
HELLO = {"role": "user", "content": "Hello! What can you do?"}
MESSAGES = [SYSTEM, HELLO]


def stream_v1(
    url: str, model: str, messages: list[dict], tools: list | None, max_tokens: int
) -> tuple[str, float, int]:
    """Open WebUI's streamed chat on /v1 (greedy here), through the openai SDK: the text, the
    seconds to its first text and the prompt's tokens (the usage chunk). The prefix-reuse tests
    send it too (test_open_webui_prefix.py, test_gguf_prompt_store.py)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    start, first, text, usage = time.perf_counter(), None, "", None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        **({"tools": tools} if tools else {}),
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - start
            text += chunk.choices[0].delta.content
        usage = chunk.usage or usage
    return text, first, usage.prompt_tokens


# The real model, on either engine, takes 50 s (transformers) to 110 s (llama.cpp, one thread)
# to prefill the whole ~7,000-token prompt on this 2-core machine; its engines answer it as the
# demo models on them do.
SLOW_TO_PREFILL = {"smollm2-135m-instruct", "smollm2-135m-instruct:Q4_1"}


def served(server) -> list[str]:
    """The served models Open WebUI offers for chat — those whose /api/show capabilities have
    `completion` (an embedding model's are ["embedding"]) — less SLOW_TO_PREFILL."""
    listed = [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]]
    chat = [
        m
        for m in listed
        if "completion" in httpx.post(server.url + "/api/show", json={"model": m}, timeout=60).json()["capabilities"]
    ]
    assert len(chat) < len(listed)  # the default config's all-minilm is told apart
    return [m for m in chat if m not in SLOW_TO_PREFILL]


@pytest.fixture(autouse=True)
def as_found(server):
    """The session's server is shared: the models these tests load are unloaded after them."""

    def loaded() -> set[str]:
        return {
            m["id"]
            for m in httpx.get(server.url + "/api/models", timeout=30).json()["models"]
            if m["state"] == "loaded"
        }

    before = loaded()
    yield
    for model in loaded() - before:
        httpx.post(server.url + "/api/models/unload", json={"model": model}, timeout=120)


def test_the_tools_are_what_open_webui_sends():
    assert len(TOOLS) == 36 and 25_000 < len(json.dumps(TOOLS)) < 32_000


def test_every_model_answers_on_the_ollama_surface(server):
    client = ollama.Client(host=server.url, timeout=300)
    for model in served(server):
        parts = list(client.chat(model=model, messages=MESSAGES, tools=TOOLS, stream=True, options={"num_predict": 8}))
        assert parts[-1].done and parts[-1].done_reason in ("stop", "length"), model
        assert parts[-1].prompt_eval_count <= 2048 - 8, model  # the default num_ctx held it


def test_every_model_whose_window_holds_it_answers_on_v1(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    for model in served(server):
        window = next(m for m in httpx.get(server.url + "/api/models", timeout=30).json()["models"] if m["id"] == model)
        try:
            stream = client.chat.completions.create(
                model=model, messages=MESSAGES, tools=TOOLS, max_tokens=8, stream=True
            )
            chunks = list(stream)
        except openai.BadRequestError as exc:
            # only a window smaller than the prompt refuses it (the NPU pipeline's static shapes)
            assert exc.code == "context_length_exceeded", (model, exc)
            assert window["engine"] == "openvino", (model, exc)
            continue
        assert chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls"), model
