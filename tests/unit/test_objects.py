"""Response objects (http/core/objects.py): each declared object is what its formatter builds and
what /openapi.json says — the formatters' output for a table of sample inputs validates against
the object's own rendered schema, the document holds that same schema, and a key the declaration
lacks (or a required one missing) fails at build time."""

import array
import json
import re

import attrs
import jsonschema_rs
import pytest
import trio

from greenroom.engines.base import Activations, FeatureValue, PositionRead
from greenroom.engines.capabilities import EMBEDDING_MODEL, ENGINES
from greenroom.http.anthropic import messages_format
from greenroom.http.core import objects, openapi
from greenroom.http.core.contracts import Named
from greenroom.http.manage import features_api
from greenroom.http.ollama import format as ollama_format
from greenroom.http.ollama import model_facts, ollama_embed
from greenroom.http.openai import (
    chat_format,
    logprobs,
    needle_format,
    openai_api,
    responses_format,
    scoring,
    tokenize_api,
)
from greenroom.http.pipeline import events as ev
from greenroom.http.pipeline import structured
from greenroom.protocol import Embedded, Score, Scores, Tokenized
from greenroom.supervisor.placements import Placement

from .test_formatters import (
    ARGS,
    ECHOED,
    FAILED,
    FORMAT,
    MESSAGES_CTX,
    NEEDLE_CTX,
    READ,
    STATS,
    TOKEN,
    _each,
    called,
    chunks,
    finished,
    folded,
    frames,
    responses,
    responses_ctx,
)
from .test_ollama_format import TOK
from .test_ollama_format import context as ollama_ctx

READ_SOME = Activations(
    "s", 1, "post_steering", [PositionRead(3, 42, [FeatureValue(5, 0.5)]), PositionRead(4, None, [])]
)  # past the tokens fed: no token id
_MADE = {
    "system": "Be brief.",
    "license": ["MIT"],
    "messages": [{"role": "user", "content": "hi"}],
    "parent_model": "a",
}
PLACED = [  # a model whose file is gone, and one made by /api/create from it
    model_facts.Placed("m", Placement("m", "/no/such/model.gguf", "llama.cpp", "cpu"), None, 30.0),
    model_facts.Placed("b", Placement("b", "/no/such/model.gguf", "llama.cpp", "cpu", defaults=_MADE), None),
]
EMBEDDED = Embedded("e", [array.array("f", [0.5, -1.0]).tobytes()] * 2, 3)


def _ctx(**context) -> chat_format.Context:
    return chat_format.Context(
        "chatcmpl-1", "m", **{"choices": 1, "prompt_tokens": 5, "fingerprint": "millm:m", **context}
    )


def _writers(chat: bool) -> dict:
    return {0: logprobs.Writer(chat, False, 0)}


def _streamed(events, **context) -> list[dict]:
    return [c for c in chunks(events, **context) if isinstance(c, dict)]


_CALLED = called("add", ARGS, ("Let me add.",))
_TEXT = [ev.Tokens(0, (TOKEN,)), ev.Delta(0, "Hi"), ev.Usage(5, 1), finished(0, "stop", "\n", 1)]
_UNSCORED = [ev.Delta(0, "Hi"), ev.Usage(5, 1), finished(0, stats=attrs.evolve(STATS, logprob_sum=None))]

