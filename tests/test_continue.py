"""Continuing a trailing assistant message (engines/chat.py), for every engine: rendered
with the generation prompt, the partial appended raw — and a thought block a reasoning
template opens is neither opened twice nor left open before an answer."""

from __future__ import annotations

import jinja2

from greenroom.engines.chat import render_conversation

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen3-style: the generation prompt opens a thought block
THINKING = CHATML.replace("assistant\n{% endif %}", "assistant\n<think>\n{% endif %}")
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
