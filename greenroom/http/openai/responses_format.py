"""OpenAI's Responses answers, written from the one event stream (http/pipeline/events.py): `whole`
turns the folded `Completion` into the Response object, `stream` the typed events into the
events the SDKs read, each named and numbered (sequence_number), in order: response.created,
response.in_progress, per output item output_item.added, (message) content_part.added,
output_text.delta…, output_text.done, content_part.done, (function call)
function_call_arguments.delta… (ARGUMENT_FRAGMENT characters each), .done, output_item.done;
then response.completed — response.incomplete when max_output_tokens cut it — or, on a failure,
error and response.failed. Pure but for `kept`, the route's step that stores a finished Response.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import attrs

from greenroom.http.core import framing
from greenroom.http.core.contracts import AnyOf, Anything, Choice, ListOf, Named, Schema, Text
from greenroom.http.core.objects import AN_OBJECT, BOOLEAN, COUNT, FLOAT, INTEGER, TEXT, Events, Object, const, or_null
from greenroom.http.openai import openai_params
from greenroom.http.pipeline import events as ev
from greenroom.http.pipeline import sae_activations

# --- the objects (openapi.py renders them) -------------------------------------------------

OUTPUT_TEXT = Object(
    name="OutputText",
    fields={
        "type": const("output_text"),
        "text": TEXT,
        "annotations": ListOf(items=Anything()),
        "logprobs": ListOf(items=Anything()),
    },
)
_STATUS = Choice(values=("in_progress", "completed"))
MESSAGE_ITEM = Object(
    name="ResponseMessage",
    fields={
        "id": TEXT,
        "type": const("message"),
        "status": _STATUS,
        "role": const("assistant"),
        "content": ListOf(items=OUTPUT_TEXT),
    },
)
CALL_ITEM = Object(
    name="ResponseFunctionCall",
    fields={
        "id": TEXT,
        "type": const("function_call"),
        "status": _STATUS,
        "call_id": TEXT,
        "name": TEXT,
        "arguments": Text(description="JSON text"),
    },
)
OUTPUT_ITEM = AnyOf(options=(MESSAGE_ITEM, CALL_ITEM))
USAGE = Object(
    name="ResponseUsage",
    fields={
        "input_tokens": COUNT,
        "input_tokens_details": Object(name="InputTokensDetails", fields={"cached_tokens": COUNT}),
        "output_tokens": COUNT,
        "output_tokens_details": Object(name="OutputTokensDetails", fields={"reasoning_tokens": COUNT}),
        "total_tokens": COUNT,
    },
)
ERROR = Object(name="ResponseError", fields={"code": TEXT, "message": TEXT})
INCOMPLETE = Object(name="IncompleteDetails", fields={"reason": const("max_output_tokens")})
TEXT_FORMAT = Object(name="ResponseTextConfig", fields={"format": AN_OBJECT})
TOOL = Object(
    name="ResponseTool",
    fields={
        "type": const("function"),
        "name": TEXT,
        "description": or_null(TEXT),
        "parameters": or_null(AN_OBJECT),
        "strict": Schema(schema={"type": "boolean"}, description="true unless sent false (OpenAI's default)"),
    },
)
RESPONSE = Object(
    name="Response",
    fields={
        "id": TEXT,
        "object": const("response"),
        "created_at": INTEGER,
        "status": Choice(values=("in_progress", "completed", "incomplete", "failed")),
        "error": or_null(ERROR),
        "incomplete_details": or_null(INCOMPLETE),
        "instructions": or_null(TEXT),
        "max_output_tokens": or_null(INTEGER),
        "model": TEXT,
        "output": ListOf(items=Named(name="ResponseOutputItem", field=OUTPUT_ITEM)),
        "parallel_tool_calls": BOOLEAN,
        "previous_response_id": or_null(TEXT),
        "store": BOOLEAN,
        "temperature": FLOAT,
        "text": TEXT_FORMAT,
        "tool_choice": Anything(description="As the request sent it"),
        "tools": ListOf(items=TOOL, description="The function tools sent, as OpenAI echoes them"),
        "top_p": FLOAT,
        "truncation": const("disabled"),
        "metadata": Schema(schema={"type": "object", "properties": {}, "additionalProperties": {"type": "string"}}),
        "usage": USAGE.ref("Absent until the response is done (OpenAI's schema)"),
        "millm": sae_activations.MILLM.ref("Only when the request sent return_sae_activations"),
    },
    optional=("usage", "millm"),
    description="status incomplete when max_output_tokens cut the answer",
)
_WHERE = {"item_id": TEXT, "output_index": COUNT}
_PART = {**_WHERE, "content_index": COUNT}
EVENTS = Events.of(
    "ResponseStreamEvent",
    {
        **{
            f"response.{kind}": {"response": RESPONSE.ref()}
            for kind in ("created", "in_progress", "completed", "incomplete", "failed")
        },
        **{f"response.output_item.{kind}": {"output_index": COUNT, "item": OUTPUT_ITEM} for kind in ("added", "done")},
        **{f"response.content_part.{kind}": {**_PART, "part": OUTPUT_TEXT} for kind in ("added", "done")},
        "response.output_text.delta": {**_PART, "delta": TEXT, "logprobs": ListOf(items=Anything())},
        "response.output_text.done": {**_PART, "text": TEXT, "logprobs": ListOf(items=Anything())},
        "response.function_call_arguments.delta": {**_WHERE, "delta": TEXT},
        "response.function_call_arguments.done": {**_WHERE, "name": TEXT, "arguments": TEXT},
        "error": {"code": TEXT, "message": TEXT, "param": or_null(TEXT)},
    },
    {"sequence_number": COUNT},
)
OBJECTS = (RESPONSE, EVENTS)


@attrs.frozen
class Context:
    """The request's side of its Response."""

    id: str
    created: int
    model: str
    body: dict  # the Responses request as sent: what the Response echoes
    store: bool  # store, as sent (true by default)


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _echoed(tool: dict) -> dict:
    """A function tool as OpenAI echoes it: description and parameters null when not sent, strict
    true unless sent false (OpenAI's default; calls are validated against the parameters either way)."""
    return TOOL.build(
        type="function",
        name=tool["name"],
        description=tool.get("description"),
        parameters=tool.get("parameters"),
        strict=tool.get("strict") is not False,
    )


