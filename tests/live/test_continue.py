"""Continuing a trailing assistant message through a live server, on the transformers and
llama.cpp engines: mid-sentence, the same tokens as the rendered prompt sent as a completion;
a lone assistant message (a bare prefix; Open WebUI's Continue once num_ctx truncation dropped
the question) rendered as the template renders it and continued, on every engine and surface
(tests/unit/test_continue.py: the rendering itself)."""

from __future__ import annotations

import anthropic
import http_sf
import httpx
import ollama
import pytest
from conftest import MODEL
from openai import OpenAI

PARTIAL = "The lighthouse keeper walked"
LONE = [{"role": "assistant", "content": PARTIAL}]


@pytest.mark.parametrize("model", [MODEL, "greenroom-demo-gguf:Q8_0", "greenroom-demo-npu"])
def test_a_lone_assistant_message_is_continued_on_every_surface(server, model):
    """Each surface's SDK sends only the partial answer; each prompt is the lone message as
    /tokenize renders it (the transformers engine answered 400 "Cannot apply chat template to an
    empty conversation")."""
    r = httpx.post(server.url + "/tokenize", json={"model": model, "messages": LONE}, timeout=120)
    assert r.status_code == 200, r.text
    count = r.json()["count"]
    oai = OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=120)
    chat = oai.chat.completions.create(model=model, messages=LONE, max_tokens=2)
    assert chat.usage.prompt_tokens == count and chat.choices[0].message.content
    answer = ollama.Client(host=server.url, timeout=120).chat(model=model, messages=LONE, options={"num_predict": 2})
    assert answer.prompt_eval_count == count and answer.message.content
    message = anthropic.Anthropic(base_url=server.url, api_key="-", max_retries=0).messages.create(
        model=model, max_tokens=2, messages=LONE
    )
    assert message.usage.input_tokens == count and message.content[0].text
    response = oai.responses.create(model=model, input=LONE, max_output_tokens=2, store=False)
    assert response.usage.input_tokens == count and response.output_text


def test_ollama_continue_after_num_ctx_truncation_dropped_the_question(server):
    """Open WebUI's Continue of a long conversation: the question goes to fit num_ctx, leaving
    the partial answer alone, which is continued."""
    count = httpx.post(server.url + "/tokenize", json={"model": MODEL, "messages": LONE}, timeout=60).json()["count"]
    body = {
        "model": MODEL,
        "stream": False,
        "messages": [{"role": "user", "content": "Tell me about the sea. " * 40}, *LONE],
        "options": {"num_ctx": 64, "num_predict": 4},
    }
    r = httpx.post(server.url + "/api/chat", json=body, timeout=60)
    assert r.status_code == 200, r.text
    dropped = http_sf.parse(r.headers["X-Greenroom-Truncated"].encode(), tltype="dictionary")
    assert dropped["messages"][0] == 1 and r.json()["prompt_eval_count"] == count


@pytest.mark.parametrize("model", [MODEL, "greenroom-demo-gguf:Q8_0"])
def test_continue_completes_a_trailing_assistant_message_mid_sentence(server, model_cache, model):
    """Everything before the partial rendered with a generation prompt, the partial appended
    raw: the same tokens as the rendered text sent as a plain completion (both demo models
    share the tiny demo tokenizer)."""
    from transformers import AutoTokenizer

    from greenroom.engines.demo.demo_model import default_cache_dir, demo_model_dir

    tok = AutoTokenizer.from_pretrained(demo_model_dir(default_cache_dir(model_cache), "tiny"))
    user = [{"role": "user", "content": "Tell me about the sea."}]
    partial = "The sea is wide and"
    text = tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False) + partial
    ids = tok.encode(text, add_special_tokens=False)
    oai = OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=120)
    cont = (
        oai.chat.completions.create(
            model=model, messages=user + [{"role": "assistant", "content": partial}], max_tokens=12, temperature=0
        )
        .choices[0]
        .message.content
    )
    plain = oai.completions.create(model=model, prompt=ids, max_tokens=12, temperature=0).choices[0].text
    fresh = oai.chat.completions.create(model=model, messages=user, max_tokens=12, temperature=0)
    assert cont == plain and cont != fresh.choices[0].message.content
