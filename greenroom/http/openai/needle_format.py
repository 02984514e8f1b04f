"""/v1/needle/*'s answers, written from the folded `Completion` of the chat request each
translates to (needle.py), with the x_needle block of its choice (chat_format.x_needle)."""

from __future__ import annotations

import json

from greenroom.http.openai import chat_format
from greenroom.http.pipeline import structured
from greenroom.http.pipeline.events import Completion


def extracted(completion: Completion, ctx: chat_format.Context, plan: structured.Plan) -> dict:
    """/v1/needle/extract: the document, if the answer is one the schema (`plan`) accepts."""
    choice = completion.choices[0]
    # cut by max_tokens: no object came out
    doc = structured.document(plan, choice.text) if choice.finished.reason == "stop" else structured.INVALID
    matched = doc is not structured.INVALID
    return {
        "object": "needle.extraction",
        "data": doc if matched else None,
        "matched": matched,
        "x_needle": chat_format.x_needle(choice, ctx),
    }


def completed(completion: Completion, ctx: chat_format.Context) -> dict:
    """/v1/needle/complete: the answer's content and calls (arguments as objects)."""
    choice = completion.choices[0]
    return {
        "object": "needle.completion",
        "model": ctx.model,
        "content": chat_format.message(choice)["content"],
        "tool_calls": [{"name": c.name, "arguments": json.loads(c.arguments)} for c in choice.calls],
        "finish_reason": choice.finished.reason,
        "usage": chat_format.usage(completion.usage),
        "x_needle": chat_format.x_needle(choice, ctx),
    }
