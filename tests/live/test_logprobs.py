"""Log-probabilities of generated tokens (README: beyond the spec) through the openai SDK, on
both engines (the real SmolLM2 on transformers and on llama.cpp, and the demo models): chat's
`logprobs.content` and text completions' legacy object, streamed and not, n > 1 and
extra_messages; the values are the engine's (a greedy token is the most probable of its
alternatives; the first token's distribution is scoring's; a seeded stream's chunks add up to
the unstreamed answer); scoring mode (max_tokens 1) keeps every rule of the spec."""

from __future__ import annotations

import math

import httpx
import pytest
from conftest import MODEL, SMOLLM2_MODELS
from openai import BadRequestError, OpenAI

SMOL, SMOL_GGUF = SMOLLM2_MODELS
DEMO_GGUF = "greenroom-demo-gguf:Q8_0"
ENGINES = [SMOL, SMOL_GGUF]
ASK = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
TOLERANCE = 1e-4  # a prefix reused from the cache computes the same logits in another order


@pytest.fixture(scope="module")
def oai(smollm2_server):
    return OpenAI(base_url=smollm2_server.url + "/v1", api_key="-", max_retries=0, timeout=300)


def close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE


def streamed_chat(oai, **kw) -> tuple[list, str]:
    """The chunks' logprobs entries and text, in order; each chunk's entries are the tokens of its delta."""
    entries, text = [], []
    for chunk in oai.chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            content = choice.logprobs.content if choice.logprobs else []
            delta = choice.delta.content or ""
            if delta:
                assert content, chunk  # no text goes out without the tokens that made it
            assert "".join(e.token for e in content) == delta or choice.finish_reason, chunk
            entries += content
            text.append(delta)
    return entries, "".join(text)


@pytest.mark.parametrize("model", ENGINES)
def test_chat_reports_each_generated_token_streamed_and_not(oai, model):
    r = oai.chat.completions.create(
        model=model, messages=ASK, max_tokens=12, temperature=0, logprobs=True, top_logprobs=5
    )
    choice = r.choices[0]
    content = choice.logprobs.content
    ended = choice.finish_reason == "stop"  # the end-of-sequence token is not reported
    assert len(content) == r.usage.completion_tokens - ended
    assert "".join(e.token for e in content) == choice.message.content
    for e in content:
        assert e.bytes == list(e.token.encode("utf-8")) and e.logprob <= 0
        top = [t.logprob for t in e.top_logprobs]
        assert len(top) == 5 and top == sorted(top, reverse=True)
        assert sum(math.exp(lp) for lp in top) <= 1 + 1e-6  # temperature 1: a distribution over the vocabulary
        # greedy: the token drawn is the most probable one
        assert e.top_logprobs[0].token == e.token and e.logprob == max(top)
    entries, text = streamed_chat(
        oai, model=model, messages=ASK, max_tokens=12, temperature=0, logprobs=True, top_logprobs=5
    )
    assert text == choice.message.content and [e.token for e in entries] == [e.token for e in content]
    assert all(close(a.logprob, b.logprob) for a, b in zip(entries, content))


@pytest.mark.parametrize("model", ENGINES)
def test_a_seeded_streams_chunks_add_up_to_the_unstreamed_answer(oai, model):
    kw = dict(model=model, messages=ASK, max_tokens=16, temperature=1.0, seed=11, logprobs=True, top_logprobs=2)
    whole = oai.chat.completions.create(**kw).choices[0]
    entries, text = streamed_chat(oai, **kw)
    assert text == whole.message.content
    assert [(e.token, e.bytes) for e in entries] == [(e.token, e.bytes) for e in whole.logprobs.content]
    for a, b in zip(entries, whole.logprobs.content):
        assert close(a.logprob, b.logprob)
        assert [t.token for t in a.top_logprobs] == [t.token for t in b.top_logprobs]
        # sampled at temperature 1: a token drawn is among the alternatives only when it is probable enough
        assert a.logprob <= a.top_logprobs[0].logprob + TOLERANCE