def _part(text: str) -> dict:
    return OUTPUT_TEXT.build(type="output_text", text=text, annotations=[], logprobs=[])


def message_item(text: str, item: str, status: str = "completed") -> dict:
    part = _part(text)
    return MESSAGE_ITEM.build(
        id=item,
        type="message",
        status=status,
        role="assistant",
        content=[part] if text or status == "completed" else [],
    )


def call_item(call_id: str, name: str, arguments: str, item: str, status: str = "completed") -> dict:
    return CALL_ITEM.build(
        id=item, type="function_call", status=status, call_id=call_id, name=name, arguments=arguments
    )


def _usage(counted: ev.Usage) -> dict:
    details = USAGE.fields
    return USAGE.build(
        input_tokens=counted.prompt_tokens,
        input_tokens_details=details["input_tokens_details"].build(cached_tokens=0),
        output_tokens=counted.completion_tokens,
        output_tokens_details=details["output_tokens_details"].build(reasoning_tokens=0),
        total_tokens=counted.prompt_tokens + counted.completion_tokens,
    )


def response(
    ctx: Context,
    status: str,
    output: list[dict],
    usage: ev.Usage | None = None,
    error: dict | None = None,
    activations: ev.Read | None = None,
) -> dict:
    body = ctx.body

    def sent(key: str, default):
        return default if body.get(key) is None else body[key]

    extra = {}
    if usage is not None:  # OpenAI's schema has usage absent, not null, until it is known
        extra["usage"] = _usage(usage)
    if activations is not None:
        extra["millm"] = sae_activations.millm(activations)
    return RESPONSE.build(
        id=ctx.id,
        object="response",
        created_at=ctx.created,
        status=status,
        error=error,
        incomplete_details=INCOMPLETE.build(reason="max_output_tokens") if status == "incomplete" else None,
        instructions=body.get("instructions"),
        max_output_tokens=body.get("max_output_tokens"),
        model=ctx.model,
        output=output,
        parallel_tool_calls=sent("parallel_tool_calls", True),
        previous_response_id=body.get("previous_response_id"),
        store=ctx.store,
        temperature=sent("temperature", openai_params.TEMPERATURE.default),
        text=TEXT_FORMAT.build(format=(body.get("text") or {}).get("format") or {"type": "text"}),
        tool_choice=sent("tool_choice", "auto"),
        tools=[_echoed(tool) for tool in sent("tools", [])],
        top_p=sent("top_p", openai_params.TOP_P.default),
        truncation="disabled",
        metadata=sent("metadata", {}),
        **extra,
    )


