"""/v1/needle/*'s answers, written from the folded `Completion` of the chat request each
translates to (needle.py), with the x_needle block of its choice (chat_format.x_needle)."""

from __future__ import annotations

import json

from greenroom.http.core.contracts import AnyOf, Anything, Boolean, Choice, ListOf
from greenroom.http.core.objects import AN_OBJECT, TEXT, Object, const, or_null
from greenroom.http.openai import chat_format
from greenroom.http.openai.needle import X_NEEDLE
from greenroom.http.pipeline import structured
from greenroom.http.pipeline.events import Completion

EXTRACTION = Object(
    name="NeedleExtraction",
    fields={
        "object": const("needle.extraction"),
        "data": Anything(description="The extracted value, valid against the request's schema; null unless matched"),
        "matched": Boolean(description="true when the constrained answer was complete and valid"),
        "x_needle": AnyOf(
            options=(
                X_NEEDLE.ref(),
                Object(
                    name="XNeedleRefusal",
                    fields={"type": const("refuse"), "warnings": ListOf(items=TEXT)},
                    description="When the model produced no valid document: only the type and the request's "
                    "unknown fields",
                ),
            )
        ),
    },
)
COMPLETED = Object(
    name="NeedleCompletion",
    fields={
        "object": const("needle.completion"),
        "model": TEXT,
        "content": or_null(TEXT),
        "tool_calls": ListOf(items=Object(name="NeedleToolCall", fields={"name": TEXT, "arguments": AN_OBJECT})),
        "finish_reason": Choice(values=("stop", "length", "tool_calls")),
        "usage": chat_format.USAGE.ref(),
        "x_needle": X_NEEDLE.ref(),
    },
)
OBJECTS = (EXTRACTION, COMPLETED)


def extracted(completion: Completion, ctx: chat_format.Context, plan: structured.Plan) -> dict:
    """/v1/needle/extract: the document, if the answer is one the schema (`plan`) accepts."""
    choice = completion.choices[0]
    # cut by max_tokens: no object came out
    doc = structured.document(plan, choice.text) if choice.finished.reason == "stop" else structured.INVALID
    matched = doc is not structured.INVALID
    return EXTRACTION.build(
        object="needle.extraction",
        data=doc if matched else None,
        matched=matched,
        x_needle=chat_format.x_needle(choice, ctx),
    )


def completed(completion: Completion, ctx: chat_format.Context) -> dict:
    """/v1/needle/complete: the answer's content and calls (arguments as objects)."""
    choice = completion.choices[0]
    calls = COMPLETED.fields["tool_calls"].items
    return COMPLETED.build(
        object="needle.completion",
        model=ctx.model,
        content=chat_format.content(choice),
        tool_calls=[calls.build(name=c.name, arguments=json.loads(c.arguments)) for c in choice.calls],
        finish_reason=choice.finished.reason,
        usage=chat_format.usage(completion.usage),
        x_needle=chat_format.x_needle(choice, ctx),
    )
