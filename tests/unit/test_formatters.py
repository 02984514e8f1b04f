"""The OpenAI-family surfaces' formatters (http/openai/chat_format.py, responses_format.py,
needle_format.py; http/anthropic/messages_format.py): native events (http/pipeline/events.py)
in, the surface's frames or body out — no server."""

import json

import attrs
import pytest
import trio

from greenroom.engines.base import Activations
from greenroom.errors import GreenroomError
from greenroom.http.anthropic import messages_format
from greenroom.http.openai import chat_format, logprobs, needle_format, responses_format, scoring
from greenroom.http.pipeline import events as ev
from greenroom.http.pipeline import structured
from greenroom.protocol import GenerationStats, Score, ScoredRow, Scores

from .test_events import Batches, text

ARGS = '{"city": "Paris, France, Europe", "unit": "celsius"}'  # three fragments of ARGUMENT_FRAGMENT
FRAGMENTS = [ARGS[i : i + ev.ARGUMENT_FRAGMENT] for i in range(0, len(ARGS), ev.ARGUMENT_FRAGMENT)]
TOKEN = (7, "Hi", -0.25, [[7, "Hi", -0.25], [8, "Ho", -1.5]])
READ = Activations("s", 1, "post_steering", [])
STATS = GenerationStats(
    logprob_sum=-2.0, prefill_s=0.5, decode_s=1.0, queue_wait_s=0.0, compute_s=1.5, peak_rss_mb=100.0
)
FAILED = GreenroomError("non_finite_logits", "the logits were not finite")
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


async def _each(events):
    for event in events:
        yield event


def frames(stream, events, *args) -> list[tuple[str | None, object]]:
    """A formatter's SSE frames for `events` (a write may hold several): (event name, data)
    each, [DONE] as it is."""

    async def main():
        return [frame async for frame in stream(_each(events), *args)]

    out = []
    for frame in (f for write in trio.run(main) for f in write.decode().split("\n\n") if f):
        lines = frame.strip().split("\n")
        name = lines[0].removeprefix("event: ") if lines[0].startswith("event: ") else None
        data = lines[-1].removeprefix("data: ")
        out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


def chunks(events, **context) -> list[dict]:
    """chat_format's stream for `events`: the chunks; an error event as ("error", body); [DONE]."""
    ctx = chat_format.Context("chatcmpl-1", "m", **{"choices": 1, "prompt_tokens": 5, **context})
    return [data if name is None else (name, data) for name, data in frames(chat_format.stream, events, ctx)]


def finished(choice=0, reason="stop", stop=None, tokens=3, stats=STATS):
    return ev.Finished(choice, reason, stop, tokens, stats)


def called(name: str, arguments: str, text: tuple[str, ...] = (), call_id="call_1", tokens=9) -> list:
    """An answer of `text` deltas, then one call: its events."""
    return [
        *(ev.Delta(0, t) for t in text),
        ev.CallStarted(0, 0, call_id, name),
        ev.CallArguments(0, 0, arguments),
        ev.Usage(5, tokens),
        finished(0, "tool_calls", tokens=tokens),
    ]


def folded(*events, choices=1) -> ev.Completion:
    completion = ev.Completion([ev.Choice(i) for i in range(choices)])
    for event in events:
        completion.add(event)
    return completion


# --- chat completions, streamed ------------------------------------------------------------------


