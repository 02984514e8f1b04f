"""The one generation path's pure parts (http/pipeline/generation.py): the typed stream a
translated request's failure is named in, and the /v1 family's response headers."""

import pytest
import trio

from greenroom.errors import GreenroomError
from greenroom.http.core.headers import CONSTRAINED_HEADER, DRAWN_SEED_HEADER, IGNORED_FIELDS_HEADER, SEED_HEADER
from greenroom.http.openai import openai_api, openai_params
from greenroom.http.pipeline import events as ev
from greenroom.http.pipeline import generation, structured
from greenroom.http.pipeline.paths import FieldPaths
from greenroom.protocol import Admitted, Failed, Text

from .test_events import Batches

# a Responses request's chat: its instructions became messages[0], its input[0] messages[1]
PATHS = FieldPaths({"messages[1]": "input[0]", "max_tokens": "max_output_tokens"})


def named(batches, paths=PATHS, plan=None):
    async def main():
        return [e async for e in generation.named(Batches(*batches), 1, 5, plan, paths)]

    return trio.run(main)


def failed(code, message, param=None):
    return Failed("r", GreenroomError(code, message, param).to_wire())


def test_a_failure_mid_stream_names_the_translated_surfaces_field():
    out = named(
        [
            [Text("r", 0, "Hel", 1, None)],
            [failed("invalid_parameter", "messages[1].content is bad", "messages[1].content")],
        ]
    )
    assert out[0] == ev.Delta(0, "Hel")
    (failure,) = out[1:]
    assert (failure.error.param, failure.error.message) == ("input[0].content", "input[0].content is bad")


def test_a_failure_that_names_no_field_keeps_its_words():
    """An invalid document is about the answer: its message quotes the answer's own keys."""
    schema = {"type": "object", "required": ["messages[1]"]}
    plan = structured.plan(
        structured.Output(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    )
    (_, failure) = named([[Text("r", 0, "{}", 2, "stop")]], plan=plan)
    assert failure.error.code == "constrained_output_invalid" and failure.error.param is None
    assert "'messages[1]' is a required property" in failure.error.message


def test_a_surfaces_own_request_passes_its_errors_as_they_are():
    error = GreenroomError("invalid_parameter", "max_tokens is bad", "max_tokens")
    out = named([[Failed("r", error.to_wire())]], paths=FieldPaths())
    assert out[-1].error.to_wire() == error.to_wire()


def prepared(body, ignored=(), strict=False):
    return generation.Prepared(body, "m", list(ignored), strict)


def gen_of(body):
    return openai_params.chat_request(openai_api.parse_chat(body), "m")


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_v1_headers_carry_the_seed_the_steering_the_constraint_and_the_drawn_seed():
    body = {**CHAT, "seed": 7, "extra_messages": [[{"role": "user", "content": "yo"}]]}
    plan = structured.plan(structured.Output(response_format={"type": "json_object"}))
    headers = generation.v1_headers(prepared(body, ["user"]), gen_of(body), plan, {"X-miLLM-Circuit-Rung": "2"})
    answered = headers(Admitted("r", 3, drawn_seed=None))
    assert answered == {
        IGNORED_FIELDS_HEADER: '"user"',
        SEED_HEADER: '7;scope="batch-shape"',  # two conversations: the promise holds for this batch's shape
        "X-miLLM-Circuit-Rung": "2",
        CONSTRAINED_HEADER: "json_object",
    }
    drawn = generation.v1_headers(prepared(CHAT), gen_of(CHAT), None, {})(Admitted("r", 3, drawn_seed=42))
    assert drawn == {DRAWN_SEED_HEADER: '42;scope="request"'}


def test_v1_headers_refuse_an_unread_field_under_strict_mode_before_anything_runs():
    with pytest.raises(GreenroomError) as refused:
        generation.v1_headers(prepared(CHAT, ["user"], strict=True), gen_of(CHAT), None, {})
    assert (refused.value.code, refused.value.param) == ("unused_fields_refused", "user")
