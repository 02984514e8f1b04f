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
from greenroom.http.pipeline import events as ev
from greenroom.http.pipeline import sae_activations


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
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": output_tokens,
        "server_tool_use": None,
    }


def _tool_id(call_id: str) -> str:
    """The call's call_<hex> as Anthropic's toolu_<hex>."""
    return "toolu_" + call_id.removeprefix("call_")


def _millm(activations: ev.Read | None) -> dict:
    return {} if activations is None else {"millm": sae_activations.millm(activations)}


def message(ctx: Context, content: list[dict], finished: ev.Finished | None, usage: dict, activations=None) -> dict:
    return {
        "id": ctx.id,
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        **_stopped(finished and finished.reason, finished and finished.stop),
        "usage": usage,
        **_millm(activations),
    }


def whole(completion: ev.Completion, ctx: Context) -> dict:
    choice = completion.choices[0]
    content = [{"type": "text", "text": choice.text}] if choice.text or not choice.calls else []
    content += [
        {"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": json.loads(c.arguments)}
        for c in choice.calls
    ]
    counted = completion.usage
    usage = _usage(counted.prompt_tokens, counted.completion_tokens)
    return message(ctx, content, choice.finished, usage, completion.activations)


async def stream(events: AsyncIterator[ev.Event], ctx: Context) -> AsyncIterator[bytes]:
    def event(kind: str, **fields) -> bytes:
        return framing.sse({"type": kind, **fields}, kind)

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
                yield event("content_block_start", index=index, content_block={"type": "text", "text": ""})
            yield event("content_block_delta", index=index, delta={"type": "text_delta", "text": e.text})
        elif isinstance(e, ev.CallStarted):
            for frame in close():
                yield frame
            index, open_kind = next(blocks), "tool_use"
            block = {"type": "tool_use", "id": _tool_id(e.id), "name": e.name, "input": {}}
            yield event("content_block_start", index=index, content_block=block)
        elif isinstance(e, ev.CallArguments):
            for piece in e.fragments():
                yield event(
                    "content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": piece}
                )
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
    delta = _stopped(finished and finished.reason, finished and finished.stop)
    yield event("message_delta", delta=delta, usage=totals, **_millm(activations))
    yield event("message_stop")
