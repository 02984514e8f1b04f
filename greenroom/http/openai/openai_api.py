"""The OpenAI /v1 surface: chat and text completions (streamed and not), embeddings,
models. Every request goes through the field ledger before anything is loaded."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import attrs
from quart import Quart, request

from greenroom import structured_fields as sf
from greenroom.engines.base import ModelInfo
from greenroom.engines.capabilities import Capabilities
from greenroom.errors import GreenroomError
from greenroom.http.core import contracts, framing, ledger, routes
from greenroom.http.core.contracts import Shape
from greenroom.http.core.headers import CONSTRAINED_HEADER, SEED_HEADER, STEERING_HEADER, STRICT_HEADER
from greenroom.http.manage import steering_api
from greenroom.http.openai import chat_format, logprobs, needle, needle_format, openai_params, scoring
from greenroom.http.openai.openai_params import Streaming
from greenroom.http.pipeline import events as typed
from greenroom.http.pipeline import sae_activations, structured
from greenroom.http.pipeline.answering import answer, drawn_seed, single, vectors
from greenroom.http.pipeline.paths import FieldPaths
from greenroom.protocol import Admitted, Generate, Score
from greenroom.supervisor.tree import Tree


@attrs.frozen
class Prepared:
    body: dict
    model: str
    ignored: list[str]
    strict: bool
    caps: Capabilities = Capabilities()
    where: str = ""  # "on <endpoint> with the <engine> engine": where a refusal says it could not honour
    paths: FieldPaths = FieldPaths()  # a translated surface's names for the chat request's fields

    def unread(self, also_ignored: tuple[str, ...] = ()) -> list[str]:
        """Every location not read: the ledger's, and fields this request's path skips."""
        return self.ignored + [f for f in also_ignored if self.body.get(f) is not None]

    def headers(self, also_ignored: tuple[str, ...] = ()) -> dict[str, str]:
        """Refuse under strict mode, else the report of every field not read."""
        return ledger.report_headers(self.unread(also_ignored), self.strict)

    def translated(self, chat: dict, unread: list[str], paths: FieldPaths) -> Prepared:
        """A surface translated onto chat completions (Responses, Anthropic's Messages): its request
        as the chat request it became, with the nested keys its translation did not read and where
        each of its fields came from (`paths`: the surface names its refusals by it, before the answer
        and in its stream); a forced tool_choice checked as chat's is."""
        ledger.constrained_choice(chat, self.caps, self.where)
        return attrs.evolve(self, body=chat, ignored=self.ignored + unread, paths=paths)


class Formatter(Protocol):
    """How a generation answers on a surface, given the request's Admitted: `stream` turns the
    one typed event stream (http/pipeline/events.py) into the surface's frames, `whole` the
    folded Completion into its body — each through the surface's pure formatter."""

    def stream(self, events: AsyncIterator[typed.Event], admitted: Admitted) -> AsyncIterator[bytes]: ...

    async def whole(self, completion: typed.Completion, admitted: Admitted): ...


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
            logprobs.writers(gen, admitted, self.chat, self.as_ids),
            self.include_usage,
            self.fingerprint,
            self.extras,
        )

    def stream(self, events, admitted: Admitted) -> AsyncIterator[bytes]:
        return chat_format.stream(events, self.context(admitted))

    async def whole(self, completion: typed.Completion, admitted: Admitted):
        return self.body(completion, self.context(admitted))


async def prepare(tree: Tree, shape: Shape, where: str, translated: bool = False) -> Prepared:
    """Parse, find the model's engine, and run the ledger: refusals happen here, before
    any engine is asked for anything. `translated`: see ledger.check."""
    strict = ledger.strict_mode(request.headers.get(STRICT_HEADER))
    body = openai_params.parse_json(await request.get_data())
    model = tree.resolve(openai_params.model_name(body))
    engine, caps = tree.capabilities(model)
    where = f"{where} with the {engine} engine"
    ignored = ledger.check(shape, body, caps, where, translated)
    return Prepared(body, model, ignored, strict, caps, where)


