"""The OpenAI /v1 surface: chat and text completions (streamed and not), embeddings,
models. Every request goes through the field ledger before anything is loaded."""

from __future__ import annotations

import array
import base64
import time
from collections.abc import AsyncIterator, Callable

import attrs
from quart import Quart, request

from greenroom.engines.base import ModelInfo
from greenroom.errors import GreenroomError
from greenroom.http.core import contracts, routes
from greenroom.http.core.contracts import AnyOf, ListOf, Schema
from greenroom.http.core.headers import STEERING_HEADER
from greenroom.http.core.objects import COUNT, FLOAT, INTEGER, TEXT, Object, const
from greenroom.http.manage import steering_api
from greenroom.http.openai import chat_format, logprobs, needle, needle_format, openai_params, scoring
from greenroom.http.pipeline import events as typed
from greenroom.http.pipeline import generation, sae_activations, structured
from greenroom.http.pipeline.answering import cut, single, vectors, vectors_answer
from greenroom.http.pipeline.generation import Planned, Prepared, prepare
from greenroom.http.pipeline.request import ChatRequest, Streaming
from greenroom.protocol import Admitted, Embedded, Generate, Score
from greenroom.supervisor.lifecycle import Serving
from greenroom.supervisor.tree import Tree

# --- the objects (openapi.py renders them) -------------------------------------------------

EMBEDDING = Object(
    name="Embedding",
    fields={
        "object": const("embedding"),
        "index": COUNT,
        "embedding": AnyOf(
            options=(ListOf(items=FLOAT), Schema(schema={"type": "string", "contentEncoding": "base64"}))
        ),
    },
)
EMBEDDING_USAGE = Object(name="EmbeddingUsage", fields={"prompt_tokens": COUNT, "total_tokens": COUNT})
EMBEDDING_LIST = Object(
    name="EmbeddingList",
    fields={"object": const("list"), "data": ListOf(items=EMBEDDING.ref()), "model": TEXT, "usage": EMBEDDING_USAGE},
)
MODEL = Object(
    name="Model",
    fields={"id": TEXT, "object": const("model"), "created": INTEGER, "owned_by": TEXT},
    closed=False,
)
MODEL_LIST = Object(name="ModelList", fields={"object": const("list"), "data": ListOf(items=MODEL.ref())}, closed=False)
OBJECTS = (EMBEDDING_LIST, MODEL, MODEL_LIST)


@attrs.frozen
class _Chat:
    """Chat and text completions' Formatter (chat_format); `body`: another form of the whole
    answer, from the same Completion and context (Needle's)."""

    gen: Generate
    chat: bool
    include_usage: bool = False
    as_ids: bool = False  # return_tokens_as_token_ids
    fingerprint: str = ""
    extras: chat_format.Extras | None = None
    body: Callable[[typed.Completion, chat_format.Context], object] = chat_format.whole

    def context(self, admitted: Admitted) -> chat_format.Context:
        gen = self.gen
        return chat_format.Context(
            gen.rid,
            gen.model,
            gen.choices,
            admitted.prompt_tokens,
            self.chat,
            logprobs.writers(gen, admitted, self.chat, self.as_ids) if gen.params.logprobs is not None else {},
            self.include_usage,
            self.fingerprint,
            self.extras,
        )

    def stream(self, events, admitted: Admitted) -> AsyncIterator[bytes]:
        return chat_format.stream(events, self.context(admitted))

    async def whole(self, completion: typed.Completion, admitted: Admitted):
        return self.body(completion, self.context(admitted))


# the chat and text completion requests, as the parsers of each part declare them
CHAT = contracts.merge(openai_params.CHAT, structured.CHAT, scoring.CHAT, steering_api.CHAT, ledger=True)
COMPLETION = contracts.merge(openai_params.COMPLETION, scoring.COMPLETION, ledger=True)


def _chat(req: Prepared, job: Planned, serving: Serving, extras: bool = False, chat: bool = True) -> _Chat:
    """Chat (or text) completions' Formatter for `job` where `serving` runs it; `extras`: the
    x_needle block, with the ledger's warnings."""
    gen = job.gen
    block = None
    if extras:
        block = chat_format.Extras(gen.conversations[0], [f"ignored field: {w}" for w in req.unread_by(gen)])
    as_ids = (req.request.as_ids if req.request is not None else req.body.get("return_tokens_as_token_ids")) is True
    return _Chat(gen, chat, job.stream.include_usage, as_ids, fingerprint(serving.info), block)


