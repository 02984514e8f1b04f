"""Chat prompt rendering shared by every engine with a chat template."""

from __future__ import annotations

from typing import Callable

# thought blocks a reasoning template may open in its generation prompt → their closing tag
THOUGHT_TAGS = {"<think>": "</think>"}


def render_conversation(apply_template: Callable[[list[dict], bool], str], messages: list[dict]) -> str:
    """`apply_template(messages, add_generation_prompt)` renders a conversation.

    A trailing assistant message is a partial answer to continue (a client's Continue
    action): everything before it is rendered with the generation prompt and the
    partial is appended raw, so the model resumes mid-sentence instead of starting a
    new turn that the template would otherwise open after a closed one. When that
    generation prompt opens a thought block (reasoning templates), the block is not
    opened twice: a partial that brings its own opening tag replaces the template's,
    and a partial with no thought at all is an answer, so the block is closed empty
    before it."""
    last = messages[-1]
    if last.get("role") != "assistant" or not isinstance(last.get("content"), str) or last.get("tool_calls"):
        return apply_template(messages, True)
    head, partial = apply_template(messages[:-1], True), last["content"]
    prompt = head.removeprefix(apply_template(messages[:-1], False))
    for opening, closing in THOUGHT_TAGS.items():
        at = prompt.rfind(opening)
        if at < 0 or closing in prompt[at:]:
            continue
        if partial.lstrip().startswith(opening):
            head = head[:len(head) - len(prompt) + at]
        elif closing not in partial:
            head = head + ("" if head.endswith("\n") else "\n") + closing + "\n\n"
    return head + partial
