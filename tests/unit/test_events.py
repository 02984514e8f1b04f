"""The neutral event stream (http/pipeline/events.py): engine events in, typed events out,
and the fold a non-streamed answer formats."""

import json

import pytest
import trio

from greenroom.engines.base import Activations
from greenroom.errors import GreenroomError
from greenroom.http.pipeline import events as ev
from greenroom.http.pipeline import structured
from greenroom.protocol import Failed, Text

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


class Batches:
    """Engine events as the supervisor hands them over: each batch's first is waited for, the
    rest is what already arrived (`ready`)."""

    def __init__(self, *batches):
        self._batches = [list(b) for b in batches]
        self._rest: list = []

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self._batches:
            raise StopAsyncIteration
        first, *self._rest = self._batches.pop(0)
        return first

    def ready(self):
        out, self._rest = self._rest, []
        return out


def text(t, index=0, tokens=1, finish=None, **kw):
    return Text("r", index, t, tokens, finish, **kw)


def run(batches, choices=1, plan=None, prompt_tokens=5):
    async def main():
        return [e async for e in ev.native(Batches(*batches), choices, prompt_tokens, plan)]

    return trio.run(main)


def test_plain_text_one_delta_per_batch_then_usage_before_finished():
    out = run([[text("Hel"), text("lo")], [text(" you", tokens=3, finish="stop", stop="\n")]])
    assert out == [
        ev.Delta(0, "Hello"),
        ev.Delta(0, " you"),
        ev.Usage(5, 3),
        ev.Finished(0, "stop", "\n", 3, None),
    ]


def test_tool_call_is_shaped_once_content_then_call_and_reason_tool_calls():
    plan = structured.plan(structured.Output(tools=TOOLS))
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    out = run([[text("Sure. ")], [text(call[:20])], [text(call[20:], tokens=9, finish="stop")]], plan=plan)
    assert [type(e).__name__ for e in out] == ["Delta", "CallStarted", "CallArguments", "Usage", "Finished"]
    assert out[0] == ev.Delta(0, "Sure.")  # whitespace before a call is not content
    assert out[1].name == "get_weather" and out[1].id.startswith("call_")
    assert json.loads(out[2].arguments) == {"city": "Paris"}
    assert out[-1].reason == "tool_calls"


def test_tokens_come_before_their_text():
    tok = [[1, "a", -0.5, []]]
    out = run([[text("a", logprobs=tok), text("b", tokens=2, finish="length", logprobs=tok)]])
    assert out[:3] == [ev.Tokens(0, tuple(tok)), ev.Tokens(0, tuple(tok)), ev.Delta(0, "ab")]
    assert out[-1].reason == "length"


def test_failure_ends_the_stream_after_the_text_before_it():
    wire = GreenroomError("non_finite_logits", "the logits were not finite").to_wire()
    out = run([[text("partial"), Failed("r", wire)]])
    assert out[0] == ev.Delta(0, "partial")
    assert isinstance(out[1], ev.Failure) and out[1].error.code == "non_finite_logits"
    assert len(out) == 2


def test_invalid_constrained_document_fails_once_complete():
    plan = structured.plan(structured.Output(response_format={"type": "json_object"}))
    out = run([[text('{"a": ', finish=None)], [text("oops", finish="stop")]], plan=plan)
    assert isinstance(out[-1], ev.Failure) and out[-1].error.code == "constrained_output_invalid"


def test_two_choices_usage_sums_both_and_precedes_the_last_finished():
    out = run([[text("x", 0, 2, "stop"), text("y", 1, 4)], [text("z", 1, 1, "length")]], choices=2)
    assert out == [
        ev.Delta(0, "x"),
        ev.Finished(0, "stop", None, 2, None),
        ev.Delta(1, "y"),
        ev.Delta(1, "z"),
        ev.Usage(5, 3),
        ev.Finished(1, "length", None, 1, None),
    ]


def test_activations_follow_the_last_finished():
    read = Activations("s", 1, "post_steering", [])
    out = run([[text("x", finish="stop", sae_activations=read)]])
    assert out[-1] == ev.Activations(read)


def test_collect_is_the_sum_of_the_stream():
    plan = structured.plan(structured.Output(tools=TOOLS))
    call = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    tok = [[1, "a", -0.5, []]]

    async def main():
        source = ev.native(Batches([text("Hi ", logprobs=tok)], [text(call, finish="stop")]), 1, 5, plan)
        return await ev.collect(source, 1)

    done = trio.run(main)
    (choice,) = done.choices
    assert choice.text == "Hi"
    assert [(c.name, c.arguments) for c in choice.calls] == [("get_weather", "{}")]
    assert choice.tokens == tok and choice.finished.reason == "tool_calls"
    assert done.usage == ev.Usage(5, 1)


def test_collect_raises_a_failure():
    async def main():
        wire = GreenroomError("request_timeout", "boom").to_wire()
        return await ev.collect(ev.native(Batches([Failed("r", wire)]), 1, 5, None), 1)

    with pytest.raises(GreenroomError, match="boom"):
        trio.run(main)