def test_chat_stream_two_choices_role_chunks_then_deltas_and_usage_on_the_last_finishing_chunk():
    out = chunks(
        [
            ev.Delta(0, "He"),
            ev.Delta(1, "Yo"),
            ev.Delta(0, "llo"),
            finished(0, "stop", "\n", 2),
            ev.Usage(5, 3),
            finished(1, "length", None, 1),
        ],
        choices=2,
    )
    assert out[-1] == "[DONE]"
    body = out[:-1]
    assert all(c["id"] == "chatcmpl-1" and c["object"] == "chat.completion.chunk" for c in body)
    shown = [(c["choices"][0]["index"], c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) for c in body]
    assert shown == [
        (0, {"role": "assistant", "content": ""}, None),
        (1, {"role": "assistant", "content": ""}, None),
        (0, {"content": "He"}, None),
        (1, {"content": "Yo"}, None),
        (0, {"content": "llo"}, None),
        (0, {}, "stop"),
        (1, {}, "length"),
    ]
    assert body[5]["choices"][0]["stop_reason"] == "\n" and body[6]["choices"][0]["stop_reason"] is None
    assert "stop_reason" not in body[2]["choices"][0]
    assert [c.get("usage") for c in body] == [None] * 6 + [
        {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    ]
    assert all("usage" not in c for c in body[:6])  # absent, not null, without include_usage


def test_chat_stream_include_usage_null_on_every_chunk_then_the_usage_only_chunk_then_millm():
    out = chunks([ev.Delta(0, "Hi"), ev.Usage(5, 1), finished(0, tokens=1), ev.Activations(READ)], include_usage=True)
    *body, done = out
    assert done == "[DONE]"
    assert all(c["usage"] is None for c in body[:3] + body[4:])
    assert body[3] == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": body[0]["created"],
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
    assert body[4]["choices"] == [] and body[4]["millm"]["sae_activations"]["sae_id"] == "s"
    assert body[4]["millm"]["sae_activations"]["note"].startswith("post_steering")
    assert len(body) == 5


def test_chat_stream_tool_call_id_and_name_then_argument_fragments_and_finish_reason_tool_calls():
    out = chunks(called("get_weather", ARGS, ("Sure.",)))
    deltas = [c["choices"][0]["delta"] for c in out[:-1]]
    assert deltas[1] == {"content": "Sure."}
    assert deltas[2] == {
        "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
        ]
    }
    assert [d["tool_calls"] for d in deltas[3:-1]] == [[{"index": 0, "function": {"arguments": f}}] for f in FRAGMENTS]
    assert len(FRAGMENTS) == 3 and out[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_stream_reported_tokens_ride_on_the_choices_next_chunk():
    writers = {0: logprobs.Writer(True, False, 0)}
    out = chunks(
        [ev.Tokens(0, (TOKEN,)), ev.Delta(0, "Hi"), ev.Tokens(0, (TOKEN, TOKEN)), ev.Usage(5, 3), finished(0)],
        writers=writers,
    )
    role, first, last, _ = out
    assert role["choices"][0]["logprobs"] is None
    (entry,) = first["choices"][0]["logprobs"]["content"]
    assert (
        entry["token"] == "Hi"
        and entry["logprob"] == -0.25
        and [t["token"] for t in entry["top_logprobs"]] == ["Hi", "Ho"]
    )
    assert len(last["choices"][0]["logprobs"]["content"]) == 2 and last["choices"][0]["finish_reason"] == "stop"


def test_chat_stream_failure_mid_stream_is_the_error_event_after_the_text_then_done():
    out = chunks([ev.Delta(0, "partial"), ev.Failure(FAILED)])
    assert [c["choices"][0]["delta"] for c in out[:2]] == [{"role": "assistant", "content": ""}, {"content": "partial"}]
    assert out[2] == ("error", FAILED.openai_body()) and out[3] == "[DONE]"
    assert len(out) == 4  # no finishing chunk claims it complete


def test_chat_stream_x_needle_rides_on_choice_0s_finishing_chunk():
    extras = chat_format.Extras([{"role": "user", "content": "Weather in Paris?"}], ["ignored field: user"])
    stats = attrs.evolve(STATS, logprob_sum=-1.0)
    events = called("get_weather", '{"city": "Paris"}', tokens=3)
    out = chunks([*events[:-1], finished(0, "tool_calls", stats=stats)], extras=extras)
    block = out[-2]["x_needle"]
    assert block["type"] == "call" and block["validation"]["ungrounded"] == [] and block["warnings"] == extras.warnings
    assert block["confidence"] == round(2.718281828 ** (-1 / 3), 4) and block["prefill_tps"] == 10.0
    assert list(out[-2])[-2:] == ["x_needle", "usage"]
    assert all("x_needle" not in c for c in out[:-2])


def test_text_completion_stream_no_role_chunk_and_offsets_go_on_across_chunks():
    writers = {0: logprobs.Writer(False, False, 4)}
    out = chunks(
        [
            ev.Tokens(0, (TOKEN,)),
            ev.Delta(0, "Hi"),
            ev.Tokens(0, (TOKEN,)),
            ev.Delta(0, "Hi"),
            ev.Usage(5, 2),
            finished(0),
        ],
        chat=False,
        writers=writers,
    )
    assert [c["object"] for c in out[:-1]] == ["text_completion"] * 3
    assert [c["choices"][0]["text"] for c in out[:-1]] == ["Hi", "Hi", ""]
    assert [c["choices"][0]["logprobs"]["text_offset"] for c in out[:2]] == [[4], [6]]
    assert out[2]["choices"][0]["logprobs"] is None and out[2]["usage"]["total_tokens"] == 7


# --- chat completions, whole -----------------------------------------------------------------------


def test_chat_whole_two_choices_calls_logprobs_usage_and_millm():
    completion = folded(
        ev.Tokens(0, (TOKEN,)),
        ev.CallStarted(0, 0, "call_1", "add"),
        ev.CallArguments(0, 0, '{"a": 1}'),
        finished(0, "tool_calls", tokens=4),
        ev.Delta(1, "Hello"),
        ev.Usage(5, 6),
        finished(1, "stop", "\n", 2),
        ev.Activations(READ),
        choices=2,
    )
    writers = {i: logprobs.Writer(True, True, 0) for i in range(2)}
    ctx = chat_format.Context("chatcmpl-1", "m", 2, 5, writers=writers, fingerprint="millm:m")
    body = chat_format.whole(completion, ctx)
    assert list(body) == ["id", "object", "created", "model", "system_fingerprint", "choices", "usage", "millm"]
    assert body["object"] == "chat.completion" and body["system_fingerprint"] == "millm:m"
    first, second = body["choices"]
    assert first["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}],
        "refusal": None,
    }
    assert first["finish_reason"] == "tool_calls" and first["stop_reason"] is None
    assert first["logprobs"]["content"][0]["token"] == "token_id:7"  # return_tokens_as_token_ids
    assert second["message"] == {"role": "assistant", "content": "Hello", "refusal": None}
    assert second["logprobs"] == {"content": [], "refusal": None} and second["stop_reason"] == "\n"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    assert body["millm"]["sae_activations"]["layer"] == 1


def test_chat_whole_x_needle_and_the_text_around_calls_as_reasoning_content():
    completion = folded(*called("add", '{"a": 41}', ("Let me add.",), tokens=4))
    extras = chat_format.Extras([{"role": "user", "content": "add 1 and 2"}], [])
    body = chat_format.whole(completion, chat_format.Context("chatcmpl-1", "m", 1, 5, extras=extras))
    message = body["choices"][0]["message"]
    assert message["content"] == "Let me add." and list(message)[-2:] == ["refusal", "reasoning_content"]
    assert body["x_needle"]["reasoning"] == message["reasoning_content"] == "Let me add."
    assert body["x_needle"]["validation"]["ungrounded"] == ["add.a"]  # 41 is nowhere in the request
    assert body["x_needle"]["type"] == "call" and "millm" not in body


def test_text_completion_whole():
    completion = folded(ev.Delta(0, "fox"), ev.Usage(5, 1), finished(0, "length", tokens=1))
    body = chat_format.whole(completion, chat_format.Context("cmpl-1", "m", 1, 5, chat=False))
    assert body["object"] == "text_completion"
    assert body["choices"] == [
        {"index": 0, "text": "fox", "logprobs": None, "finish_reason": "length", "stop_reason": None}
    ]


# --- the answer path's checks, through native and its fold (moved from tests/live/test_structured.py) ---------


def collected(pieces: list[str], finish: str, plan) -> ev.Completion:
    batches = [[text(p, tokens=i + 1)] for i, p in enumerate(pieces[:-1])]
    batches.append([text(pieces[-1], tokens=len(pieces), finish=finish)])

    async def main():
        return await ev.collect(ev.native(Batches(*batches), 1, 5, plan), 1)

    return trio.run(main)


FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "t",
        "schema": {"type": "object", "properties": {"label": {"enum": ["yes", "no"]}}, "required": ["label"]},
    },
}