def parse_chat(body: dict) -> ChatRequest:
    """Chat completions' translator: its body → the surface-neutral ChatRequest
    (pipeline/request.py), each field checked as openai_params declares it; its locations are
    chat's own, so its refusals need no renaming."""
    stream = openai_params.streaming(body)
    rows = openai_params.conversations(body)
    n = openai_params.choices(rows, openai_params.choices_n(body, stream.on))
    params = openai_params.sampling(body, openai_params.CHAT_MAX_TOKENS)
    kwargs = openai_params.template_kwargs(body)
    if _scores(body):
        params = attrs.evolve(params, logprobs=scoring.generation_logprobs(body, chat=True))
    return ChatRequest(
        body.get("model"),
        rows,
        params,
        stream,
        n,
        kwargs,
        structured.Output.of(body),
        as_ids=body.get("return_tokens_as_token_ids"),
        **openai_params.millm(body),
    )


def _scores(body: dict) -> bool:
    """Whether a chat body sends any of scoring's fields (logprobs, top_logprobs,
    allowed_token_ids, return_tokens_as_token_ids): without one, none of scoring's checks applies."""
    return not scoring.CHAT.fields.keys().isdisjoint(body)


def register(app: Quart, tree: Tree) -> None:
    @routes.view(app, "POST", "/v1/chat/completions")
    async def chat_completions():
        req = await prepare(tree, CHAT, "on chat completions", generates="chat")
        if _scores(req.body) and scoring.is_chat_scoring(req.body):
            stream = openai_params.streaming(req.body)
            score = await _readout(tree, req.body, scoring.chat_score(req.body, req.model, stream.on))
            return await _score(tree, score, req, scoring.chat_response)
        extras = tree.config.expose_extras
        req = req.asking(parse_chat(req.body))
        return await generation.chat(tree, req, lambda job, serving: _chat(req, job, serving, extras))

    @routes.view(app, "POST", "/v1/completions")
    async def completions():
        req = await prepare(tree, COMPLETION, "on text completions", generates="generate")
        stream = openai_params.streaming(req.body)
        if scoring.is_completion_scoring(req.body):
            score = await _readout(tree, req.body, scoring.completion_score(req.body, req.model, stream.on))
            return await _score(tree, score, req, scoring.completion_response)
        gen = scoring.reporting(openai_params.completion_request(req.body, req.model, stream), req.body, chat=False)
        gen = await _readout(tree, req.body, gen)
        job = Planned(gen, None, stream, steering_api.live_headers(tree, gen.model))
        return await generation.answer(tree, req, job, lambda job, serving: _chat(req, job, serving, chat=False))

    @routes.view(app, "POST", "/v1/embeddings")
    async def embeddings():
        req = await prepare(tree, openai_params.EMBEDDING, "on embeddings")
        embed, fmt, dimensions = openai_params.embedding_request(req.body, req.model)
        headers = req.headers()
        client, _ = await tree.client_for(req.model)
        return vectors_answer(embedding_list(await single(client, embed), fmt, req.model, dimensions), headers)

    @routes.view(app, "POST", "/v1/needle/extract")
    async def needle_extract():
        completion, ctx, plan = await _needle_chat(tree, needle.extraction_chat, ("text", "name", "schema"))
        return needle_format.extracted(completion, ctx, plan)

    @routes.view(app, "POST", "/v1/needle/complete")
    async def needle_complete():
        fields = ("query", "system", "messages", "tools")
        completion, ctx, _ = await _needle_chat(tree, needle.completion_chat, fields)
        return needle_format.completed(completion, ctx)

    @routes.view(app, "GET", "/v1/models")
    async def list_models():
        """Every available model; while one is locked for steering, that one alone (spec: Models)."""
        ids = [m["id"] for m in tree.models() if tree.locked_model in (None, m["id"])]
        return MODEL_LIST.build(object="list", data=[model_card(i) for i in ids])

    @routes.view(app, "GET", "/v1/models/{id}")
    async def get_model(id: str):  # noqa: A002 (the route's path parameter)
        if any(m["id"] == id for m in tree.models()):
            return model_card(id)
        raise GreenroomError("model_not_found", f"The model '{id}' does not exist", "model")


_CREATED = int(time.time())


