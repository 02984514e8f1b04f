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
    return {
        "prompt_tokens": counted.prompt_tokens,
        "completion_tokens": counted.completion_tokens,
        "total_tokens": counted.prompt_tokens + counted.completion_tokens,
    }


def message(choice: Choice) -> dict:
    """OpenAI's assistant message: with calls, `content` is null unless there is text."""
    if not choice.calls:
        return {"role": "assistant", "content": choice.text}
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in choice.calls
    ]
    return {"role": "assistant", "content": choice.text or None, "tool_calls": calls}


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
    choices = [_choice(choice, ctx) for choice in completion.choices]
    body = {
        "id": ctx.rid,
        "object": "chat.completion" if ctx.chat else "text_completion",
        "created": ctx.created,
        "model": ctx.model,
        "system_fingerprint": ctx.fingerprint,
        "choices": choices,
        "usage": usage(completion.usage),
    }
    if ctx.extras is not None:
        block = body["x_needle"] = x_needle(completion.choices[0], ctx)
        if block["reasoning"]:
            choices[0]["message"]["reasoning_content"] = block["reasoning"]
    if completion.activations is not None:
        body["millm"] = sae_activations.millm(completion.activations)
    return body


def _choice(choice: Choice, ctx: Context) -> dict:
    written = ctx.writers[choice.index](choice.tokens) if ctx.writers else None
    if ctx.chat:  # refusal: OpenAI's, required; no refusal is kept apart from content
        out = {"index": choice.index, "message": {**message(choice), "refusal": None}, "logprobs": written}
    else:
        out = {"index": choice.index, "text": choice.text, "logprobs": written}
    return {**out, "finish_reason": choice.finished.reason, "stop_reason": choice.finished.stop}


async def stream(events: AsyncIterator[Event], ctx: Context) -> AsyncIterator[bytes]:
    """The chunks as server-sent events; [DONE] ends every stream."""
    async for chunk in _chunks(events, ctx):
        if isinstance(chunk, Failure):  # the one place a failure becomes this surface's error event
            yield framing.sse_error(chunk.error.openai_body())
        else:
            yield framing.sse(chunk)
    yield framing.SSE_DONE


async def _chunks(events: AsyncIterator[Event], ctx: Context) -> AsyncIterator[dict | Failure]:
    """The chunks, and a Failure as it came (it ends the stream)."""
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

    def chunk(index: int, delta, finished: Finished | None = None, **extra) -> dict:
        written = None
        if unsent.get(index):
            written, unsent[index] = ctx.writers[index](unsent[index]), []
        if ctx.chat:
            choice = {"index": index, "delta": delta or {}, "logprobs": written}
        else:
            choice = {"index": index, "text": delta or "", "logprobs": written}
        choice["finish_reason"] = finished and finished.reason
        if finished is not None:
            choice["stop_reason"] = finished.stop
        if ctx.include_usage:  # OpenAI's rule: null on every chunk but the usage-only one
            extra["usage"] = None
        elif finished is not None and last:
            extra["usage"] = usage(counted)
        return {**head, "choices": [choice], **extra}

    if ctx.chat:
        for i in range(ctx.choices):
            yield chunk(i, {"role": "assistant", "content": ""})
    read = None
    async for event in events:
        if isinstance(event, Failure):
            yield event
            return
        if ctx.extras is not None and getattr(event, "choice", None) == 0:
            first.add(event)
        if isinstance(event, Tokens):
            if ctx.writers:
                unsent[event.choice] += event.tokens
        elif isinstance(event, Delta):
            yield chunk(event.choice, {"content": event.text} if ctx.chat else event.text)
        elif isinstance(event, CallStarted):
            call = {"index": event.call, "id": event.id, "type": "function"}
            yield chunk(event.choice, {"tool_calls": [{**call, "function": {"name": event.name, "arguments": ""}}]})
        elif isinstance(event, CallArguments):
            for piece in event.fragments():
                yield chunk(event.choice, {"tool_calls": [{"index": event.call, "function": {"arguments": piece}}]})
        elif isinstance(event, Usage):
            counted, last = event, True
        elif isinstance(event, Finished):
            extra = {"x_needle": x_needle(first, ctx)} if ctx.extras is not None and event.choice == 0 else {}
            yield chunk(event.choice, None, event, **extra)
            last = False
        elif isinstance(event, Activations):
            read = event.read
    if ctx.include_usage:  # OpenAI's usage-only chunk
        yield {**head, "choices": [], "usage": usage(counted)}
    if read is not None:  # the spec: one last chunk with no choices, before [DONE]
        yield {
            **head,
            "choices": [],
            "millm": sae_activations.millm(read),
            **({"usage": None} if ctx.include_usage else {}),
        }