# (object, what its formatter builds from sample inputs)
SAMPLES = [
    (chat_format.CHAT_COMPLETION, lambda: [chat_format.whole(folded(*_CALLED), _ctx())]),
    (chat_format.CHAT_COMPLETION, lambda: [chat_format.whole(folded(*_CALLED), _ctx(extras=NEEDLE_CTX.extras))]),
    (  # an engine that reports no token probabilities: x_needle's confidence is null
        chat_format.CHAT_COMPLETION,
        lambda: [chat_format.whole(folded(*_UNSCORED), _ctx(extras=NEEDLE_CTX.extras))],
    ),
    (
        chat_format.CHAT_COMPLETION,
        lambda: [chat_format.whole(folded(*_TEXT, ev.Activations(READ_SOME)), _ctx(writers=_writers(True)))],
    ),
    (
        chat_format.CHAT_COMPLETION,
        lambda: [
            scoring.chat_response(
                Score("c", "m", 0.0, None, 2), Scores("c", [ECHOED], READ), {"logprobs": True}, "millm:m"
            )
        ],
    ),
    (chat_format.CHAT_COMPLETION_CHUNK, lambda: _streamed(_CALLED, extras=NEEDLE_CTX.extras)),
    (chat_format.CHAT_COMPLETION_CHUNK, lambda: _streamed([*_TEXT, ev.Activations(READ)], writers=_writers(True))),
    (chat_format.CHAT_COMPLETION_CHUNK, lambda: _streamed([*_TEXT, ev.Activations(READ)], include_usage=True)),
    (
        chat_format.TEXT_COMPLETION,
        lambda: [chat_format.whole(folded(*_TEXT), _ctx(chat=False, writers=_writers(False)))],
    ),
    (
        chat_format.TEXT_COMPLETION,
        lambda: [
            scoring.completion_response(
                Score("c", "m", 0.0, None, 2, prompts=["Hi you"], echo=True, echo_logprobs=2),
                Scores("c", [ECHOED]),
                {"logprobs": 2, "echo": True},
                "millm:m",
            )
        ],
    ),
    (chat_format.TEXT_COMPLETION_CHUNK, lambda: _streamed(_TEXT, chat=False, writers=_writers(False))),
    (chat_format.TEXT_COMPLETION_CHUNK, lambda: _streamed(_TEXT, chat=False, include_usage=True)),
    (
        needle_format.EXTRACTION,
        lambda: [
            needle_format.extracted(
                folded(ev.Delta(0, text), ev.Usage(5, 4), finished(0, tokens=4)),
                NEEDLE_CTX,
                structured.plan(structured.Output(response_format=FORMAT)),
            )
            for text in ('{"label": "yes"}', "no")
        ],
    ),
    (needle_format.COMPLETED, lambda: [needle_format.completed(folded(*_CALLED), NEEDLE_CTX)]),
    (responses_format.RESPONSE, lambda: [responses_format.whole(folded(*_CALLED), responses_ctx())]),
    (
        responses_format.RESPONSE,
        lambda: [responses_format.whole(folded(*_TEXT, ev.Activations(READ_SOME)), responses_ctx(store=False))],
    ),
    (responses_format.RESPONSE, lambda: responses([*_TEXT[:-1], finished(0, "length", tokens=1)])[1]),
    (responses_format.EVENTS, lambda: _data(responses(_CALLED)[0])),
    (responses_format.EVENTS, lambda: _data(responses([ev.Delta(0, "part"), ev.Failure(FAILED)])[0])),
    (messages_format.MESSAGE, lambda: [messages_format.whole(folded(*_CALLED), MESSAGES_CTX)]),
    (
        messages_format.MESSAGE,
        lambda: [messages_format.whole(folded(*_TEXT, ev.Activations(READ_SOME)), MESSAGES_CTX)],
    ),
    (messages_format.EVENTS, lambda: _data(frames(messages_format.stream, _CALLED, MESSAGES_CTX))),
    (
        messages_format.EVENTS,
        lambda: _data(frames(messages_format.stream, [*_TEXT, ev.Activations(READ)], MESSAGES_CTX)),
    ),
    (messages_format.EVENTS, lambda: _data(frames(messages_format.stream, [ev.Failure(FAILED)], MESSAGES_CTX))),
    (ollama_format.CHATTED, lambda: [ollama_format.whole(folded(*_CALLED), ollama_ctx())]),
    (ollama_format.CHATTED, lambda: [ollama_format.whole(_ollama_text(), ollama_ctx(logprobs=True))]),
    (ollama_format.CHATTED, lambda: [ollama_format.loaded("m", True, reason) for reason in ("load", "unload")]),
    (ollama_format.CHATTED_LINE, lambda: _lines(_CALLED, ollama_ctx())),
    (ollama_format.CHATTED_LINE, lambda: _lines([ev.Tokens(0, (TOK,)), *_TEXT[1:]], ollama_ctx(logprobs=True))),
    (ollama_format.CHATTED_LINE, lambda: _lines([ev.Delta(0, "part"), ev.Failure(FAILED)], ollama_ctx())),
    (ollama_format.GENERATED, lambda: [ollama_format.whole(_ollama_text(), ollama_ctx(chat=False, logprobs=True))]),
    (ollama_format.GENERATED, lambda: [ollama_format.loaded("m", False, "load")]),
    (ollama_format.GENERATED_LINE, lambda: _lines([ev.Tokens(0, (TOK,)), *_TEXT[1:]], ollama_ctx(chat=False))),
    (openai_api.EMBEDDING_LIST, lambda: [openai_api.embedding_list(EMBEDDED, f, "m") for f in ("float", "base64")]),
    (openai_api.MODEL, lambda: [openai_api.model_card("m")]),
    (openai_api.MODEL_LIST, lambda: [openai_api.MODEL_LIST.build(object="list", data=[openai_api.model_card("m")])]),
    (
        ollama_embed.EMBEDDED,
        lambda: [
            ollama_embed.EMBEDDED.build(
                model="m", embeddings=[[0.6, 0.8]], total_duration=5, load_duration=0, prompt_eval_count=2
            )
        ],
    ),
    (ollama_embed.EMBEDDING, lambda: [ollama_embed.EMBEDDING.build(embedding=[1.5, -2.0])]),
    (
        tokenize_api.TOKENIZED,
        lambda: [
            tokenize_api.tokenized_answer(Tokenized("t", [1, 2], 2048, token_strs=strs)) for strs in (None, ["a", "b"])
        ],
    ),
    (tokenize_api.DETOKENIZED, lambda: [tokenize_api.DETOKENIZED.build(prompt="Hi")]),
    (model_facts.TAGS, lambda: [model_facts.TAGS.build(models=model_facts.tags(PLACED))]),
    (model_facts.PS, lambda: [model_facts.PS.build(models=model_facts.ps(PLACED))]),
    (
        model_facts.SHOWN,
        lambda: [
            model_facts.show(p, caps, False)
            for p, caps in zip(
                PLACED * 2, (ENGINES["transformers"], ENGINES["openvino"], EMBEDDING_MODEL, EMBEDDING_MODEL)
            )
        ],
    ),
    (features_api.JOB, lambda: [features_api.JOB.build(**job) for job in _JOBS]),
    (features_api.JOBS, lambda: [features_api.JOBS.build(jobs=[features_api.JOB.build(**job) for job in _JOBS])]),
    (
        features_api.FEATURE,
        lambda: [features_api.feature_answer("m", "s", 3, held) for held in (_HELD, dict.fromkeys(_HELD))],
    ),
    (
        features_api.SEARCHED,
        lambda: [
            features_api.SEARCHED.build(
                model="m",
                sae_id="s",
                tokens=["The", " city"],
                features=[
                    features_api.hit(
                        {
                            "index": 4,
                            "label": None,
                            "value": 2.5,
                            "mean": 0.5,
                            "positions": [{"position": 1, "token": " city", "value": 2.5}],
                        }
                    )
                ],
            ),
            features_api.SEARCHED.build(model="m", sae_id="s", features=[features_api.hit({"index": 4, "label": "x"})]),
        ],
    ),
    (
        features_api.CONTRASTED,
        lambda: [
            features_api.CONTRASTED.build(
                model="m",
                sae_id="s",
                features=[{"index": 1, "label": None, "difference": 0.5, "mean_positive": 0.75, "mean_negative": 0.25}],
                measure=measure,
                profile=profile,
            )
            for measure, profile in ((None, None), (_MEASURE, {"name": "p"}))
        ],
    ),
]
_JOBS = [
    {
        "id": "dash_0123456789abcdef",
        "model": "m",
        "sae_id": "s",
        "status": status,
        "features": [0, 1],
        "corpus": {"files": [], "seeds": ["Hi"], "generated_tokens": 8},
        "top_k": 8,
        "context_tokens": 32,
        "max_tokens": 4096,
        "logit_k": 10,
        "progress": {},
        "error": error,
        "created_at": 1.5,
        "updated_at": 2.5,
    }
    for status, error in (("running", None), ("interrupted", "stopped"))
]
_HELD = {
    "logits": {
        "promoted": [{"id": 1, "text": "a", "value": 0.5}],
        "suppressed": [{"id": 2, "text": "b", "value": -0.5}],
    },
    "logits_job": "dash_0123456789abcdef",
    "stats": {
        "tokens": 10,
        "density": 0.5,
        "histogram": {"edges": [0.001, 0.01], "counts": [0, 1, 0]},
        "contexts": [{"max": 1.5, "max_position": 1, "tokens": [{"id": 1, "text": "a", "activation": 0.0}]}],
    },
    "stats_job": "dash_0123456789abcdef",
    "label": "a label",
}
_MEASURE = {
    "held_out": "Hi",
    "baseline": 0.1,
    "target": 0.9,
    "tried": [{"strength": 5.0, "score": 0.5, "progress": 0.5, "text": "there"}],
    "suggested": 5.0,
}