def test_complete_invalid_document_is_a_500_never_a_200():
    plan = structured.plan(structured.Output(response_format=FORMAT))
    with pytest.raises(GreenroomError) as exc:
        collected(['{"label": "maybe"}'], "stop", plan)
    assert exc.value.code == "constrained_output_invalid" and exc.value.status == 500
    cut = collected(['{"label": "may'], "length", plan)  # cut: returned as is
    assert cut.choices[0].finished.reason == "length" and cut.choices[0].text == '{"label": "may'


def test_unconstrained_calls_keep_only_valid_ones_whole_and_streamed():
    plan = structured.plan(structured.Output(tools=TOOLS))  # tool_choice auto: nothing constrained the text
    answer = (
        'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1e999, "b": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lagos, Nigeria, Africa"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lag'
    )
    whole = collected([answer], "length", plan).choices[0]
    assert whole.text == "Sure." and whole.finished.reason == "length"
    assert [(c.name, c.arguments) for c in whole.calls] == [("add", '{"a": 1, "b": 2}')]
    streamed = collected([answer[i : i + 5] for i in range(0, len(answer), 5)], "length", plan).choices[0]
    assert streamed.text == whole.text
    assert [(c.name, c.arguments) for c in streamed.calls] == [(c.name, c.arguments) for c in whole.calls]