def test_the_first_tokens_distribution_is_scorings(oai):
    """A generation's first position and a scoring request (max_tokens 1) read the same logits on
    transformers. (llama.cpp scores in a context of its own, whose arithmetic — flash attention or
    not, the prompt's chunks — is not the generation context's: docs/openai.md.)"""
    kw = dict(model=SMOL, messages=ASK, temperature=0, logprobs=True, top_logprobs=5)
    scored = oai.chat.completions.create(max_tokens=1, **kw).choices[0].logprobs.content[0]
    first = oai.chat.completions.create(max_tokens=4, **kw).choices[0].logprobs.content[0]
    assert first.token == scored.token and close(first.logprob, scored.logprob)
    assert [t.token for t in first.top_logprobs] == [t.token for t in scored.top_logprobs]
    assert all(close(a.logprob, b.logprob) for a, b in zip(first.top_logprobs, scored.top_logprobs))


@pytest.mark.parametrize("model", ENGINES)
def test_text_completions_report_tokens_offsets_and_alternatives(oai, model):
    r = oai.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3)
    choice = r.choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
    # OpenAI's convention (and scoring's): offsets within prompt plus completion
    offsets = [len(PROMPT)]
    for token in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert lp.text_offset == offsets
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 3 <= len(top) <= 4 and top[token] == logprob == max(top.values())  # the token itself too
    chunks = list(
        oai.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3, stream=True)
    )
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert sum((p.tokens for p in parts), []) == lp.tokens
    assert sum((p.text_offset for p in parts), []) == lp.text_offset
    assert all(close(a, b) for a, b in zip(sum((p.token_logprobs for p in parts), []), lp.token_logprobs))


def test_token_ids_instead_of_text(smollm2_server, oai):
    """return_tokens_as_token_ids: every token "token_id:<id>", ids the detokenizer reads back."""
    body = dict(model=SMOL_GGUF, max_tokens=6, temperature=0, extra_body={"return_tokens_as_token_ids": True})
    chat = oai.chat.completions.create(messages=ASK, logprobs=True, top_logprobs=2, **body).choices[0]
    ids = [int(e.token.removeprefix("token_id:")) for e in chat.logprobs.content]
    r = httpx.post(smollm2_server.url + "/detokenize", json={"model": SMOL_GGUF, "tokens": ids}, timeout=60)
    assert r.json()["prompt"] == chat.message.content
    assert all(t.token.startswith("token_id:") for e in chat.logprobs.content for t in e.top_logprobs)
    assert bytes(sum((e.bytes for e in chat.logprobs.content), [])).decode() == chat.message.content
    text = oai.completions.create(prompt=PROMPT, logprobs=1, **body).choices[0].logprobs
    assert all(t.startswith("token_id:") for t in text.tokens) and all(
        t in top for t, top in zip(text.tokens, text.top_logprobs)
    )