def _ollama_text() -> ev.Completion:
    return folded(ev.Tokens(0, (TOK,)), *_TEXT[1:])


def _lines(events, ctx) -> list[dict]:
    async def main():
        return [json.loads(line) async for line in ollama_format.lines(_each(events), ctx)]

    return trio.run(main)


def _data(frames: list[tuple[str, dict]]) -> list[dict]:
    """A stream's events' data, each checked to be named for its type."""
    assert all(name == data["type"] for name, data in frames)
    return [data for _, data in frames]


def _validator(declared: objects.Object | objects.Events) -> jsonschema_rs.Draft202012Validator:
    components: dict = openapi._error_schemas()  # a stream's error line or event: the envelope
    if isinstance(declared, objects.Events):
        declared = declared.data
    ref = (declared if isinstance(declared, Named) else declared.ref()).render(components)
    return jsonschema_rs.Draft202012Validator({**ref, "components": {"schemas": components}})


@pytest.mark.parametrize("declared, built", SAMPLES, ids=lambda v: getattr(v, "name", ""))
def test_what_the_formatter_builds_validates_against_the_objects_rendered_schema(declared, built):
    bodies = built()
    assert bodies
    validator = _validator(declared)
    for body in bodies:
        errors = [e.message for e in validator.iter_errors(body)]
        assert not errors, (body, errors)