def test_a_complete_document_that_does_not_validate_ends_the_stream_with_the_error_event():
    """(moved from tests/live/test_structured_stream.py) The grammar keeps a decoded document valid;
    should one complete that does not validate, its text has gone out, then the error event
    (the spec's constrained_output_invalid) and [DONE] — no finishing chunk claims it complete."""
    schema = {"type": "object", "properties": {"capital": {"type": "boolean"}}, "required": ["capital"]}
    plan = structured.plan(
        structured.Output(response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    )

    def streamed(pieces: list[str]):
        batches = [[text(p)] for p in pieces[:-1]] + [[text(pieces[-1], finish="stop")]]
        ctx = chat_format.Context("chatcmpl-1", "m", 1, 10)

        async def main():
            return [f async for f in chat_format.stream(ev.native(Batches(*batches), 1, 10, plan), ctx)]

        return [f.decode() for f in trio.run(main)]

    out = streamed(['{"name": "Paris",', ' "capital": "yes"}'])
    chunks_ = [json.loads(f.removeprefix("data: ")) for f in out[:-1]]
    assert (
        "".join(c["choices"][0]["delta"].get("content", "") for c in chunks_) == '{"name": "Paris", "capital": "yes"}'
    )
    error, done = out[-1].split("\n\n", 1)  # the stream's end, one write
    assert error.startswith("event: error\n")
    assert json.loads(error.split("data: ")[1])["error"]["code"] == "constrained_output_invalid"
    assert done == "data: [DONE]\n\n"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks_)
    finishing, done = streamed(['{"name": "Paris",', ' "capital": true}'])[-1].split("\n\n", 1)  # one write
    assert json.loads(finishing.removeprefix("data: "))["choices"][0]["finish_reason"] == "stop"
    assert done == "data: [DONE]\n\n"


# --- Responses -------------------------------------------------------------------------------------

RESPONSES_BODY = {"model": "m", "input": "hi", "instructions": "be brief", "tools": [{"type": "function", "name": "f"}]}


def responses_ctx(store=True) -> responses_format.Context:
    return responses_format.Context("resp_1", 1700000000, "m", RESPONSES_BODY, store)


def responses(events) -> tuple[list[tuple[str, dict]], list[dict]]:
    kept = []

    async def keep(response):
        kept.append(response)
        return response

    return frames(responses_format.stream, events, responses_ctx(), keep), kept


