"""Ollama's answers to /api/generate and /api/chat, formatted from the neutral event stream
(http/pipeline/events.py): a streamed answer's NDJSON lines, a whole answer's `done: true`
object. What a line holds comes from the events and the job's `Context` alone.

Ollama's rules: one line per batch of text (a `Delta`); a tool call one line of its own, its
name and arguments (an object) once complete, after the content before it; reported tokens
ride on the next line written; `done_reason` is "stop" where the answer stopped after calls
(Ollama has no tool_calls reason); the metrics come from the engine's figures and the job's
timing. A stream that fails ends with the flat error envelope as its last line, no `done`.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import AsyncIterator, Callable

import attrs

from greenroom.errors import GreenroomError
from greenroom.http.core import framing
from greenroom.http.pipeline import events as ev

log = logging.getLogger("greenroom.http.ollama")


def created_at() -> str:
    """Now, RFC 3339, UTC: every object's `created_at`."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@attrs.frozen
class Context:
    """What an answer carries besides its events."""

    model: str  # as the client sent it (echoed)
    chat: bool  # /api/chat (a `message`) or /api/generate (a `response`)
    rid: str  # the request id the error envelope names
    started_ns: int  # when the request arrived (clock's time)
    load_ns: int  # how long loading the model took
    logprobs: bool  # asked for: a whole answer carries `logprobs`, even empty
    clock: Callable[[], int] = time.monotonic_ns  # total_duration's
    now: Callable[[], str] = created_at


async def lines(events: AsyncIterator[ev.Event], ctx: Context) -> AsyncIterator[bytes]:
    """A streamed answer's NDJSON lines; never a stream cut without a last line (a
    GreenroomError or another exception raised on the way is the error envelope's line)."""
    stream = _Stream(ctx)
    try:
        async for event in events:
            out = stream.line(event)
            if out is not None:
                yield framing.ndjson(out)
    except GreenroomError as exc:
        yield framing.ndjson(exc.ollama_body(ctx.rid))
    except Exception as exc:
        log.exception("Ollama stream %s failed", ctx.rid)
        yield framing.ndjson(
            GreenroomError("internal_error", f"internal error: {type(exc).__name__}").ollama_body(ctx.rid)
        )


def whole(completion: ev.Completion, ctx: Context) -> dict:
    """A whole answer: the `done: true` object, with every reported token's `logprobs` when
    they were asked for."""
    (choice,) = completion.choices  # Ollama asks for one
    out = _head(ctx)
    if ctx.chat:
        out["message"] = _message(choice.text, [_call(c.name, c.arguments) for c in choice.calls])
    else:
        out["response"] = choice.text
    if ctx.logprobs:
        out["logprobs"] = _logprobs(choice.tokens)
    return {**out, **_done(ctx, completion.usage.prompt_tokens, choice.finished)}


class _Stream:
    """One streamed answer's state: the tokens waiting for a line, the calls' names."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.tokens: list = []  # reported, not yet written: they ride on the next line
        self.names: dict[int, str] = {}
        self.prompt_tokens = 0

    def line(self, event: ev.Event) -> dict | None:
        """The line `event` writes, if it writes one."""
        if isinstance(event, ev.Tokens):
            self.tokens += event.tokens
        elif isinstance(event, ev.Delta):
            return self._line(event.text)
        elif isinstance(event, ev.CallStarted):
            self.names[event.call] = event.name
        elif isinstance(event, ev.CallArguments):  # the call is complete: name and arguments in one line
            return self._line("", [_call(self.names[event.call], event.arguments)])
        elif isinstance(event, ev.Usage):
            self.prompt_tokens = event.prompt_tokens
        elif isinstance(event, ev.Finished):
            empty = {"message": _message("")} if self.ctx.chat else {"response": ""}
            return {**_head(self.ctx), **empty, **_done(self.ctx, self.prompt_tokens, event), **self._reported()}
        elif isinstance(event, ev.Failure):
            return event.error.ollama_body(self.ctx.rid)
        return None  # Activations: Ollama has no place for them

    def _line(self, text: str, calls: list | None = None) -> dict:
        body = {"message": _message(text, calls)} if self.ctx.chat else {"response": text}
        return {**_head(self.ctx), **body, "done": False, **self._reported()}

    def _reported(self) -> dict:
        if not self.tokens:
            return {}
        out = {"logprobs": _logprobs(self.tokens)}
        self.tokens = []
        return out


def _head(ctx: Context) -> dict:
    return {"model": ctx.model, "created_at": ctx.now()}


def _message(content: str, calls: list | None = None) -> dict:
    out = {"role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = calls
    return out


def _call(name: str, arguments: str) -> dict:
    """A call as Ollama writes it: its arguments an object, not JSON text."""
    return {"function": {"name": name, "arguments": json.loads(arguments)}}


def _done(ctx: Context, prompt_tokens: int, finished: ev.Finished) -> dict:
    stats = finished.stats
    return {
        "done": True,
        "done_reason": "stop" if finished.reason == "tool_calls" else finished.reason,
        "total_duration": ctx.clock() - ctx.started_ns,
        "load_duration": ctx.load_ns,
        "prompt_eval_count": prompt_tokens,
        "prompt_eval_duration": int(stats.prefill_s * 1e9) if stats else 0,
        "eval_count": finished.completion_tokens,
        "eval_duration": int(stats.decode_s * 1e9) if stats else 0,
    }


def _logprobs(tokens: list) -> list[dict]:
    """Reported tokens (protocol.Text.logprobs' records) as Ollama writes them: token,
    logprob, bytes and, when asked for, top_logprobs."""
    return [
        {
            "token": text,
            "logprob": logprob,
            "bytes": list(text.encode("utf-8")),
            **(
                {"top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))} for _, t, lp in top]}
                if top
                else {}
            ),
        }
        for _, text, logprob, top in tokens
    ]
