"""Anthropic's Messages answers, written from the one event stream (http/pipeline/events.py):
`whole` turns the folded `Completion` into the Message (stop_reason end_turn, max_tokens,
stop_sequence with the string, or tool_use), `stream` the typed events into Anthropic's events:
message_start, ping, per content block content_block_start, content_block_delta (text_delta, or
input_json_delta of ARGUMENT_FRAGMENT characters)…, content_block_stop; then message_delta
(stop_reason, the cumulative usage) and message_stop — or an `error` event in Anthropic's
envelope. Pure: events or a Completion and the request's `Context` in, frames or a body out.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator

import attrs

from greenroom.http.core import framing
from greenroom.http.core.contracts import NULL, AnyOf, Choice, ListOf, Schema
from greenroom.http.core.objects import AN_OBJECT, COUNT, TEXT, Events, Object, const, or_null
from greenroom.http.pipeline import events as ev
from greenroom.http.pipeline import sae_activations

# --- the objects (openapi.py renders them) -------------------------------------------------

TEXT_BLOCK = Object(name="TextBlock", fields={"type": const("text"), "text": TEXT})
TOOL_USE = Object(
    name="ToolUseBlock",
    fields={"type": const("tool_use"), "id": TEXT, "name": TEXT, "input": AN_OBJECT},
)
BLOCK = AnyOf(options=(TEXT_BLOCK, TOOL_USE))
STOP_REASON = Choice(values=("end_turn", "max_tokens", "stop_sequence", "tool_use"))
USAGE = Object(
    name="MessageUsage",
    fields={
        "input_tokens": COUNT,
        "cache_creation_input_tokens": Choice(values=(0,), description="No prompt cache: cache_control is not read"),
        "cache_read_input_tokens": const(0),
        "output_tokens": COUNT,
        "server_tool_use": Schema(schema=NULL, description="No server tools"),
    },
    description="Cumulative: message_start's and message_delta's alike (input included)",
)
_MILLM = sae_activations.MILLM.ref("Only when the request sent return_sae_activations")
MESSAGE = Object(
    name="Message",
    fields={
        "id": TEXT,
        "type": const("message"),
        "role": const("assistant"),
        "model": TEXT,
        "content": ListOf(items=BLOCK),
        "stop_reason": or_null(STOP_REASON),
        "stop_sequence": or_null(TEXT),
        "usage": USAGE.ref(),
        "millm": _MILLM,
    },
    optional=("millm",),
    description="stop_reason null only on message_start",
)
# what GreenroomError.anthropic_body writes inside its envelope
ERROR = Object(
    name="AnthropicErrorDetail",
    fields={"type": TEXT, "message": TEXT, "code": TEXT, "param": or_null(TEXT)},
    description="Anthropic's type and message, greenroom's code and param",
)
TEXT_DELTA = Object(name="TextDelta", fields={"type": const("text_delta"), "text": TEXT})
JSON_DELTA = Object(name="InputJsonDelta", fields={"type": const("input_json_delta"), "partial_json": TEXT})
STOPPED = Object(name="MessageDelta", fields={"stop_reason": STOP_REASON, "stop_sequence": or_null(TEXT)})
EVENTS = Events.of(
    "MessageStreamEvent",
    {
        "message_start": {"message": MESSAGE.ref()},
        "ping": {},
        "content_block_start": {"index": COUNT, "content_block": BLOCK},
        "content_block_delta": {"index": COUNT, "delta": AnyOf(options=(TEXT_DELTA, JSON_DELTA))},
        "content_block_stop": {"index": COUNT},
        "message_delta": {"delta": STOPPED, "usage": USAGE.ref(), "millm": _MILLM},
        "message_stop": {},
        "error": {"error": ERROR},
    },
    optional={"message_delta": ("millm",)},
)
OBJECTS = (MESSAGE, EVENTS)


@attrs.frozen
class Context:
    """The request's side of its Message."""

    id: str
    model: str
    prompt_tokens: int


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _stopped(reason: str | None, stop: str | None) -> dict:
    """Anthropic's stop_reason and stop_sequence for a choice's finish_reason and stop string."""
    if reason == "stop" and stop is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": stop}
    return {"stop_reason": reason and _STOP_REASONS[reason], "stop_sequence": None}