def finished(
    ctx: Context, finish_reason: str | None, output: list[dict], usage: ev.Usage | None, activations: ev.Read | None
) -> dict:
    """The finished Response: completed, or incomplete where max_output_tokens cut it."""
    status = "incomplete" if finish_reason == "length" else "completed"
    return response(ctx, status, output, usage, activations=activations)


def whole(completion: ev.Completion, ctx: Context) -> dict:
    choice = completion.choices[0]
    output = [message_item(choice.text, item_id("msg"))] if choice.text or not choice.calls else []
    output += [call_item(c.id, c.name, c.arguments, item_id("fc")) for c in choice.calls]
    return finished(ctx, choice.finished.reason, output, completion.usage, completion.activations)


async def stream(
    events: AsyncIterator[ev.Event], ctx: Context, kept: Callable[[dict], Awaitable[dict]]
) -> AsyncIterator[bytes]:
    """The typed events; `kept` stores the finished Response (and says whether it could)."""
    numbers = itertools.count()

    def event(kind: str, **fields) -> bytes:
        return framing.sse(EVENTS.build(kind, **fields, sequence_number=next(numbers)), kind)

    output: list[dict] = []
    yield event("response.created", response=response(ctx, "in_progress", []))
    yield event("response.in_progress", response=response(ctx, "in_progress", []))

    def close() -> list[bytes]:
        """The events that finish the open item, if one is."""
        if not output or output[-1]["status"] != "in_progress":
            return []
        item, index = output[-1], len(output) - 1
        item["status"] = "completed"
        if item["type"] == "function_call":
            done = event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
            return [done, event("response.output_item.done", output_index=index, item=item)]
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            event("response.output_text.done", **where, text=part["text"], logprobs=[]),
            event("response.content_part.done", **where, part=part),
            event("response.output_item.done", output_index=index, item=item),
        ]

    usage = reason = activations = None
    async for e in events:
        if isinstance(e, ev.Failure):  # the one place a failure becomes this surface's events
            error = e.error
            yield event("error", code=error.code, message=error.message, param=error.param)
            failed = response(ctx, "failed", output, error=ERROR.build(code=error.code, message=error.message))
            yield event("response.failed", response=failed)
            return
        if isinstance(e, ev.Delta):
            if not output or output[-1]["type"] != "message" or output[-1]["status"] != "in_progress":
                for frame in close():
                    yield frame
                output.append(message_item("", item_id("msg"), "in_progress"))
                item = output[-1]
                yield event("response.output_item.added", output_index=len(output) - 1, item=item)
                item["content"] = [_part("")]
                yield event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=len(output) - 1,
                    content_index=0,
                    part=item["content"][0],
                )
            output[-1]["content"][0]["text"] += e.text
            yield event(
                "response.output_text.delta",
                item_id=output[-1]["id"],
                output_index=len(output) - 1,
                content_index=0,
                delta=e.text,
                logprobs=[],
            )
        elif isinstance(e, ev.CallStarted):
            for frame in close():
                yield frame
            output.append(call_item(e.id, e.name, "", item_id("fc"), "in_progress"))
            yield event("response.output_item.added", output_index=len(output) - 1, item=output[-1])
        elif isinstance(e, ev.CallArguments):
            for piece in e.fragments():
                output[-1]["arguments"] += piece
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=output[-1]["id"],
                    output_index=len(output) - 1,
                    delta=piece,
                )
        elif isinstance(e, ev.Usage):
            usage = e
        elif isinstance(e, ev.Finished):
            reason = e.reason
        elif isinstance(e, ev.Activations):
            activations = e.read
    for frame in close():
        yield frame
    done = await kept(finished(ctx, reason, output, usage, activations))
    yield event(f"response.{done['status']}", response=done)
