"""Continuing a trailing assistant message (engines/text/chat.py), for every engine: rendered
with the generation prompt, the partial appended raw — and a thought block a reasoning
template opens is neither opened twice nor left open before an answer; a lone assistant message is
rendered as the template renders it (tests/live/test_continue.py: continued on every surface)."""

from __future__ import annotations

import jinja2
import pytest

from greenroom.engines.text.chat import render_conversation

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