def _usage(input_tokens: int, output_tokens: int) -> dict:
    """Anthropic's usage, cumulative (the SDK's Usage and MessageDeltaUsage read the same fields):
    no prompt cache (cache_control is not read) and no server tools."""
    return USAGE.build(
        input_tokens=input_tokens,
        cache_creation_input_tokens=0,
        cache_read_input_tokens=0,
        output_tokens=output_tokens,
        server_tool_use=None,
    )


def _tool_id(call_id: str) -> str:
    """The call's call_<hex> as Anthropic's toolu_<hex>."""
    return "toolu_" + call_id.removeprefix("call_")


def _millm(activations: ev.Read | None) -> dict:
    return {} if activations is None else {"millm": sae_activations.millm(activations)}


def message(ctx: Context, content: list[dict], finished: ev.Finished | None, usage: dict, activations=None) -> dict:
    return MESSAGE.build(
        id=ctx.id,
        type="message",
        role="assistant",
        model=ctx.model,
        content=content,
        **_stopped(finished and finished.reason, finished and finished.stop),
        usage=usage,
        **_millm(activations),
    )


def whole(completion: ev.Completion, ctx: Context) -> dict:
    choice = completion.choices[0]
    content = [TEXT_BLOCK.build(type="text", text=choice.text)] if choice.text or not choice.calls else []
    content += [
        TOOL_USE.build(type="tool_use", id=_tool_id(c.id), name=c.name, input=json.loads(c.arguments))
        for c in choice.calls
    ]
    counted = completion.usage
    usage = _usage(counted.prompt_tokens, counted.completion_tokens)
    return message(ctx, content, choice.finished, usage, completion.activations)


async def stream(events: AsyncIterator[ev.Event], ctx: Context) -> AsyncIterator[bytes]:
    def event(kind: str, **fields) -> bytes:
        return framing.sse(EVENTS.build(kind, **fields), kind)

    yield event("message_start", message=message(ctx, [], None, _usage(ctx.prompt_tokens, 0)))
    yield event("ping")
    blocks = itertools.count()
    index, open_kind = -1, None  # the open block

    def close() -> list[bytes]:
        nonlocal open_kind
        if open_kind is None:
            return []
        open_kind = None
        return [event("content_block_stop", index=index)]

    usage = finished = activations = None
    async for e in events:
        if isinstance(e, ev.Failure):  # the one place a failure becomes this surface's error event
            yield framing.sse(e.error.anthropic_body(), "error")
            return
        if isinstance(e, ev.Delta):
            if open_kind != "text":
                for frame in close():
                    yield frame
                index, open_kind = next(blocks), "text"
                yield event("content_block_start", index=index, content_block=TEXT_BLOCK.build(type="text", text=""))
            yield event("content_block_delta", index=index, delta=TEXT_DELTA.build(type="text_delta", text=e.text))
        elif isinstance(e, ev.CallStarted):
            for frame in close():
                yield frame
            index, open_kind = next(blocks), "tool_use"
            block = TOOL_USE.build(type="tool_use", id=_tool_id(e.id), name=e.name, input={})
            yield event("content_block_start", index=index, content_block=block)
        elif isinstance(e, ev.CallArguments):
            for piece in e.fragments():
                delta = JSON_DELTA.build(type="input_json_delta", partial_json=piece)
                yield event("content_block_delta", index=index, delta=delta)
        elif isinstance(e, ev.Usage):
            usage = e
        elif isinstance(e, ev.Finished):
            finished = e
        elif isinstance(e, ev.Activations):
            activations = e.read
    for frame in close():
        yield frame
    # cumulative, input included: langchain-anthropic reads the usage here alone
    totals = _usage(usage.prompt_tokens, usage.completion_tokens)
    delta = STOPPED.build(**_stopped(finished and finished.reason, finished and finished.stop))
    yield event("message_delta", delta=delta, usage=totals, **_millm(activations))
    yield event("message_stop")
