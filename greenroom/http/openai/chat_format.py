"""Chat and text completions' answers, written from the one event stream (http/pipeline/events.py):
`stream` turns the typed events into OpenAI's chunks, framed as server-sent events; `whole` turns
the folded `Completion` into the chat (or text) completion. Pure: events or a Completion and the
request's `Context` in, frames or a body out.

A stream, as OpenAI writes one: a chat stream opens with each choice's role chunk; each text
delta, tool-call start and arguments fragment (ARGUMENT_FRAGMENT characters) is a chunk of its
choice; reported tokens ride on their choice's next chunk; each choice's finish_reason chunk
carries its stop_reason (choice 0's, x_needle too). Usage: with include_usage, null on every
chunk and whole in a last chunk without choices (clients that add chunks up count it once);
without, on the request's last finishing chunk (the spec's). Then the `millm` chunk (SAE
activations: one last chunk with no choices) and [DONE]. A failure is an `error` event after the
text that came before it, then [DONE].
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import attrs

from greenroom.http.core import framing
from greenroom.http.core.contracts import Choice as OneOf
from greenroom.http.core.contracts import ListOf, Schema, Text
from greenroom.http.core.objects import COUNT, INTEGER, NONE, TEXT, Object, const, or_null
from greenroom.http.openai import logprobs, needle
from greenroom.http.pipeline import sae_activations
from greenroom.http.pipeline.events import (
    Activations,
    CallArguments,
    CallStarted,
    Choice,
    Completion,
    Delta,
    Event,
    Failure,
    Finished,
    Tokens,
    Usage,
)

# --- the objects (openapi.py renders them) -------------------------------------------------

USAGE = Object(name="Usage", fields={"prompt_tokens": COUNT, "completion_tokens": COUNT, "total_tokens": COUNT})
FUNCTION_CALL = Object(
    name="FunctionCall",
    fields={"name": TEXT, "arguments": Text(description="The arguments as JSON text (an object)")},
)
TOOL_CALL = Object(name="ToolCall", fields={"id": TEXT, "type": const("function"), "function": FUNCTION_CALL})
MESSAGE = Object(
    name="ChatMessage",
    fields={
        "role": const("assistant"),
        "content": or_null(TEXT),
        "refusal": Schema(
            schema=NONE.schema, description="OpenAI's field (required, nullable): no refusal is kept apart from content"
        ),
        "tool_calls": ListOf(items=TOOL_CALL, min_items=1),
        "reasoning_content": Text(description="The text around tool calls (choice 0, with x_needle)"),
    },
    optional=("tool_calls", "reasoning_content"),
    description="content is null only beside tool_calls",
)
CALL_FRAGMENT = Object(
    name="FunctionCallFragment", fields={"name": TEXT, "arguments": TEXT}, optional=("name", "arguments")
)
CHUNK_TOOL_CALL = Object(
    name="ToolCallFragment",
    fields={"index": COUNT, "id": TEXT, "type": const("function"), "function": CALL_FRAGMENT},
    optional=("id", "type"),
    description="A call's id, type and name first, then fragments of its arguments",
)
DELTA = Object(
    name="ChatDelta",
    fields={"role": const("assistant"), "content": TEXT, "tool_calls": ListOf(items=CHUNK_TOOL_CALL, min_items=1)},
    optional=("role", "content", "tool_calls"),
)
_FINISH = ("stop", "length")


def _choice_object(name: str, content: dict, *, streamed: bool, written: Object, finish: tuple) -> Object:
    """One choice of a completion: its content fields between `index` and `finish_reason`
    (null on every streamed chunk but the one that ends the choice), and on a generated
    choice's end vLLM's `stop_reason`."""
    return Object(
        name=name,
        fields={
            "index": COUNT,
            **content,
            "logprobs": or_null(written.ref()),
            "finish_reason": or_null(OneOf(values=finish)) if streamed else OneOf(values=finish),
            "stop_reason": or_null(
                Text(description="The stop string that ended the choice (vLLM's field); null: none did")
            ),
        },
        optional=("stop_reason",),
    )


CHAT_CHOICE = _choice_object(
    "ChatChoice", {"message": MESSAGE}, streamed=False, written=logprobs.CHAT_LOGPROBS, finish=(*_FINISH, "tool_calls")
)
# with logprobs, the tokens of the chunk's delta (null on a chunk that has none)
CHUNK_CHOICE = _choice_object(
    "ChatChunkChoice", {"delta": DELTA}, streamed=True, written=logprobs.CHAT_LOGPROBS, finish=(*_FINISH, "tool_calls")
)
TEXT_CHOICE = _choice_object(
    "TextChoice", {"text": TEXT}, streamed=False, written=logprobs.COMPLETION_LOGPROBS, finish=_FINISH
)
TEXT_CHUNK_CHOICE = _choice_object(
    "TextChunkChoice", {"text": TEXT}, streamed=True, written=logprobs.COMPLETION_LOGPROBS, finish=_FINISH
)


def _completion_object(name: str, kind: str, choice: Object, *, chunk: bool, x_needle: bool = False) -> Object:
    """A chat or text completion (or one streamed chunk of it): the fields both share."""
    fields = {
        "id": TEXT,
        "object": const(kind),
        "created": INTEGER,
        "model": TEXT,
        "choices": ListOf(
            items=choice, description="Empty on the usage-only chunk of stream_options.include_usage" * chunk
        ),
    }
    if chunk:
        fields["usage"] = or_null(
            USAGE.ref(),
            "With stream_options.include_usage, null on every chunk but the usage-only one (OpenAI's rule); "
            "without, on the request's last finishing chunk alone",
        )
    else:
        fields["system_fingerprint"] = Schema(
            schema={"type": "string", "pattern": "^millm:"},
            description="millm:<model>@<revision>:<dtype>/<quantization>:<engine>",
        )
        fields["usage"] = USAGE.ref()
    fields["millm"] = sae_activations.MILLM.ref(
        ("On the last chunk (choices: [], before [DONE])" if chunk else "Only when the request sent")
        + " return_sae_activations"
    )
    if x_needle:
        fields["x_needle"] = needle.X_NEEDLE.ref(
            ("On the chunk that finishes choice 0" if chunk else "Generated answers only (not scoring)")
            + "; absent when the server runs with --no-extras"
        )
    optional = ("usage", "millm", "x_needle") if chunk else ("millm", "x_needle")
    return Object(name=name, fields=fields, optional=tuple(o for o in optional if o in fields))


CHAT_COMPLETION = _completion_object("ChatCompletion", "chat.completion", CHAT_CHOICE, chunk=False, x_needle=True)
CHAT_COMPLETION_CHUNK = _completion_object(
    "ChatCompletionChunk", "chat.completion.chunk", CHUNK_CHOICE, chunk=True, x_needle=True
)
TEXT_COMPLETION = _completion_object("TextCompletion", "text_completion", TEXT_CHOICE, chunk=False)
TEXT_COMPLETION_CHUNK = _completion_object("TextCompletionChunk", "text_completion", TEXT_CHUNK_CHOICE, chunk=True)
OBJECTS = (CHAT_COMPLETION, CHAT_COMPLETION_CHUNK, TEXT_COMPLETION, TEXT_COMPLETION_CHUNK)


@attrs.frozen
class Extras:
    """What x_needle needs beside the engine's figures: the request's conversation, and the
    warnings (each field not read, and any note on how it was served)."""

    conversation: list[dict]
    warnings: list[str]


@attrs.frozen
class Context:
    """The request's side of its answer."""

    rid: str
    model: str
    choices: int
    prompt_tokens: int
    chat: bool = True  # a chat completion; False: a text completion
    writers: dict[int, logprobs.Writer] = attrs.Factory(dict)  # logprobs.writers ({}: none asked for)
    include_usage: bool = False  # stream_options.include_usage
    fingerprint: str = ""  # a whole answer's system_fingerprint
    extras: Extras | None = None  # the x_needle block
    created: int = attrs.Factory(lambda: int(time.time()))


