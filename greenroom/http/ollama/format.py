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

import json
import logging
import time
from collections.abc import AsyncIterator, Callable

import attrs

from greenroom.errors import GreenroomError
from greenroom.http.core import framing
from greenroom.http.core.contracts import AnyOf, Choice, ListOf, Named, Schema, Text
from greenroom.http.core.objects import AN_OBJECT, COUNT, FLOAT, TEXT, Object, const
from greenroom.http.pipeline import events as ev

log = logging.getLogger("greenroom.http.ollama")


_second: list = [None, ""]  # the last second created_at wrote, and its text up to the seconds


def created_at() -> str:
    """Now, RFC 3339, UTC, to the microsecond: every object's `created_at` (a streamed line's
    too: the date and time are formatted once a second, where datetime's cost a tenth of the
    front end's CPU per Ollama line)."""
    second, micros = divmod(time.time_ns() // 1000, 1_000_000)
    if second != _second[0]:
        _second[:] = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{_second[1]}.{micros:06d}Z"


# --- the objects (openapi.py renders them) -------------------------------------------------

_TOKEN = {"token": TEXT, "logprob": FLOAT, "bytes": ListOf(items=COUNT)}
TOKEN = Object(
    name="OllamaLogprob",
    fields={**_TOKEN, "top_logprobs": ListOf(items=Object(name="OllamaTopLogprob", fields=_TOKEN))},
    optional=("top_logprobs",),
)
CALL = Object(
    name="OllamaToolCall",
    fields={"function": Object(name="OllamaFunction", fields={"name": TEXT, "arguments": AN_OBJECT})},
)
MESSAGE = Object(
    name="OllamaMessage",
    fields={"role": const("assistant"), "content": TEXT, "tool_calls": ListOf(items=CALL)},
    optional=("tool_calls",),
)
_DURATIONS = (
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)
_LOGPROBS = ListOf(
    items=TOKEN,
    description="With logprobs: the tokens of this line (of the answer, not streamed), each with its "
    "log-probability at temperature 1 and, with top_logprobs, the most probable at its position",
)
_HEAD = {"model": TEXT, "created_at": Text(description="RFC 3339, UTC")}
_ERROR = Schema(schema={"$ref": "#/components/schemas/OllamaError"})  # errors.py's flat envelope


def _answers(name: str, text: dict) -> tuple[Object, Object, Named]:
    """The done: true object, one streamed delta line, and a line of the stream: either, or the
    error envelope."""
    done = Object(
        name=name,
        fields={
            **_HEAD,
            **text,
            "done": const(True),
            "done_reason": Choice(
                values=("stop", "length", "load", "unload"), description="load or unload: no prompt was sent"
            ),
            **dict.fromkeys(_DURATIONS, COUNT),
            "logprobs": _LOGPROBS,
        },
        optional=(*_DURATIONS, "logprobs"),
        description="Durations in nanoseconds; absent on a load or unload",
    )
    delta = Object(
        name=f"{name}Delta",
        fields={**_HEAD, **text, "done": const(False), "logprobs": _LOGPROBS},
        optional=("logprobs",),
    )
    return done, delta, Named(name=f"{name}Line", field=AnyOf(options=(delta, done.ref(), _ERROR)))


GENERATED, GENERATED_DELTA, GENERATED_LINE = _answers("OllamaGenerated", {"response": TEXT})
CHATTED, CHATTED_DELTA, CHATTED_LINE = _answers("OllamaChatted", {"message": MESSAGE})
OBJECTS = (GENERATED, GENERATED_LINE, CHATTED, CHATTED_LINE)


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
                yield out if isinstance(out, bytes) else framing.ndjson(out)
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
    return (CHATTED if ctx.chat else GENERATED).build(
        **out, **_done(ctx, completion.usage.prompt_tokens, choice.finished)
    )


def loaded(model: str, chat: bool, reason: str) -> dict:
    """The answer to a request without a prompt: the model loaded (or unloaded), nothing generated."""
    text = {"message": _message("")} if chat else {"response": ""}
    return (CHATTED if chat else GENERATED).build(
        model=model, created_at=created_at(), **text, done=True, done_reason=reason
    )


class _Stream:
    """One streamed answer's state: the tokens waiting for a line, the calls' names."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.tokens: list = []  # reported, not yet written: they ride on the next line
        self.names: dict[int, str] = {}
        self.prompt_tokens = 0
        self._text: framing.Template | None = None  # a line of text alone (framing.py)

    def line(self, event: ev.Event) -> dict | bytes | None:
        """The line `event` writes, if it writes one: text alone already a line."""
        if isinstance(event, ev.Tokens):
            self.tokens += event.tokens
        elif isinstance(event, ev.Delta):
            if self.tokens:  # reported tokens ride on it
                return self._line(event.text)
            if self._text is None:
                self._text = framing.Template.of(
                    lambda created, text: framing.ndjson(self._line(text, created=created)), holes=2
                )
            return self._text.fill(self.ctx.now(), event.text)
        elif isinstance(event, ev.CallStarted):
            self.names[event.call] = event.name
        elif isinstance(event, ev.CallArguments):  # the call is complete: name and arguments in one line
            return self._line("", [_call(self.names[event.call], event.arguments)])
        elif isinstance(event, ev.Usage):
            self.prompt_tokens = event.prompt_tokens
        elif isinstance(event, ev.Finished):
            empty = {"message": _message("")} if self.ctx.chat else {"response": ""}
            done = CHATTED if self.ctx.chat else GENERATED
            return done.build(
                **_head(self.ctx), **empty, **_done(self.ctx, self.prompt_tokens, event), **self._reported()
            )
        elif isinstance(event, ev.Failure):
            return event.error.ollama_body(self.ctx.rid)
        return None  # Activations: Ollama has no place for them

    def _line(self, text: str, calls: list | None = None, created: str | None = None) -> dict:
        body = {"message": _message(text, calls)} if self.ctx.chat else {"response": text}
        delta = CHATTED_DELTA if self.ctx.chat else GENERATED_DELTA
        return delta.build(**_head(self.ctx, created), **body, done=False, **self._reported())

    def _reported(self) -> dict:
        if not self.tokens:
            return {}
        out = {"logprobs": _logprobs(self.tokens)}
        self.tokens = []
        return out


def _head(ctx: Context, created: str | None = None) -> dict:
    return {"model": ctx.model, "created_at": created or ctx.now()}


def _message(content: str, calls: list | None = None) -> dict:
    return MESSAGE.build(role="assistant", content=content, **({"tool_calls": calls} if calls else {}))


def _call(name: str, arguments: str) -> dict:
    """A call as Ollama writes it: its arguments an object, not JSON text."""
    return CALL.build(function=CALL.fields["function"].build(name=name, arguments=json.loads(arguments)))


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
        TOKEN.build(
            token=text,
            logprob=logprob,
            bytes=list(text.encode("utf-8")),
            **(
                {"top_logprobs": [_TOP.build(token=t, logprob=lp, bytes=list(t.encode("utf-8"))) for _, t, lp in top]}
                if top
                else {}
            ),
        )
        for _, text, logprob, top in tokens
    ]


_TOP = TOKEN.fields["top_logprobs"].items