# the chat and text completion requests, as the parsers of each part declare them
CHAT = contracts.merge(openai_params.CHAT, structured.CHAT, scoring.CHAT, steering_api.CHAT, ledger=True)
COMPLETION = contracts.merge(openai_params.COMPLETION, scoring.COMPLETION, ledger=True)

# miLLM's per-request fields on the surfaces translated onto chat completions, declared as chat
# declares them: top-level fields, what the SDKs send with extra_body
MILLM = contracts.merge(
    Shape(fields={"seed": openai_params.SEED, "return_sae_activations": openai_params.SAE_ACTIVATIONS}),
    steering_api.CHAT,
)


async def generation(tree: Tree, req: Prepared, surface: Formatter | None = None, extras: bool = False):
    """Chat completions' generation path, the one every surface translated onto it runs: the
    structured-output plan, the engine request, SAE activations, the request's steering, then the
    answer, as `surface` formats it (None: chat completions'); `extras`: the x_needle block."""
    stream = openai_params.streaming(req.body)
    plan = structured.plan(req.body, batching=tree.config.continuous_batching)
    gen = _reporting(openai_params.chat_request(req.body, req.model, stream, plan.tools, plan.constraint), req.body)
    gen = await sae_activations.attach(tree, req.body, gen)
    gen, steering = await steering_api.request_steering(tree, req.body, gen)
    needle_block = (
        chat_format.Extras(
            gen.conversations[0], [f"ignored field: {w}" for w in req.unread(scoring.unread(gen.params))]
        )
        if extras
        else None
    )
    return await _complete(tree, gen, stream, req, plan, surface, needle_block, steering)


def _reporting(gen: Generate, body: dict, chat: bool = True) -> Generate:
    """A generation that asks for logprobs: the engine reports each token, and the most probable
    `top` at its position."""
    top = scoring.generation_logprobs(body, chat)
    return gen if top is None else attrs.evolve(gen, params=attrs.evolve(gen.params, logprobs=top))


def register(app: Quart, tree: Tree) -> None:
    @routes.view(app, "POST", "/v1/chat/completions")
    async def chat_completions():
        req = await prepare(tree, CHAT, "on chat completions")
        if scoring.is_chat_scoring(req.body):
            stream = openai_params.streaming(req.body)
            score = await sae_activations.attach(tree, req.body, scoring.chat_score(req.body, req.model, stream.on))
            return await _score(tree, score, req, scoring.chat_response)
        return await generation(tree, req, extras=tree.config.expose_extras)

    @routes.view(app, "POST", "/v1/completions")
    async def completions():
        req = await prepare(tree, COMPLETION, "on text completions")
        stream = openai_params.streaming(req.body)
        if scoring.is_completion_scoring(req.body):
            score = scoring.completion_score(req.body, req.model, stream.on)
            score = await sae_activations.attach(tree, req.body, score)
            return await _score(tree, score, req, scoring.completion_response)
        gen = _reporting(openai_params.completion_request(req.body, req.model, stream), req.body, chat=False)
        gen = await sae_activations.attach(tree, req.body, gen)
        return await _complete(tree, gen, stream, req, None, steering=steering_api.live_headers(tree, gen.model))

    @routes.view(app, "POST", "/v1/embeddings")
    async def embeddings():
        req = await prepare(tree, openai_params.EMBEDDING, "on embeddings")
        embed, fmt = openai_params.embedding_request(req.body, req.model)
        headers = req.headers()
        client, _ = await tree.client_for(req.model)
        event = await single(client, embed)
        floats = vectors(event) if fmt == "float" else None
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v).decode() if floats is None else floats[i],
            }
            for i, v in enumerate(event.vectors)
        ]
        usage = {"prompt_tokens": event.prompt_tokens, "total_tokens": event.prompt_tokens}
        return {"object": "list", "data": data, "model": req.model, "usage": usage}, 200, headers

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
        return {
            "object": "list",
            "data": [_model_card(m["id"]) for m in tree.models() if tree.locked_model in (None, m["id"])],
        }

    @routes.view(app, "GET", "/v1/models/{id}")
    async def get_model(id: str):  # noqa: A002 (the route's path parameter)
        if any(m["id"] == id for m in tree.models()):
            return _model_card(id)
        raise GreenroomError("model_not_found", f"The model '{id}' does not exist", "model")


