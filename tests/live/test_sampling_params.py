"""Chat-completion parameters end to end: seeds and their header, system_fingerprint,
n, penalties, stream_options, stops across tokens, continuing an answer, prompts lists."""

import re

import http_sf
import httpx
import openai
import pytest
from conftest import MODEL

MSG = [{"role": "user", "content": "Tell me something"}]
FINGERPRINT = re.compile(r"^millm:greenroom-demo@[^:]+:float32/F32:transformers$")


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=60)


def test_same_seed_is_byte_identical_and_echoed(client):
    kw = dict(model=MODEL, messages=MSG, max_tokens=30, temperature=1.2)
    a = client.chat.completions.with_raw_response.create(seed=123, **kw)
    b = client.chat.completions.with_raw_response.create(seed=123, **kw)
    c = client.chat.completions.create(seed=124, **kw)
    pa, pb = a.parse(), b.parse()
    assert pa.choices[0].message.content == pb.choices[0].message.content
    assert pa.choices[0].finish_reason == pb.choices[0].finish_reason
    assert c.choices[0].message.content != pa.choices[0].message.content
    assert a.headers["X-miLLM-Seed"] == '123;scope="request"'


def test_seed_header_absent_without_seed_and_on_streams(client, server):
    r = client.chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=2)
    assert "X-miLLM-Seed" not in r.headers
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MSG, "max_tokens": 2, "stream": True, "seed": 0},
    ) as s:
        assert s.headers["X-miLLM-Seed"] == '0;scope="request"'


def test_an_unseeded_request_names_the_seed_drawn_for_it(client, server):
    """Beyond the spec: X-miLLM-Seed stays absent without a sent seed; X-Greenroom-Drawn-Seed
    names the one drawn, and sent back it reproduces the answer, on every /v1 generation route."""
    kw = dict(model=MODEL, messages=MSG, max_tokens=30, temperature=1.2)
    r = client.chat.completions.with_raw_response.create(**kw)
    assert "X-miLLM-Seed" not in r.headers
    seed, params = http_sf.parse(r.headers["X-Greenroom-Drawn-Seed"].encode(), tltype="item")
    assert params == {"scope": "request"}
    again = client.chat.completions.with_raw_response.create(seed=seed, **kw)
    assert again.headers["X-miLLM-Seed"] == f'{seed};scope="request"' and "X-Greenroom-Drawn-Seed" not in again.headers
    assert again.parse().choices[0].message.content == r.parse().choices[0].message.content
    body = {"model": MODEL, "prompt": ["abc", "xyz"], "max_tokens": 12}
    text = post(server, "/v1/completions", body)
    seed, params = http_sf.parse(text.headers["X-Greenroom-Drawn-Seed"].encode(), tltype="item")
    assert params == {"scope": "request"}
    assert post(server, "/v1/completions", {**body, "seed": seed}).json()["choices"] == text.json()["choices"]


def test_seed_is_echoed_on_greedy_requests(client):
    r = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MSG, max_tokens=2, temperature=0, seed=4294967295
    )
    assert r.headers["X-miLLM-Seed"] == '4294967295;scope="request"'


@pytest.mark.parametrize("seed", [True, -1, 2**32, 1.5, "7"])
def test_bad_seeds_are_refused(server, seed):
    r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "seed": seed})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"


def test_each_prompt_of_a_list_is_seeded_separately(server):
    one = post(server, "/v1/completions", {"model": MODEL, "prompt": "abc", "max_tokens": 12, "seed": 9}).json()
    two = post(
        server, "/v1/completions", {"model": MODEL, "prompt": ["xyz", "abc"], "max_tokens": 12, "seed": 9}
    ).json()
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert two["choices"][1]["text"] == one["choices"][0]["text"]


def test_system_fingerprint_on_every_non_streamed_completion(client):
    chat = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2)
    text = client.completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert FINGERPRINT.match(chat.system_fingerprint) and FINGERPRINT.match(text.system_fingerprint)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2, stream=True))
    assert all(c.system_fingerprint is None for c in chunks)


def test_n_gives_several_choices(client):
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=10, n=3, seed=1)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) == 3
    if all(c.finish_reason == "length" for c in r.choices):
        assert r.usage.completion_tokens == 30
    again = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=10, n=3, seed=1)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    single = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=10, seed=1)
    assert single.choices[0].message.content == r.choices[0].message.content


def test_n_is_refused_with_streaming(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=MSG, n=2, stream=True)
    assert exc.value.code == "field_not_honoured" and exc.value.param == "n"


