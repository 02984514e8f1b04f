"""Chat prompt rendering shared by every engine with a chat template."""

from __future__ import annotations

from typing import Callable


def render_conversation(apply_template: Callable[[list[dict]], str], messages: list[dict]) -> str:
    """`apply_template(messages)` renders with the generation prompt appended.

    A trailing assistant message is a partial answer to continue (a client's Continue
    action): everything before it is rendered with the generation prompt and the
    partial is appended raw, so the model resumes mid-sentence instead of starting a
    new turn that the template would otherwise open after a closed one."""
    last = messages[-1]
    if last.get("role") == "assistant" and isinstance(last.get("content"), str) and not last.get("tool_calls"):
        return apply_template(messages[:-1]) + last["content"]
    return apply_template(messages)
