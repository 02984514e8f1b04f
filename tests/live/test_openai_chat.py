"""Chat and text completions through the real openai SDK against a live server."""

import functools
import json
import operator
import time

import httpx
import pytest
from conftest import MODEL, UNENDING


def test_chat_completion(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=16)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == MODEL
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_all_roles_and_content_parts(client):
    r = client.chat.completions.create(
        model=MODEL,
        max_tokens=4,
        messages=[
            {"role": "system", "content": "You are concise."},
            {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
        ],
    )
    assert r.choices[0].message.content is not None


def test_stream_role_first_then_content_then_finish_with_usage(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me a story"}],
            max_tokens=20,
            stream=True,
            temperature=0,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    final = chunks[-1]
    assert final.choices[0].finish_reason == "length" and final.usage.completion_tokens == 20
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    whole = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=20, temperature=0
    )
    assert streamed == whole.choices[0].message.content


def _chunks(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as r:
        data = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story"}]}),
        ("/v1/completions", {"prompt": "Once upon a time"}),
    ],
)
def test_streamed_usage_is_sent_once(server, path, body):
    """OpenAI's rule with include_usage: usage null on every chunk but the last, usage-only one;
    without it the spec's: the finishing chunk alone carries it."""
    body = {"model": MODEL, **body, "max_tokens": 8, "temperature": 0}
    usage = httpx.post(server.url + path, json=body, timeout=60).json()["usage"]
    chunks = _chunks(server, path, {**body, "stream_options": {"include_usage": True}})
    assert [c["usage"] for c in chunks] == [None] * (len(chunks) - 1) + [usage]
    assert chunks[-1]["choices"] == [] and chunks[-2]["choices"][0]["finish_reason"] == "length"
    chunks = _chunks(server, path, body)
    assert [c.get("usage") for c in chunks] == [None] * (len(chunks) - 1) + [usage]
    assert "usage" not in chunks[0] and chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_langchain_counts_streamed_usage_once(server):
    """LangChain's ChatOpenAI(stream_usage=True) sends include_usage and adds its chunks up: the
    sum is the usage of the same request unstreamed."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        base_url=server.url + "/v1",
        api_key="not-needed",
        model=MODEL,
        max_tokens=8,
        temperature=0,
        stream_usage=True,
        max_retries=0,
    )
    whole = llm.invoke("Tell me a story")
    streamed = functools.reduce(operator.add, llm.stream("Tell me a story"))
    assert streamed.content == whole.content
    keys = ("input_tokens", "output_tokens", "total_tokens")
    assert [streamed.usage_metadata[k] for k in keys] == [whole.usage_metadata[k] for k in keys]
    assert whole.usage_metadata["output_tokens"] == 8


def test_stream_chunks_arrive_while_generating(client, server):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Go on"}], max_tokens=1500, stream=True, **UNENDING
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    # the first words are here and the engine is still generating this same request
    engine = server.actors()["cpu"]["counters"]
    stream.close()
    assert engine["active"] == 1


def test_text_completion_streamed_and_not(client):
    r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    parts = list(
        client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=8, temperature=0, stream=True)
    )
    assert "".join(p.choices[0].text for p in parts) == r.choices[0].text
    assert parts[-1].choices[0].finish_reason == "length"


def test_stop_sequence_streamed_and_not(client):
    base = client.completions.create(model=MODEL, prompt="Once", max_tokens=30, temperature=0).choices[0].text
    stop = base[10:13]
    r = client.completions.create(model=MODEL, prompt="Once", max_tokens=30, temperature=0, stop=["\u2603", stop])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == base[: base.index(stop)]
    assert r.choices[0].model_extra["stop_reason"] == stop  # vLLM's field: which stop string matched
    parts = list(
        client.completions.create(model=MODEL, prompt="Once", max_tokens=30, temperature=0, stop=stop, stream=True)
    )
    assert "".join(p.choices[0].text for p in parts) == r.choices[0].text
    assert parts[-1].choices[0].finish_reason == "stop" and parts[-1].choices[0].model_extra["stop_reason"] == stop
    ended = client.completions.create(model=MODEL, prompt="Once", max_tokens=3, temperature=0, stop=[stop])
    assert ended.choices[0].finish_reason == "length" and ended.choices[0].model_extra["stop_reason"] is None


@pytest.mark.parametrize("model", [MODEL, "greenroom-demo-gguf:Q8_0"])
def test_stop_sequences_through_the_shared_matcher(client, model):
    msgs = [{"role": "user", "content": "Tell me about the sea."}]
    answer = client.chat.completions.create(model=model, messages=msgs, max_tokens=40, temperature=0)
    full = answer.choices[0].message.content
    stop = full[10:13]
    cut = client.chat.completions.create(model=model, messages=msgs, max_tokens=40, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].model_extra["stop_reason"] == stop
    assert cut.choices[0].message.content == full[: full.index(stop)]


def test_seeded_sampling_repeats(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=24, temperature=1.0)
    a = client.chat.completions.create(seed=42, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=42, **kw).choices[0].message.content
    assert a == b


def test_models_list_and_card(client):
    ids = [m.id for m in client.models.list().data]
    assert MODEL in ids
    assert client.models.retrieve(MODEL).id == MODEL


def test_health_index_and_actors(server):
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and MODEL in health["models"]
    index = httpx.get(server.url + "/").json()
    assert {"method": "POST", "path": "/v1/chat/completions"}.items() <= {
        **next(e for e in index["endpoints"] if e["path"] == "/v1/chat/completions")
    }.items()
    actors = server.actors()
    assert {"supervisor", "steering", "cpu"} <= set(actors) and "scheduler" not in actors  # no scheduler process
    assert {a["role"] for a in actors.values()} <= {"supervisor", "steering", "engine"}
    assert actors["cpu"]["pid"] != actors["supervisor"]["pid"] == server.proc.pid
    assert actors["cpu"]["state"] == "ready" and actors["cpu"]["rss_bytes"] > 0


def test_concurrent_requests_all_complete(client):
    import concurrent.futures as cf

    def one(i):
        return (
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"n{i}"}], max_tokens=5)
            .choices[0]
            .finish_reason
        )

    t = time.monotonic()
    with cf.ThreadPoolExecutor(6) as pool:
        assert all(r in ("stop", "length") for r in pool.map(one, range(6)))
    assert time.monotonic() - t < 60