def test_penalties_change_greedy_output(client):
    kw = dict(model=MODEL, messages=MSG, max_tokens=40, temperature=0)
    plain = client.chat.completions.create(**kw).choices[0].message.content
    penalised = client.chat.completions.create(presence_penalty=2, frequency_penalty=2, **kw).choices[0].message.content
    assert plain != penalised
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(presence_penalty=2.5, **kw)


def token_boundary_stop(client, prompt):
    """A stop string made of the last character of one generated token and the first of
    the next, found by asking for k and k+1 greedy tokens; and the long greedy text."""
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0).choices[0].text
    for k in range(2, 30):
        head = client.completions.create(model=MODEL, prompt=prompt, max_tokens=k, temperature=0).choices[0].text
        nxt = client.completions.create(model=MODEL, prompt=prompt, max_tokens=k + 1, temperature=0).choices[0].text
        if head and len(nxt) > len(head):
            stop = nxt[len(head) - 1 : len(head) + 1]
            if full.index(stop) == len(head) - 1:
                return stop, full
    raise AssertionError("no token boundary found")


def test_stop_across_two_tokens_stops_streamed_and_not(client):
    stop, full = token_boundary_stop(client, "Once upon a time")
    expected = full[: full.index(stop)]
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=40, temperature=0, stop=stop)
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=40, temperature=0, stop=[stop], stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_context_exceeded_refused_before_the_stream_starts(server):
    body = {"model": MODEL, "messages": MSG, "max_tokens": 32760, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 400 and "text/event-stream" not in r.headers["content-type"]
        err = __import__("json").loads(r.read())["error"]
    assert err["code"] == "context_length_exceeded" and "32768" in err["message"] and "32760" in err["message"]


def test_trailing_assistant_message_is_continued(client, server):
    from transformers import AutoTokenizer

    from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model

    tok = AutoTokenizer.from_pretrained(ensure_demo_model(default_cache_dir()))
    partial = "The lighthouse keeper walked"
    messages = [{"role": "user", "content": "Tell me a story"}, {"role": "assistant", "content": partial}]
    rendered = tok.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False) + partial
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    raw = client.completions.create(
        model=MODEL, prompt=rendered, max_tokens=12, temperature=0, extra_body={"add_special_tokens": False}
    )
    assert chat.choices[0].message.content == raw.choices[0].text
    restarted = client.chat.completions.create(model=MODEL, messages=messages[:1], max_tokens=12, temperature=0)
    assert chat.choices[0].message.content != restarted.choices[0].message.content


def test_completion_prompt_list_and_token_prompts(client):
    r = client.completions.create(model=MODEL, prompt=["one", "two", "three"], max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    ids = client.completions.create(model=MODEL, prompt=[[5, 6, 7]], max_tokens=4, temperature=0)
    assert ids.usage.prompt_tokens == 3
    chunks = list(
        client.completions.create(model=MODEL, prompt=["one", "two"], max_tokens=4, temperature=0, stream=True)
    )
    by_index = {i: "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in (0, 1)}
    assert by_index == {0: r.choices[0].text, 1: r.choices[1].text}
    assert chunks[-1].usage.completion_tokens == 8


@pytest.mark.parametrize("prompt", [[], [""], [[]], [[5, "x"]], [[10**9]], {"a": 1}])
def test_bad_prompts_are_typed_400(server, prompt):
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 2})
    if prompt == [""]:  # an empty string is a valid prompt: the model starts from its BOS
        assert r.status_code == 200
        return
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_0_is_refused_on_chat_and_a_token_count_on_completions(server, field):
    """OpenAI's minimum is 1 on chat completions; a text completion of 0 tokens counts the
    prompt (usage) and generates nothing."""
    r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": MSG, field: 0})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parameter"
    assert r.json()["error"]["param"] == field
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "Once upon a time", field: 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == "" and choice["finish_reason"] == "length"
    assert r.json()["usage"]["prompt_tokens"] > 0 and r.json()["usage"]["completion_tokens"] == 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_a_content_part_whose_type_is_not_a_string_is_a_typed_400(server, path):
    """Any JSON value may arrive as a part's `type`: a list was unhashable, a 500."""
    message = {"role": "user", "content": [{"type": ["image_url"], "text": "x"}]}
    body = {"messages": [message]} if path.endswith("completions") else {"input": [message]}
    r = post(server, path, {"model": MODEL, "max_tokens": 2, **body})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_parameter", r.text
    assert r.json()["error"]["param"].endswith("content[0]"), r.text
