"""Ollama's formatter (http/ollama/format.py): neutral events → the NDJSON lines of
/api/generate and /api/chat, and a folded Completion → the whole answer's `done: true` object."""

import json

import pytest
import trio

from greenroom.errors import GreenroomError
from greenroom.http.ollama import format as fmt
from greenroom.http.pipeline import events as ev
from greenroom.protocol import GenerationStats

AT = "2026-01-02T03:04:05.000006Z"
STATS = GenerationStats(
    logprob_sum=None, prefill_s=0.5, decode_s=0.25, queue_wait_s=0.0, compute_s=0.75, peak_rss_mb=100.0
)
TOK = (1, "Hi", -0.5, [(1, "Hi", -0.5), (2, "Yo", -1.5)])  # a reported token, with its top alternatives
TOK_OUT = {
    "token": "Hi",
    "logprob": -0.5,
    "bytes": [72, 105],
    "top_logprobs": [
        {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
        {"token": "Yo", "logprob": -1.5, "bytes": [89, 111]},
    ],
}


def context(chat=True, logprobs=False):
    return fmt.Context("m:latest", chat, "req-1", 1_000, 7, logprobs, clock=lambda: 5_000, now=lambda: AT)


def head():
    return {"model": "m:latest", "created_at": AT}


def chat(content, **more):
    return {**head(), "message": {"role": "assistant", "content": content, **more}, "done": False}


def generate(response):
    return {**head(), "response": response, "done": False}


def done(body, reason="stop", eval_count=3, **more):
    metrics = {
        "total_duration": 4_000,
        "load_duration": 7,
        "prompt_eval_count": 5,
        "prompt_eval_duration": 500_000_000,
        "eval_count": eval_count,
        "eval_duration": 250_000_000,
    }
    return {**head(), **body, "done": True, "done_reason": reason, **metrics, **more}


def error(code, message):
    return {"error": f"{message} (request id: req-1)", "code": code}


ENDED = [ev.Usage(5, 3), ev.Finished(0, "stop", None, 3, STATS)]
CALL = '{"city": "Paris"}'
CALLED = {"tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
NOTHING = {"role": "assistant", "content": ""}

# (what, chat, native events, the lines written)
STREAMS = [
    (
        "generate: a line per delta, then done with the metrics",
        False,
        [ev.Delta(0, "Hel"), ev.Delta(0, "lo"), *ENDED],
        [generate("Hel"), generate("lo"), done({"response": ""})],
    ),
    (
        "chat: a message per delta, an empty one on the done line",
        True,
        [ev.Delta(0, "Hello"), *ENDED],
        [chat("Hello"), done({"message": NOTHING})],
    ),
    (
        "a tool call between content: one line of its own, once complete; done_reason stop",
        True,
        [
            ev.Delta(0, "Sure."),
            ev.CallStarted(0, 0, "call_x", "get_weather"),
            ev.CallArguments(0, 0, CALL),
            ev.Delta(0, "Done."),
            ev.Usage(5, 3),
            ev.Finished(0, "tool_calls", None, 3, STATS),
        ],
        [chat("Sure."), chat("", **CALLED), chat("Done."), done({"message": NOTHING})],
    ),
    (
        "reported tokens ride on the next line; those left over on the done line",
        True,
        [ev.Tokens(0, (TOK,)), ev.Delta(0, "Hi"), ev.Tokens(0, (TOK, TOK)), *ENDED],
        [
            {**chat("Hi"), "logprobs": [TOK_OUT]},
            done({"message": NOTHING}, logprobs=[TOK_OUT, TOK_OUT]),
        ],
    ),
    (
        "a failure mid-stream: the error envelope is the last line, no done",
        False,
        [
            ev.Delta(0, "part"),
            ev.Failure(GreenroomError("constrained_output_invalid", "does not validate")),
        ],
        [generate("part"), error("constrained_output_invalid", "does not validate")],
    ),
    (
        "length, no stats: the engine's reason and zero durations; activations write nothing",
        False,
        [ev.Usage(5, 2), ev.Finished(0, "length", None, 2, None), ev.Activations({"positions": []})],
        [
            {
                **done({"response": ""}, "length", 2),
                "prompt_eval_duration": 0,
                "eval_duration": 0,
            }
        ],
    ),
]


async def _source(items, then: BaseException | None = None):
    for item in items:
        yield item
    if then is not None:
        raise then


def lines(items, chat_=True, then=None):
    async def main():
        return [line async for line in fmt.lines(_source(items, then), context(chat_))]

    return trio.run(main)


@pytest.mark.parametrize(("what", "is_chat", "items", "expected"), STREAMS, ids=[s[0] for s in STREAMS])
def test_native_events_to_ndjson_lines(what, is_chat, items, expected):
    out = lines(items, is_chat)
    assert [json.loads(line) for line in out] == expected
    # byte for byte: compact JSON, Ollama's key order, one object a line
    assert out == [json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" for e in expected]


def test_an_error_raised_on_the_way_is_the_last_line():
    raised = GreenroomError("request_timeout", "too slow")
    assert [json.loads(x) for x in lines([ev.Delta(0, "a")], then=raised)] == [
        chat("a"),
        error("request_timeout", "too slow"),
    ]
    assert json.loads(lines([], then=KeyError("x"))[-1]) == error("internal_error", "internal error: KeyError")


def completion(text, calls=(), tokens=(), reason="stop"):
    choice = ev.Choice(0, [text], [ev.Call("call_x", *c) for c in calls], list(tokens))
    choice.finished = ev.Finished(0, reason, None, 3, STATS)
    return ev.Completion([choice], ev.Usage(5, 3))


# (what, chat, logprobs asked for, the completion, the done object)
WHOLES = [
    (
        "generate",
        False,
        False,
        completion("Hello"),
        done({"response": "Hello"}),
    ),
    (
        "chat with a call: arguments an object, done_reason stop",
        True,
        False,
        completion("", [("get_weather", CALL)], reason="tool_calls"),
        done({"message": {**NOTHING, **CALLED}}),
    ),
    (
        "logprobs asked for: every reported token, before done",
        True,
        True,
        completion("Hi", tokens=[TOK]),
        {**head(), "message": {"role": "assistant", "content": "Hi"}, "logprobs": [TOK_OUT], **done({})},
    ),
    (
        "logprobs asked for, none reported: an empty list",
        False,
        True,
        completion("x", reason="length"),
        {**head(), "response": "x", "logprobs": [], **done({}, "length")},
    ),
]


@pytest.mark.parametrize(("what", "is_chat", "asked", "folded", "expected"), WHOLES, ids=[w[0] for w in WHOLES])
def test_completion_to_the_done_object(what, is_chat, asked, folded, expected):
    out = fmt.whole(folded, context(is_chat, asked))
    assert out == expected
    assert list(out) == list(expected)  # Ollama's key order