_CREATED = int(time.time())


def _model_card(model_id: str) -> dict:
    return {"id": model_id, "object": "model", "created": _CREATED, "owned_by": "greenroom"}


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
    chat, paths = translate(body)
    warnings = [f for f in body if f not in fields + _NEEDLE_COMMON]
    model = body.get("model")
    if model not in tree.model_ids():
        if model is not None and tree.config.needle_strict_model:
            raise GreenroomError("model_not_found", f"The model '{model}' does not exist", "model")
        if model is not None:
            warnings.append(f"model {model!r} is not served; answered by {tree.model_ids()[0]!r}")
        model = tree.model_ids()[0]
    chat["model"] = model
    with paths.renaming():
        plan = attrs.evolve(structured.plan(chat), lenient=True)  # the route judges the document
        gen = openai_params.chat_request(chat, model, Streaming(False, False), plan.tools, plan.constraint)
        req = Prepared(chat, model, [], strict=False, paths=paths)
        extras = chat_format.Extras(gen.conversations[0], [f"ignored field: {w}" if w in body else w for w in warnings])
        surface = _Chat(
            gen, True, extras=extras, body=lambda completion, ctx: (completion, ctx)
        )  # the routes format it
        (completion, ctx), _, _ = await _complete(tree, gen, Streaming(False, False), req, plan, surface)
    return completion, ctx, plan


def _seed_header(body: dict, scope: str = "request") -> dict[str, str]:
    """X-miLLM-Seed echoes a sent seed with the scope of its promise; absent without one."""
    seed = body.get("seed")
    return {SEED_HEADER: sf.item(seed, {"scope": scope})} if seed is not None else {}


async def _score(tree: Tree, score: Score, req: Prepared, shape) -> tuple:
    headers = {
        **req.headers(scoring.NOT_APPLICABLE),
        **_seed_header(req.body, "batch-shape" if req.body.get("extra_messages") else "request"),
        STEERING_HEADER: "none",
    }  # the spec: scoring runs with every SAE hook suppressed
    openai_params.sampling(req.body)  # the seed and the rest are still validated
    client, serving = await tree.client_for(score.model)
    event = await single(client, score)
    response = shape(score, event, req.body, fingerprint(serving.info))
    if event.sae_activations is not None:
        response["millm"] = sae_activations.millm(event.sae_activations)
    return response, 200, headers


async def _complete(
    tree: Tree,
    gen: Generate,
    stream: Streaming,
    req: Prepared,
    plan: structured.Plan | None,
    surface: Formatter | None = None,
    extras: chat_format.Extras | None = None,
    steering: dict[str, str] | None = None,
):
    """Chat when `plan` is given (its constraint and tools), else a text completion: the engine's
    events become the one typed stream (pipeline/events.py), which `surface` formats (None: chat
    or text completions', `extras` adding the x_needle block); `steering`: the steering headers
    (steering_api)."""
    scope = "batch-shape" if gen.conversations and len(gen.conversations) > 1 else "request"
    headers = {**req.headers(scoring.unread(gen.params)), **_seed_header(req.body, scope), **(steering or {})}
    if plan is not None and plan.header:
        headers[CONSTRAINED_HEADER] = plan.header
    client, serving = await tree.client_for(gen.model)
    if surface is None:
        as_ids = req.body.get("return_tokens_as_token_ids") is True
        surface = _Chat(gen, plan is not None, stream.include_usage, as_ids, fingerprint(serving.info), extras)

    async def native(events, admitted: Admitted):
        async for event in typed.native(events, gen.choices, admitted.prompt_tokens, plan):
            # a failure in the answer names the field the client sent (a translated surface's own)
            yield typed.Failure(req.paths.renamed(event.error)) if isinstance(event, typed.Failure) else event

    async def whole(events, admitted: Admitted):
        return await surface.whole(await typed.collect(native(events, admitted), gen.choices), admitted)

    return await answer(
        tree,
        client,
        gen,
        framing=framing.SSE if stream.on else None,
        headers=lambda first: {**headers, **drawn_seed(first, scope)},
        frames=lambda events, first: surface.stream(native(events, first), first),
        collect=whole,
    )