def usage(counted: Usage) -> dict:
    return USAGE.build(
        prompt_tokens=counted.prompt_tokens,
        completion_tokens=counted.completion_tokens,
        total_tokens=counted.prompt_tokens + counted.completion_tokens,
    )


def content(choice: Choice) -> str | None:
    """OpenAI's assistant content: with calls, null unless there is text."""
    return choice.text or None if choice.calls else choice.text


def message(choice: Choice, reasoning: str = "") -> dict:
    """OpenAI's assistant message (refusal: OpenAI's, required; no refusal is kept apart from
    content), with the text around its calls where x_needle has it."""
    calls = [
        TOOL_CALL.build(id=c.id, type="function", function=FUNCTION_CALL.build(name=c.name, arguments=c.arguments))
        for c in choice.calls
    ]
    return MESSAGE.build(
        role="assistant",
        content=content(choice),
        **({"tool_calls": calls} if calls else {}),
        refusal=None,
        **({"reasoning_content": reasoning} if reasoning else {}),
    )


def x_needle(choice: Choice, ctx: Context) -> dict:
    """The x_needle block of a finished choice (choice 0)."""
    extras, finished = ctx.extras, choice.finished
    return needle.x_needle(
        choice.text,
        choice.calls,
        finished.completion_tokens,
        finished.stats,
        ctx.prompt_tokens,
        extras.conversation,
        extras.warnings,
    )


def whole(completion: Completion, ctx: Context) -> dict:
    """The chat (or text) completion."""
    extra = {}
    reasoning = ""
    if ctx.extras is not None:
        block = extra["x_needle"] = x_needle(completion.choices[0], ctx)
        reasoning = block["reasoning"]
    if completion.activations is not None:
        extra["millm"] = sae_activations.millm(completion.activations)
    return (CHAT_COMPLETION if ctx.chat else TEXT_COMPLETION).build(
        id=ctx.rid,
        object="chat.completion" if ctx.chat else "text_completion",
        created=ctx.created,
        model=ctx.model,
        system_fingerprint=ctx.fingerprint,
        choices=[_choice(choice, ctx, reasoning * (choice.index == 0)) for choice in completion.choices],
        usage=usage(completion.usage),
        **extra,
    )