def test_n_and_extra_messages_report_each_choice(oai):
    r = oai.chat.completions.create(
        model=SMOL,
        messages=ASK,
        max_tokens=6,
        n=2,
        seed=5,
        logprobs=True,
        extra_body={"extra_messages": [[{"role": "user", "content": "Name a colour."}]]},
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for c in r.choices:
        assert c.logprobs.content and all(e.top_logprobs == [] for e in c.logprobs.content)  # none asked for
    ended = sum(c.finish_reason == "stop" for c in r.choices)  # an end-of-sequence token is not reported
    assert sum(len(c.logprobs.content) for c in r.choices) + ended == r.usage.completion_tokens


def test_a_constrained_generation_reports_what_its_grammar_allows(oai):
    """Under a schema the alternatives are the tokens the mask leaves (none at -inf, which JSON cannot
    carry): at most 20, and the greedy token is the most probable of them."""
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
    r = oai.chat.completions.create(
        model=SMOL,
        messages=[{"role": "user", "content": "Is Paris in France? Answer in JSON."}],
        max_tokens=40,
        temperature=0,
        logprobs=True,
        top_logprobs=20,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    content = r.choices[0].logprobs.content
    assert "".join(e.token for e in content) == r.choices[0].message.content
    assert any(len(e.top_logprobs) < 20 for e in content)  # somewhere few tokens are allowed
    for e in content:
        assert all(math.isfinite(t.logprob) for t in e.top_logprobs)
        assert e.logprob == max(t.logprob for t in e.top_logprobs)


def test_the_demo_models_report_tokens_too(oai):
    for model in (MODEL, DEMO_GGUF):
        r = oai.chat.completions.create(
            model=model, messages=ASK, max_tokens=5, temperature=0, logprobs=True, top_logprobs=1
        )
        assert len(r.choices[0].logprobs.content) == 5
        entries, text = streamed_chat(
            oai, model=model, messages=ASK, max_tokens=5, temperature=0, logprobs=True, top_logprobs=1
        )
        assert [e.token for e in entries] == [e.token for e in r.choices[0].logprobs.content]


def test_return_tokens_as_token_ids_is_read_only_with_logprobs(smollm2_server):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2, "return_tokens_as_token_ids": True}
    plain = httpx.post(smollm2_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert plain.status_code == 200 and plain.headers["X-miLLM-Ignored-Fields"] == '"return_tokens_as_token_ids"'
    read = httpx.post(smollm2_server.url + "/v1/chat/completions", json={**body, "logprobs": True}, timeout=60)
    assert read.status_code == 200 and "X-miLLM-Ignored-Fields" not in read.headers, read.text


def test_scoring_mode_is_what_the_spec_says_it_is(smollm2_server, oai):
    """max_tokens 1 with logprobs is a scoring request and keeps the spec's refusals; the same
    request with more tokens is a generation, which streams and is steered like any other."""
    kw = dict(model=MODEL, messages=ASK, logprobs=True, temperature=0)
    for extra, param in (({"stream": True}, "stream"), ({"extra_body": {"profile": "p"}}, "profile")):
        with pytest.raises(BadRequestError) as exc:
            oai.chat.completions.create(max_tokens=1, **kw, **extra)
        assert exc.value.body["param"] == param, exc.value.body
    profile = {"name": "logprobs-loud", "model": MODEL, "strengths": {"sae_demo_tiny_l1": {"5": 150.0}}}
    assert httpx.post(smollm2_server.url + "/api/profiles", json=profile, timeout=30).status_code == 200
    try:
        plain = oai.chat.completions.create(max_tokens=3, **kw).choices[0].logprobs.content
        steered = oai.chat.completions.create(max_tokens=3, **kw, extra_body={"profile": "logprobs-loud"})
        assert [e.logprob for e in steered.choices[0].logprobs.content] != [e.logprob for e in plain]
    finally:
        httpx.delete(smollm2_server.url + "/api/profiles/logprobs-loud", timeout=30)


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/chat/completions", {"messages": ASK, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": ASK, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": ASK, "logprobs": "yes"}, "logprobs"),
        ("/v1/completions", {"prompt": PROMPT, "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": PROMPT, "logprobs": True}, "logprobs"),
    ],
)
def test_bad_logprobs_on_a_generation_are_typed_400s(smollm2_server, path, body, param):
    r = httpx.post(smollm2_server.url + path, json={"model": MODEL, "max_tokens": 4, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("invalid_parameter", param), r.text


def test_an_engine_without_token_probabilities_refuses_them_before_loading(smollm2_server):
    r = httpx.post(
        smollm2_server.url + "/v1/chat/completions",
        json={"model": "greenroom-demo-npu", "messages": ASK, "max_tokens": 4, "logprobs": True},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "field_not_honoured", r.text
    assert r.json()["error"]["param"] == "logprobs"