def test_every_object_the_document_renders_from_a_declaration_has_samples():
    assert {o.name for o in openapi._OBJECTS} == {declared.name for declared, _ in SAMPLES}


def test_the_document_holds_each_objects_rendered_schema():
    schemas = openapi.document()["components"]["schemas"]
    for declared in openapi._OBJECTS:
        components: dict = {}
        (declared if isinstance(declared, Named) else declared.ref()).render(components)
        assert {name: schemas[name] for name in components} == components


def test_a_key_the_declaration_lacks_or_a_required_key_missing_fails_at_build_time():
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert chat_format.USAGE.build(**usage) == usage
    with pytest.raises(objects.Undeclared, match="Usage: cached_tokens not declared"):
        chat_format.USAGE.build(**usage, cached_tokens=0)
    with pytest.raises(objects.Undeclared, match="ChatCompletion: choices, usage missing"):
        chat_format.CHAT_COMPLETION.build(
            id="c", object="chat.completion", created=0, model="m", system_fingerprint="millm:m"
        )
    with pytest.raises(objects.Undeclared, match="ChatDelta: refusal not declared"):
        chat_format.DELTA.build(refusal=None)


def test_every_reference_in_the_document_names_a_schema_it_holds():
    """A route's stream names its line's object by name (routes.py): a renamed object left the
    NDJSON streams of /api/generate and /api/chat pointing at nothing."""
    document = openapi.document()
    refs = set(re.findall(r'"#/components/(\w+)/([^"]+)"', json.dumps(document)))
    assert {(kind, name) for kind, name in refs if name not in document["components"].get(kind, {})} == set()