def _choice(choice: Choice, ctx: Context, reasoning: str) -> dict:
    written = ctx.writers[choice.index](choice.tokens) if ctx.writers else None
    ended = {"finish_reason": choice.finished.reason, "stop_reason": choice.finished.stop}
    if ctx.chat:
        return CHAT_CHOICE.build(index=choice.index, message=message(choice, reasoning), logprobs=written, **ended)
    return TEXT_CHOICE.build(index=choice.index, text=choice.text, logprobs=written, **ended)


async def stream(events: AsyncIterator[Event], ctx: Context) -> AsyncIterator[bytes]:
    """The chunks as server-sent events; [DONE] ends every stream, after a failure's error event
    too. A choice's text alone goes as its Template filled in (framing.py). The request's last
    finishing chunk and what follows it (the usage-only chunk, the millm chunk, [DONE]) are one
    write: no text is among them, and nothing is waited for between them."""
    chunk_object = CHAT_COMPLETION_CHUNK if ctx.chat else TEXT_COMPLETION_CHUNK
    head = {
        "id": ctx.rid,
        "object": "chat.completion.chunk" if ctx.chat else "text_completion",
        "created": ctx.created,
        "model": ctx.model,
    }
    unsent: dict[int, list] = {i: [] for i in ctx.writers}  # reported tokens, for the choice's next chunk
    first = Choice(0)  # choice 0 as it streamed: x_needle's
    counted = Usage(ctx.prompt_tokens, 0)
    last = False  # the usage came: the next finishing chunk is the request's last

    def chunk(index: int, delta, finished: Finished | None = None, **extra) -> bytes:
        written = None
        if unsent.get(index):
            written, unsent[index] = ctx.writers[index](unsent[index]), []
        ended = {"finish_reason": finished and finished.reason}
        if finished is not None:
            ended["stop_reason"] = finished.stop
        if ctx.chat:
            choice = CHUNK_CHOICE.build(index=index, delta=delta or DELTA.build(), logprobs=written, **ended)
        else:
            choice = TEXT_CHUNK_CHOICE.build(index=index, text=delta or "", logprobs=written, **ended)
        if ctx.include_usage:  # OpenAI's rule: null on every chunk but the usage-only one
            extra["usage"] = None
        elif finished is not None and last:
            extra["usage"] = usage(counted)
        return framing.sse(chunk_object.build(**head, choices=[choice], **extra))

    texts: dict[int, framing.Template] = {}

    def text(index: int, content: str) -> bytes:
        if index not in texts:
            texts[index] = framing.Template.of(
                lambda mark: chunk(index, DELTA.build(content=mark) if ctx.chat else mark)
            )
        return texts[index].fill(content)

    if ctx.chat:
        for i in range(ctx.choices):
            yield chunk(i, DELTA.build(role="assistant", content=""))
    read = None
    end: list[bytes] = []  # the request's last finishing chunk and what follows it
    async for event in events:
        if isinstance(event, Failure):  # the one place a failure becomes this surface's error event
            yield framing.sse_error(event.error.openai_body()) + framing.SSE_DONE
            return
        if ctx.extras is not None and getattr(event, "choice", None) == 0:
            first.add(event)
        if isinstance(event, Tokens):
            if ctx.writers:
                unsent[event.choice] += event.tokens
        elif isinstance(event, Delta):
            if unsent.get(event.choice):  # reported tokens ride on it
                yield chunk(event.choice, DELTA.build(content=event.text) if ctx.chat else event.text)
            else:
                yield text(event.choice, event.text)
        elif isinstance(event, CallStarted):
            call = CHUNK_TOOL_CALL.build(
                index=event.call,
                id=event.id,
                type="function",
                function=CALL_FRAGMENT.build(name=event.name, arguments=""),
            )
            yield chunk(event.choice, DELTA.build(tool_calls=[call]))
        elif isinstance(event, CallArguments):
            for piece in event.fragments():
                call = CHUNK_TOOL_CALL.build(index=event.call, function=CALL_FRAGMENT.build(arguments=piece))
                yield chunk(event.choice, DELTA.build(tool_calls=[call]))
        elif isinstance(event, Usage):
            counted, last = event, True
        elif isinstance(event, Finished):
            extra = {"x_needle": x_needle(first, ctx)} if ctx.extras is not None and event.choice == 0 else {}
            finishing = chunk(event.choice, None, event, **extra)
            if last:
                end.append(finishing)
            else:
                yield finishing
            last = False
        elif isinstance(event, Activations):
            read = event.read
    if ctx.include_usage:  # OpenAI's usage-only chunk
        end.append(framing.sse(chunk_object.build(**head, choices=[], usage=usage(counted))))
    if read is not None:  # the spec: one last chunk with no choices, before [DONE]
        millm = sae_activations.millm(read)
        end.append(
            framing.sse(
                chunk_object.build(**head, choices=[], millm=millm, **({"usage": None} if ctx.include_usage else {}))
            )
        )
    yield b"".join((*end, framing.SSE_DONE))
