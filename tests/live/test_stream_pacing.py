"""Stream pacing (http/core/pacing.py): past `stream_chunks_per_s` chunks a second in all, each
stream's tokens go out as fewer, larger chunks — the same text, the same usage, on every
streaming surface."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from conftest import MODEL, Server

TOKENS = 96
STREAMS = 3
# 3 streams / 20 chunks a second: each stream held to a chunk per 50 ms (MAX_HOLD_S), while the
# demo model makes a token every few milliseconds
CONFIG = f'stream_chunks_per_s = 20\n[[models]]\nid = "{MODEL}"\nsource = "demo:tiny"\n'


@pytest.fixture(scope="module")
def paced(tmp_path_factory, model_cache):
    srv = Server(tmp_path_factory.mktemp("paced"), model_cache, CONFIG)
    yield srv
    srv.stop()


def _messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Tell story number {i}."}]


def _streamed_chat(client: openai.OpenAI, i: int):
    return client.chat.completions.create(
        model=MODEL,
        messages=_messages(i),
        max_tokens=TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )


def _ollama(i: int, stream: bool) -> dict:
    return {
        "model": MODEL,
        "messages": _messages(i),
        "stream": stream,
        "options": {"num_predict": TOKENS, "temperature": 0},
    }


def test_paced_chat_streams_carry_several_tokens_a_chunk_and_the_same_text(paced):
    client = openai.OpenAI(base_url=paced.url + "/v1", api_key="x", max_retries=0, timeout=120)

    def streamed(i: int) -> tuple[str, int, int]:
        texts, usage = [], None
        for chunk in _streamed_chat(client, i):
            if chunk.choices and chunk.choices[0].delta.content:
                texts.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        return "".join(texts), len(texts), usage.completion_tokens

    with ThreadPoolExecutor(STREAMS) as pool:
        results = list(pool.map(streamed, range(STREAMS)))
    for i, (text, chunks, tokens) in enumerate(results):
        whole = client.chat.completions.create(model=MODEL, messages=_messages(i), max_tokens=TOKENS, temperature=0)
        assert text == whole.choices[0].message.content
        assert tokens == whole.usage.completion_tokens == TOKENS
        assert chunks < 0.75 * tokens, (chunks, tokens)  # tokens held together, none lost


def test_paced_ollama_lines_carry_several_tokens_and_the_same_text(paced):
    def streamed(i: int) -> tuple[str, int, int]:
        texts, last = [], None
        with httpx.stream("POST", paced.url + "/api/chat", json=_ollama(i, True), timeout=120) as r:
            for line in r.iter_lines():
                last = json.loads(line)
                if last["message"]["content"]:
                    texts.append(last["message"]["content"])
        return "".join(texts), len(texts), last["eval_count"]

    with ThreadPoolExecutor(STREAMS) as pool:
        results = list(pool.map(streamed, range(STREAMS)))
    for i, (text, lines, tokens) in enumerate(results):
        whole = httpx.post(paced.url + "/api/chat", json=_ollama(i, False), timeout=120).json()
        assert text == whole["message"]["content"] and tokens == whole["eval_count"] == TOKENS
        assert lines < 0.75 * tokens, (lines, tokens)


def test_streams_on_pooled_connections_add_up_to_the_whole_answer_with_usage_once(paced):
    """Six streams at a time on each surface over three pooled keep-alive connections, each
    prompt twice: whatever the actor merged into one message (protocol.EventBatch), the pacer held
    and the templates framed (framing.Template), each stream's text chunks add up to the
    non-streamed answer, and its usage comes once, at its end, equal to the answer's."""
    pool = httpx.Client(limits=httpx.Limits(max_connections=3), timeout=120)
    client = openai.OpenAI(base_url=paced.url + "/v1", api_key="x", max_retries=0, http_client=pool)
    prompts = [i % 6 for i in range(12)]

    def chat(i: int) -> tuple[str, list]:
        seen = list(_streamed_chat(client, i))
        text = "".join(c.choices[0].delta.content or "" for c in seen if c.choices)
        return text, [(n, c.usage) for n, c in enumerate(seen) if c.usage is not None] + [len(seen)]

    def ollama(i: int) -> tuple[str, list]:
        with pool.stream("POST", paced.url + "/api/chat", json=_ollama(i, True)) as r:
            lines = [json.loads(line) for line in r.iter_lines()]
        done = [(n, line["prompt_eval_count"], line["eval_count"]) for n, line in enumerate(lines) if line["done"]]
        return "".join(line["message"]["content"] for line in lines), [*done, len(lines)]

    with ThreadPoolExecutor(6) as threads:
        chats, lines = list(threads.map(chat, prompts)), list(threads.map(ollama, prompts))
    for i, (text, usage), (o_text, done) in zip(prompts, chats, lines, strict=True):
        whole = client.chat.completions.create(model=MODEL, messages=_messages(i), max_tokens=TOKENS, temperature=0)
        assert text == whole.choices[0].message.content
        assert len(usage) == 2  # one chunk with usage, and the number of chunks
        (last, counted), chunks = usage
        assert last == chunks - 1 and counted == whole.usage  # on the last chunk, the answer's
        o_whole = pool.post(paced.url + "/api/chat", json=_ollama(i, False)).json()
        assert o_text == o_whole["message"]["content"]
        assert done == [(done[-1] - 1, o_whole["prompt_eval_count"], o_whole["eval_count"]), done[-1]]
    pool.close()