def test_responses_stream_text_then_a_call_item_by_item_numbered():
    out, kept = responses(called("f", ARGS, ("Sure", ".")))
    assert all(name == data["type"] for name, data in out)
    assert [data["sequence_number"] for _, data in out] == list(range(len(out)))
    assert [name for name, _ in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * 3,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    created = out[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and "usage" not in created
    assert created["instructions"] == "be brief" and created["tools"][0]["strict"] is True
    assert out[2][1]["item"]["content"] == [] and out[3][1]["part"]["text"] == ""
    assert [out[i][1]["delta"] for i in (4, 5)] == ["Sure", "."] and out[6][1]["text"] == "Sure."
    assert out[9][1]["item"]["call_id"] == "call_1" and out[9][1]["item"]["status"] == "in_progress"
    assert [out[i][1]["delta"] for i in (10, 11, 12)] == FRAGMENTS and out[13][1]["arguments"] == ARGS
    (done,) = kept
    assert out[-1][1]["response"] == done and done["status"] == "completed" and done["incomplete_details"] is None
    assert [i["type"] for i in done["output"]] == ["message", "function_call"]
    assert all(i["status"] == "completed" for i in done["output"])
    assert (
        done["usage"]["input_tokens"] == 5
        and done["usage"]["output_tokens"] == 9
        and done["usage"]["total_tokens"] == 14
    )


def test_responses_stream_cut_by_length_is_incomplete_with_millm():
    out, kept = responses([ev.Delta(0, "Hi"), ev.Usage(5, 1), finished(0, "length", tokens=1), ev.Activations(READ)])
    assert out[-1][0] == "response.incomplete"
    assert kept[0]["incomplete_details"] == {"reason": "max_output_tokens"} and "millm" in kept[0]


def test_responses_stream_failure_mid_stream_is_error_then_response_failed():
    out, kept = responses([ev.Delta(0, "part"), ev.Failure(FAILED)])
    names = [name for name, _ in out]
    assert names[-3:] == ["response.output_text.delta", "error", "response.failed"]
    assert out[-2][1] == {
        "type": "error",
        "code": FAILED.code,
        "message": FAILED.message,
        "param": None,
        "sequence_number": 5,
    }
    failed = out[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"] == {"code": FAILED.code, "message": FAILED.message}
    assert failed["output"][0]["content"][0]["text"] == "part" and kept == []  # a failure is not stored


def test_responses_whole_message_and_call_items():
    completion = folded(*called("f", "{}", ("Sure.",), tokens=3))
    body = responses_format.whole(completion, responses_ctx(store=False))
    assert body["id"] == "resp_1" and body["status"] == "completed" and body["store"] is False
    message, call = body["output"]
    assert message["content"][0]["text"] == "Sure." and message["id"].startswith("msg_")
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_1", "f", "{}") and call["id"].startswith("fc_")
    assert body["usage"]["output_tokens"] == 3 and body["text"] == {"format": {"type": "text"}}
    empty = responses_format.whole(folded(ev.Usage(5, 0), finished(0, "length", tokens=0)), responses_ctx())
    assert empty["output"][0]["content"][0]["text"] == ""  # an empty answer is still a message
    assert empty["status"] == "incomplete" and empty["incomplete_details"] == {"reason": "max_output_tokens"}


# --- Anthropic Messages ---------------------------------------------------------------------------

MESSAGES_CTX = messages_format.Context("msg_1", "m", 5)


def test_messages_stream_text_block_then_tool_use_block_then_message_delta():
    out = frames(messages_format.stream, called("f", ARGS, ("Sure", "."), "call_ab"), MESSAGES_CTX)
    assert all(name == data["type"] for name, data in out)
    assert [name for name, _ in out] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = out[0][1]["message"]
    assert start["id"] == "msg_1" and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == 5 and start["usage"]["output_tokens"] == 0
    assert out[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert out[4][1]["delta"] == {"type": "text_delta", "text": "."} and out[5][1]["index"] == 0
    assert out[6][1]["content_block"] == {"type": "tool_use", "id": "toolu_ab", "name": "f", "input": {}}
    assert [out[i][1]["delta"]["partial_json"] for i in (7, 8, 9)] == FRAGMENTS and out[10][1]["index"] == 1
    delta = out[11][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["input_tokens"] == 5 and delta["usage"]["output_tokens"] == 9  # cumulative


def test_messages_stream_stop_sequence_and_millm():
    out = frames(
        messages_format.stream,
        [ev.Delta(0, "Hi"), ev.Usage(5, 1), finished(0, "stop", "\n", 1), ev.Activations(READ)],
        MESSAGES_CTX,
    )
    delta = out[-2][1]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "\n"} and "millm" in delta


def test_messages_stream_failure_is_an_error_event_in_anthropics_envelope():
    out = frames(messages_format.stream, [ev.Delta(0, "part"), ev.Failure(FAILED)], MESSAGES_CTX)
    assert [name for name, _ in out] == ["message_start", "ping", "content_block_start", "content_block_delta", "error"]
    assert out[-1][1] == FAILED.anthropic_body()


def test_messages_whole():
    completion = folded(*called("f", '{"a": 1}', ("Sure.",), "call_ab", tokens=3))
    body = messages_format.whole(completion, MESSAGES_CTX)
    assert body["content"] == [
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "toolu_ab", "name": "f", "input": {"a": 1}},
    ]
    assert body["stop_reason"] == "tool_use" and body["stop_sequence"] is None
    assert body["usage"]["input_tokens"] == 5 and body["usage"]["output_tokens"] == 3 and "millm" not in body
    cut = messages_format.whole(folded(ev.Usage(5, 2), finished(0, "length", tokens=2)), MESSAGES_CTX)
    assert cut["content"] == [{"type": "text", "text": ""}] and cut["stop_reason"] == "max_tokens"


# --- Needle ---------------------------------------------------------------------------------------

NEEDLE_CTX = chat_format.Context(
    "chatcmpl-1", "m", 1, 5, extras=chat_format.Extras([{"role": "user", "content": "x"}], ["w"])
)


def test_needle_extracted_matches_only_a_complete_valid_document():
    plan = structured.plan(structured.Output(response_format=FORMAT))
    done = folded(ev.Delta(0, '{"label": "yes"}'), ev.Usage(5, 4), finished(0, tokens=4))
    body = needle_format.extracted(done, NEEDLE_CTX, plan)
    assert body["object"] == "needle.extraction" and body["matched"] is True and body["data"] == {"label": "yes"}
    assert body["x_needle"]["type"] == "respond" and body["x_needle"]["warnings"] == ["w"]
    cut = folded(ev.Delta(0, '{"label": "yes"}'), ev.Usage(5, 4), finished(0, "length", tokens=4))
    assert needle_format.extracted(cut, NEEDLE_CTX, plan)["matched"] is False


def test_needle_completed_calls_with_their_arguments_as_objects():
    done = folded(*called("add", '{"a": 1}', tokens=3))
    body = needle_format.completed(done, NEEDLE_CTX)
    assert body["content"] is None and body["tool_calls"] == [{"name": "add", "arguments": {"a": 1}}]
    assert body["finish_reason"] == "tool_calls" and body["model"] == "m"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert body["x_needle"]["type"] == "call" and body["x_needle"]["validation"]["ungrounded"] == ["add.a"]


ECHOED = ScoredRow(  # a scored row with its echoed prompt
    token=[9, "!", [33]],
    logprob=-0.5,
    top=[[9, "!", [33], -0.5], [3, "?", [63], -1.5]],
    prompt_tokens=2,
    prompt_chars=6,
    prompt_text="Hi you",
    prompt=[[1, "Hi", None, None], [2, " you", -2.0, [[4, " me", -1.0], [5, " me", -3.0]]]],
)


def test_an_echoed_prompt_and_its_scored_token_in_a_text_completion_logprobs_object():
    # the prompt's first token has no alternatives (nothing predicts it); each listed token is among
    # its own alternatives; the scored token's offset follows the prompt's text
    row = ECHOED
    score = Score("cmpl-1", "m", 0.0, None, 2, prompts=["Hi you"], echo=True, echo_logprobs=2)
    answer = scoring.completion_response(score, Scores("cmpl-1", [row]), {"logprobs": 2, "echo": True}, "fp")
    assert answer["choices"][0] == {
        "index": 0,
        "text": "Hi you!",
        "logprobs": {
            "tokens": ["Hi", " you", "!"],
            "token_logprobs": [None, -2.0, -0.5],
            "top_logprobs": [None, {" me": -1.0, " you": -2.0}, {"!": -0.5, "?": -1.5}],
            "text_offset": [0, 2, 6],
        },
        "finish_reason": "length",
    }
    assert answer["usage"] == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