def model_card(model_id: str) -> dict:
    return MODEL.build(id=model_id, object="model", created=_CREATED, owned_by="greenroom")


def embedding_list(event: Embedded, fmt: str, model: str, dimensions: int | None = None) -> dict:
    """The embeddings of `event`: floats, or with encoding_format base64 the float32 bytes;
    `dimensions`: each cut to that many, at unit length again (400 past the model's width)."""
    raw = event.vectors
    if dimensions is not None:
        width = len(raw[0]) // 4
        if dimensions > width:
            raise GreenroomError(
                "invalid_parameter",
                f"'dimensions' is {dimensions}, past this model's {width}: it can shorten its vectors, not lengthen "
                "them",
                "dimensions",
            )
        raw = [row.tobytes() for row in cut(vectors(event), dimensions)]
    data = [
        EMBEDDING.build(
            object="embedding",
            index=i,
            embedding=array.array("f", v).tolist() if fmt == "float" else base64.b64encode(v).decode(),
        )
        for i, v in enumerate(raw)
    ]
    usage = EMBEDDING_USAGE.build(prompt_tokens=event.prompt_tokens, total_tokens=event.prompt_tokens)
    return EMBEDDING_LIST.build(object="list", data=data, model=model, usage=usage)


def fingerprint(info: ModelInfo) -> str:
    """millm:<model>@<revision>:<dtype>/<quantization>:<engine>; unknown parts 'unrecorded'."""

    def part(key: str) -> str:
        return getattr(info, key) or "unrecorded"

    return f"millm:{info.id}@{part('revision')}:{part('dtype')}/{part('quantization')}:{part('engine')}"


_NEEDLE_COMMON = ("model", "max_tokens", "temperature", "seed")


async def _needle_chat(
    tree: Tree, translate, fields: tuple[str, ...]
) -> tuple[typed.Completion, chat_format.Context, structured.Plan]:
    """Run a /v1/needle/* request as the chat completion it translates to. Any model name
    is accepted, as in Needle: an unknown one is answered by the first model, and says so —
    unless needle_strict_model (NEEDLE_STRICT_MODEL=true): then it is a 404."""
    body = openai_params.parse_json(await request.get_data())
    asked, paths = translate(body)
    warnings = [f for f in body if f not in fields + _NEEDLE_COMMON]
    model = body.get("model")
    if model not in tree.model_ids():
        if model is not None and tree.config.needle_strict_model:
            raise GreenroomError("model_not_found", f"The model '{model}' does not exist", "model")
        if model is not None:
            warnings.append(f"model {model!r} is not served; answered by {tree.model_ids()[0]!r}")
        model = tree.model_ids()[0]
    with paths.renaming():
        plan = attrs.evolve(structured.plan(asked.output), lenient=True)  # the route judges the document
        gen = openai_params.chat_request(asked, model, plan.tools, plan.constraint)
        req = Prepared(body, model, [], strict=False, paths=paths, request=asked)
        extras = chat_format.Extras(gen.conversations[0], [f"ignored field: {w}" if w in body else w for w in warnings])
        surface = _Chat(
            gen, True, extras=extras, body=lambda completion, ctx: (completion, ctx)
        )  # the routes format it
        job = Planned(gen, plan, Streaming(False, False), {})
        (completion, ctx), _, _ = await generation.answer(tree, req, job, lambda *_: surface)
    return completion, ctx, plan


async def _readout(tree: Tree, body: dict, gen: Generate | Score):
    """`gen` with the SAE readout its body asks for (return_sae_activations), if it asks for one."""
    value = body.get(sae_activations.FIELD)
    if value is None:
        return gen
    return await sae_activations.attach(tree, value, gen, several=body.get("extra_messages") is not None)


async def _score(tree: Tree, score: Score, req: Prepared, shape) -> tuple:
    headers = {
        **req.headers(scoring.NOT_APPLICABLE),
        **generation.seed_header(req.body.get("seed"), "batch-shape" if req.body.get("extra_messages") else "request"),
        STEERING_HEADER: "none",
    }  # the spec: scoring runs with every SAE hook suppressed
    openai_params.sampling(req.body)  # the seed and the rest are still validated
    client, serving = await tree.client_for(score.model)
    event = sae_activations.with_labels(tree, score.model, await single(client, score))
    return shape(score, event, req.body, fingerprint(serving.info)), 200, headers
