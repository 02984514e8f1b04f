"""The one event stream a generation answers with, whatever the surface asked.

The engine's events (protocol.Text deltas, a Failed) become, once, surface-neutral events:
`Delta` text, `CallStarted` / `CallArguments` for tool calls (the one tool-call shaper,
engines/text/tool_calls.ToolCallStream, runs here and nowhere else), `Tokens` for reported
log-probabilities, `Usage`, `Finished` per choice, `Activations` (SAE features read), and
`Failure`. Each surface's formatter turns them into its own frames; `collect` folds them into
the `Completion` a non-streamed answer formats, so a whole answer is exactly the sum of the
stream (what clients that add chunks up rely on).

Order: per choice, `Tokens` precede the text they were reported with; text that queued up
while the previous frame was written comes as one `Delta` per choice (a slow reader catches
up); `Usage` comes just before the `Finished` that ends the request, `Activations` after it;
`Failure` ends the stream, after the text that came before it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs

from greenroom.engines.base import Activations as Read
from greenroom.engines.text.tool_calls import ToolCallStream
from greenroom.errors import GreenroomError
from greenroom.http.pipeline import structured
from greenroom.protocol import Failed, GenerationStats, Text

ARGUMENT_FRAGMENT = 24  # characters per streamed arguments fragment (chat, Responses, Messages)


@attrs.frozen
class Delta:
    choice: int
    text: str


@attrs.frozen
class CallStarted:
    choice: int
    call: int  # the call's index within its choice
    id: str
    name: str


@attrs.frozen
class CallArguments:
    """A call's whole arguments (JSON text), as soon as the call is complete: a surface that
    streams fragments cuts them itself."""

    choice: int
    call: int
    arguments: str

    def fragments(self) -> list[str]:
        """The arguments as a stream writes them: ARGUMENT_FRAGMENT characters at a time."""
        return [self.arguments[i : i + ARGUMENT_FRAGMENT] for i in range(0, len(self.arguments), ARGUMENT_FRAGMENT)]


@attrs.frozen
class Tokens:
    """Reported tokens (protocol.Text.logprobs' records), before the text they came with: a
    surface writes them on its choice's next frame."""

    choice: int
    tokens: tuple


@attrs.frozen
class Usage:
    prompt_tokens: int
    completion_tokens: int


@attrs.frozen
class Finished:
    choice: int
    reason: str  # the engine's (stop, length, …), or tool_calls: the answer stopped after making calls
    stop: str | None  # the stop string that ended the choice, if one did
    completion_tokens: int
    stats: GenerationStats | None  # the engine's own figures


@attrs.frozen
class Activations:
    """The SAE activations a request asked for (protocol.Text.sae_activations): after the last `Finished`."""

    read: Read


@attrs.frozen
class Failure:
    error: GreenroomError


Event = Delta | CallStarted | CallArguments | Tokens | Usage | Finished | Activations | Failure


@attrs.frozen
class Call:
    id: str
    name: str
    arguments: str  # JSON text


@attrs.define
class Choice:
    """One choice folded from its events: what a non-streamed answer carries."""

    index: int
    content: list[str] = attrs.Factory(list)
    calls: list[Call] = attrs.Factory(list)
    tokens: list = attrs.Factory(list)
    finished: Finished | None = None

    @property
    def text(self) -> str:
        return "".join(self.content)

    def add(self, event: Event) -> None:
        if isinstance(event, Delta):
            self.content.append(event.text)
        elif isinstance(event, CallStarted):
            self.calls.append(Call(event.id, event.name, ""))
        elif isinstance(event, CallArguments):
            self.calls[event.call] = attrs.evolve(self.calls[event.call], arguments=event.arguments)
        elif isinstance(event, Tokens):
            self.tokens += event.tokens
        elif isinstance(event, Finished):
            self.finished = event


@attrs.define
class Completion:
    choices: list[Choice]
    usage: Usage | None = None
    activations: Read | None = None

    def add(self, event: Event) -> None:
        """Fold one event in; a `Failure` is raised."""
        if isinstance(event, Failure):
            raise event.error
        if isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, Activations):
            self.activations = event.read
        else:
            self.choices[event.choice].add(event)


async def collect(events: AsyncIterator[Event], choices: int) -> Completion:
    """The whole answer: the stream folded (a `Failure` raised as its GreenroomError)."""
    completion = Completion([Choice(i) for i in range(choices)])
    async for event in events:
        completion.add(event)
    return completion


class _Shaper:
    """One choice's text as content and tool calls (when the request parses tools)."""

    def __init__(self, choice: int, plan: structured.Plan | None):
        self.choice = choice
        self.tools = ToolCallStream(plan.tools) if plan is not None and plan.parses_tools else None
        self.content: list[str] = []  # for the constrained document's check
        self.called = False

    def feed(self, text: str, final: bool = False) -> list[Event]:
        if self.tools is None:
            self.content.append(text)
            return [Delta(self.choice, text)] if text else []
        out: list[Event] = []
        for kind, *rest in self.tools.feed(text) + (self.tools.finish() if final else []):
            if kind == "content":
                self.content.append(rest[0])
                if out and isinstance(out[-1], Delta):  # one delta per run of content
                    out[-1] = Delta(self.choice, out[-1].text + rest[0])
                else:
                    out.append(Delta(self.choice, rest[0]))
            elif kind == "call":
                self.called = True
                out.append(CallStarted(self.choice, rest[0], structured.call_id(), rest[1]))
            else:
                out.append(CallArguments(self.choice, *rest))
        return [e for e in out if not isinstance(e, Delta) or e.text]


async def native(events, choices: int, prompt_tokens: int, plan: structured.Plan | None) -> AsyncIterator[Event]:
    """The engine's events (a supervisor RequestEvents: iterated, and `ready()` for what already
    arrived) as the neutral stream. `plan`: a chat request's (its tools are parsed, its
    constrained document checked once complete); None: a text completion's, read as it is."""
    shapers = [_Shaper(i, plan) for i in range(choices)]
    completion_tokens = 0
    unfinished = choices
    read = None
    async for first in events:
        pending: dict[int, list[str]] = {}
        for event in [first, *events.ready()]:
            if isinstance(event, Failed):
                for index, text in pending.items():
                    for out in shapers[index].feed("".join(text)):
                        yield out
                yield Failure(GreenroomError.from_wire(event.error))
                return
            assert isinstance(event, Text)
            pending.setdefault(event.index, []).append(event.text)
            if event.logprobs:
                yield Tokens(event.index, tuple(event.logprobs))
            if not event.finish_reason:
                continue
            shaper = shapers[event.index]
            for out in shaper.feed("".join(pending.pop(event.index)), final=True):
                yield out
            if plan is not None:
                try:  # the document streamed, checked once complete
                    structured.check(plan, "".join(shaper.content), event.finish_reason)
                except GreenroomError as exc:
                    yield Failure(exc)
                    return
            completion_tokens += event.completion_tokens
            unfinished -= 1
            read = read or event.sae_activations
            reason = "tool_calls" if shaper.called and event.finish_reason == "stop" else event.finish_reason
            if unfinished == 0:
                yield Usage(prompt_tokens, completion_tokens)
            yield Finished(event.index, reason, event.stop, event.completion_tokens, event.stats)
        for index, text in pending.items():
            for out in shapers[index].feed("".join(text)):
                yield out
    if read is not None:
        yield Activations(read)
