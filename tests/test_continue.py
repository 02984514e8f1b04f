"""Continuing a trailing assistant message (engines/chat.py), for every engine: rendered
with the generation prompt, the partial appended raw — and a thought block a reasoning
template opens is neither opened twice nor left open before an answer. A lone assistant message
(a bare prefix; Open WebUI's Continue once num_ctx truncation dropped the question) is rendered as
the template renders it and continued, on every engine and surface."""

from __future__ import annotations

import anthropic
import http_sf
import httpx
import jinja2
import ollama
import pytest
from conftest import MODEL
from openai import OpenAI

from greenroom.engines.chat import render_conversation

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen3-style: the generation prompt opens a thought block
THINKING = CHATML.replace("assistant\n{% endif %}", "assistant\n<think>\n{% endif %}")
# SmolLM2-style: a default system message when the conversation has none
DEFAULT_SYSTEM = (
    "{% for m in messages %}{% if loop.first and m.role != 'system' %}<|im_start|>system\nBe kind.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
USER = [{"role": "user", "content": "hi"}]


def render(template: str, messages: list[dict]) -> str:
    t = jinja2.Template(template)
    return render_conversation(lambda msgs, gen: t.render(messages=msgs, add_generation_prompt=gen), messages)


def test_a_new_answer_gets_the_generation_prompt():
    assert render(CHATML, USER) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_partial_answer_is_continued_mid_sentence():
    out = render(CHATML, USER + [{"role": "assistant", "content": "The sea is"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nThe sea is"


def test_a_partial_thought_is_not_opened_twice():
    out = render(THINKING, USER + [{"role": "assistant", "content": "<think>\nThe user greets"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nThe user greets"


def test_a_partial_answer_after_its_thought_continues_the_answer():
    partial = "<think>\nA greeting.\n</think>\n\nHello! How"
    out = render(THINKING, USER + [{"role": "assistant", "content": partial}])
    assert out.endswith("assistant\n" + partial) and out.count("<think>") == 1


def test_a_partial_answer_without_its_thought_closes_an_empty_block_first():
    out = render(THINKING, USER + [{"role": "assistant", "content": "Hello! How"}])
    assert out.endswith("<|im_start|>assistant\n<think>\n</think>\n\nHello! How")


def test_a_lone_partial_answer_is_rendered_as_the_template_renders_it():
    assert render(CHATML, [{"role": "assistant", "content": "The sea is"}]) == "<|im_start|>assistant\nThe sea is"
    # the template's own preamble, and the partial raw (its trailing space kept, which `trim` would drop)
    out = render(DEFAULT_SYSTEM, [{"role": "assistant", "content": "The sea is "}])
    assert out == "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>assistant\nThe sea is "
    assert render(CHATML, [{"role": "assistant", "content": ""}]) == "<|im_start|>assistant\n"


def test_a_lone_partial_thought_is_continued():
    thinking = CHATML.replace("{{ m.content }}", "{% if m.role == 'assistant' %}<think>\n{% endif %}{{ m.content }}")
    out = render(thinking, [{"role": "assistant", "content": "<think>\nThe user"}])  # not opened twice
    assert out == "<|im_start|>assistant\n<think>\nThe user"
    out = render(thinking, [{"role": "assistant", "content": "Hello! How"}])  # an answer: the thought closed first
    assert out.endswith("assistant\n<think>\n</think>\n\nHello! How")


def test_a_template_that_drops_the_content_is_refused():
    with pytest.raises(ValueError, match="does not render the assistant message's content"):
        render("{% for m in messages %}[{{ m.role }}]{% endfor %}", [{"role": "assistant", "content": "x"}])


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
