"""The OpenAI /v1 surface: chat and text completions (streamed and not), embeddings,
models. Every request goes through the field ledger before anything is loaded."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import attrs
from quart import Quart, request

from greenroom import structured_fields as sf
from greenroom.engines.base import ModelInfo
from greenroom.engines.capabilities import Capabilities
from greenroom.errors import GreenroomError
from greenroom.http import (
    contracts,
    framing,
    ledger,
    logprobs,
    needle,
    openai_params,
    routes,
    sae_activations,
    scoring,
    steering_api,
    structured,
)
from greenroom.http.answering import answer, drawn_seed, single, vectors
from greenroom.http.contracts import Shape
from greenroom.http.openai_params import Streaming
from greenroom.protocol import Admitted, Failed, Generate, Score, Text
from greenroom.supervisor.tree import Tree


@attrs.frozen
class Prepared:
    body: dict
    model: str
    ignored: list[str]
    strict: bool
    caps: Capabilities = Capabilities()
    where: str = ""  # "on <endpoint> with the <engine> engine": where a refusal says it could not honour

    def unread(self, also_ignored: tuple[str, ...] = ()) -> list[str]:
        """Every location not read: the ledger's, and fields this request's path skips."""
        return self.ignored + [f for f in also_ignored if self.body.get(f) is not None]

    def headers(self, also_ignored: tuple[str, ...] = ()) -> dict[str, str]:
        """Refuse under strict mode, else the report of every field not read."""
        return ledger.report_headers(self.unread(also_ignored), self.strict)

    def translated(self, chat: dict, unread: list[str]) -> Prepared:
        """A surface translated onto chat completions (Responses, Anthropic's Messages): its request
        as the chat request it became, with the nested keys its translation did not read; a
        forced tool_choice checked as chat's is."""
        ledger.constrained_choice(chat, self.caps, self.where)
        return attrs.evolve(self, body=chat, ignored=self.ignored + unread)


@attrs.frozen
class Extras:
    """What x_needle needs beside the engine's figures."""

    conversation: list[dict]
    warnings: list[str]


@attrs.frozen
class Shaped:
    """How a chat completion answers on a surface: `stream` frames the chat chunks (`_chunks`, the
    one streaming core: GreenroomError raised at a failure) as its bytes, given the Admitted;
    `whole` turns the collected chat completion into its body."""

    stream: Callable[[AsyncIterator[dict], Admitted], AsyncIterator[bytes]]
    whole: Callable[[dict], Awaitable[dict]]


async def prepare(tree: Tree, table: dict, where: str, translated: bool = False) -> Prepared:
    """Parse, find the model's engine, and run the ledger: refusals happen here, before
    any engine is asked for anything. `translated`: see ledger.check."""
    strict = ledger.strict_mode(request.headers.get("X-miLLM-Strict"))
    body = openai_params.parse_json(await request.get_data())
    model = tree.resolve(openai_params.model_name(body))
    engine, caps = tree.capabilities(model)
    where = f"{where} with the {engine} engine"
    ignored = ledger.check(table, body, caps, where, translated)
    return Prepared(body, model, ignored, strict, caps, where)


# miLLM's per-request fields on the surfaces translated onto chat completions, declared as chat
# declares them: top-level fields, what the SDKs send with extra_body
MILLM = contracts.merge(
    Shape(fields={"seed": openai_params.SEED, "return_sae_activations": openai_params.SAE_ACTIVATIONS}),
    steering_api.CHAT,
)


async def generation(tree: Tree, req: Prepared, shaped: Shaped | None = None, extras: bool = False):
    """Chat completions' generation path, the one every surface translated onto it runs: the
    structured-output plan, the engine request, SAE activations, the request's steering, then the
    answer, in `shaped`'s form (None: chat completions'); `extras`: the x_needle block."""
    stream = openai_params.streaming(req.body)
    plan = structured.plan(req.body, batching=tree.config.continuous_batching)
    gen = _reporting(openai_params.chat_request(req.body, req.model, stream, plan.tools, plan.constraint), req.body)
    gen = await sae_activations.attach(tree, req.body, gen)
    gen, steering = await steering_api.request_steering(tree, req.body, gen)
    needle_block = (
        Extras(gen.conversations[0], [f"ignored field: {w}" for w in req.unread(scoring.unread(gen.params))])
        if extras
        else None
    )
    return await _complete(tree, gen, stream, req, plan, needle_block, steering, shaped)


def _reporting(gen: Generate, body: dict, chat: bool = True) -> Generate:
    """A generation that asks for logprobs: the engine reports each token, and the most probable
    `top` at its position."""
    top = scoring.generation_logprobs(body, chat)
    return gen if top is None else attrs.evolve(gen, params=attrs.evolve(gen.params, logprobs=top))


@contextlib.contextmanager
def named(names: dict[str, str]):
    """A refusal of the chat request a surface was translated into, naming the surface's own
    fields (`names`: a regular expression over chat's names → the surface's)."""
    try:
        yield
    except GreenroomError as exc:
        param, message = exc.param, exc.message
        for pattern, own in names.items():
            param = param and re.sub(pattern, own, param)
            message = re.sub(pattern, own, message)
        raise GreenroomError(exc.code, message, param) from None


def register(app: Quart, tree: Tree) -> None:
    @routes.view(app, "POST", "/v1/chat/completions")
    async def chat_completions():
        req = await prepare(tree, ledger.CHAT, "on chat completions")
        if scoring.is_chat_scoring(req.body):
            stream = openai_params.streaming(req.body)
            score = await sae_activations.attach(tree, req.body, scoring.chat_score(req.body, req.model, stream.on))
            return await _score(tree, score, req, scoring.chat_response)
        return await generation(tree, req, extras=tree.config.expose_extras)

    @routes.view(app, "POST", "/v1/completions")
    async def completions():
        req = await prepare(tree, ledger.COMPLETIONS, "on text completions")
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
        req = await prepare(tree, ledger.EMBEDDINGS, "on embeddings")
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
        result, plan = await _needle_chat(tree, needle.extraction_chat, ("text", "name", "schema"))
        choice = result["choices"][0]
        doc = (
            structured.document(plan, choice["message"]["content"])
            if choice["finish_reason"] == "stop"
            else structured.INVALID
        )  # cut by max_tokens: no object came out
        matched = doc is not structured.INVALID
        return {
            "object": "needle.extraction",
            "data": doc if matched else None,
            "matched": matched,
            "x_needle": result["x_needle"],
        }

    @routes.view(app, "POST", "/v1/needle/complete")
    async def needle_complete():
        result, _ = await _needle_chat(tree, needle.completion_chat, ("query", "system", "messages", "tools"))
        choice = result["choices"][0]
        calls = [
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for c in choice["message"].get("tool_calls") or []
        ]
        return {
            "object": "needle.completion",
            "model": result["model"],
            "content": choice["message"]["content"],
            "tool_calls": calls,
            "finish_reason": choice["finish_reason"],
            "usage": result["usage"],
            "x_needle": result["x_needle"],
        }

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


async def _needle_chat(tree: Tree, translate, fields: tuple[str, ...]) -> tuple[dict, structured.Plan]:
    """Run a /v1/needle/* request as the chat completion it translates to. Any model name
    is accepted, as in Needle: an unknown one is answered by the first model, and says so —
    unless needle_strict_model (NEEDLE_STRICT_MODEL=true): then it is a 404."""
    body = openai_params.parse_json(await request.get_data())
    chat = translate(body)
    warnings = [f for f in body if f not in fields + _NEEDLE_COMMON]
    model = body.get("model")
    if model not in tree.model_ids():
        if model is not None and tree.config.needle_strict_model:
            raise GreenroomError("model_not_found", f"The model '{model}' does not exist", "model")
        if model is not None:
            warnings.append(f"model {model!r} is not served; answered by {tree.model_ids()[0]!r}")
        model = tree.model_ids()[0]
    chat["model"] = model
    plan = attrs.evolve(structured.plan(chat), lenient=True)  # the route judges the document
    gen = openai_params.chat_request(chat, model, Streaming(False, False), plan.tools, plan.constraint)
    req = Prepared(chat, model, [], strict=False)
    result, _, _ = await _complete(
        tree,
        gen,
        Streaming(False, False),
        req,
        plan,
        Extras(gen.conversations[0], [f"ignored field: {w}" if w in body else w for w in warnings]),
    )
    return result, plan


def _seed_header(body: dict, scope: str = "request") -> dict[str, str]:
    """X-miLLM-Seed echoes a sent seed with the scope of its promise; absent without one."""
    seed = body.get("seed")
    return {"X-miLLM-Seed": sf.item(seed, {"scope": scope})} if seed is not None else {}


async def _score(tree: Tree, score: Score, req: Prepared, shape) -> tuple:
    headers = {
        **req.headers(scoring.NOT_APPLICABLE),
        **_seed_header(req.body, "batch-shape" if req.body.get("extra_messages") else "request"),
        "X-miLLM-Steering": "none",
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
    extras: Extras | None = None,
    steering: dict[str, str] | None = None,
    shaped: Shaped | None = None,
):
    """Chat when `plan` is given (its constraint and tools), else a text completion;
    `extras` adds the x_needle block; `steering`: the steering headers (steering_api);
    `shaped`: the surface's form of the answer (None: chat or text completions')."""
    shaped = shaped or _AS_CHAT
    scope = "batch-shape" if gen.conversations and len(gen.conversations) > 1 else "request"
    as_ids = req.body.get("return_tokens_as_token_ids") is True
    headers = {**req.headers(scoring.unread(gen.params)), **_seed_header(req.body, scope), **(steering or {})}
    if plan is not None and plan.header:
        headers["X-miLLM-Constrained"] = plan.header
    client, serving = await tree.client_for(gen.model)
    return await answer(
        tree,
        client,
        gen,
        framing=framing.SSE if stream.on else None,
        headers=lambda first: {**headers, **drawn_seed(first, scope)},
        frames=lambda events, first: shaped.stream(
            _chunks(gen, events, first, plan, stream.include_usage, extras, as_ids), first
        ),
        collect=lambda events, first: _collected(
            shaped, gen, events, first, plan, fingerprint(serving.info), extras, as_ids
        ),
    )


async def _collected(shaped: Shaped, gen: Generate, events, admitted: Admitted, *rest) -> dict:
    return await shaped.whole(await _collect(gen, events, admitted, *rest))


async def _collect(
    gen: Generate,
    events,
    admitted: Admitted,
    plan: structured.Plan | None,
    system_fingerprint: str,
    extras: Extras | None = None,
    as_ids: bool = False,
) -> dict:
    texts: dict[int, list[str]] = {i: [] for i in range(gen.choices)}
    tokens: dict[int, list] = {i: [] for i in range(gen.choices)}
    finished: dict[int, Text] = {}
    async for event in events:
        if isinstance(event, Failed):
            raise GreenroomError.from_wire(event.error)
        texts[event.index].append(event.text)
        tokens[event.index] += event.logprobs or ()
        if event.finish_reason:
            finished[event.index] = event
    writers = logprobs.writers(gen, admitted, plan is not None, as_ids)
    choices = []
    for i in range(gen.choices):
        text, reason, stop = "".join(texts[i]), finished[i].finish_reason, finished[i].stop
        written = writers[i](tokens[i]) if writers else None
        if plan is not None:
            message, reason = structured.message(plan, text, reason)
            message = {**message, "refusal": None}  # OpenAI's, required: no refusal is kept apart from content
            choices.append({"index": i, "message": message, "logprobs": written, "finish_reason": reason})
        else:
            choices.append({"index": i, "text": text, "logprobs": written, "finish_reason": reason})
        choices[-1]["stop_reason"] = stop
    response = {
        "id": gen.rid,
        "object": "chat.completion" if plan is not None else "text_completion",
        "created": int(time.time()),
        "model": gen.model,
        "system_fingerprint": system_fingerprint,
        "choices": choices,
        "usage": _usage(admitted, sum(t.completion_tokens for t in finished.values())),
    }
    if extras is not None:
        response["x_needle"] = _x_needle(choices[0]["message"], finished[0], admitted, extras)
    if finished[0].sae_activations is not None:
        response["millm"] = sae_activations.millm(finished[0].sae_activations)
    return response


def _x_needle(message: dict, finished: Text, admitted: Admitted, extras: Extras) -> dict:
    block = needle.x_needle(
        message,
        finished.completion_tokens,
        finished.stats,
        admitted.prompt_tokens,
        extras.conversation,
        extras.warnings,
    )
    if block["reasoning"]:
        message["reasoning_content"] = block["reasoning"]
    return block


async def _chunks(
    gen: Generate,
    events,
    admitted: Admitted,
    plan: structured.Plan | None,
    include_usage: bool,
    extras: Extras | None = None,
    as_ids: bool = False,
) -> AsyncIterator[dict]:
    """The engine's events as chat (or text) completion chunks: the one streaming core every
    surface frames. A failure is raised (GreenroomError) once the text before it is out."""
    chat = plan is not None
    head = {
        "id": gen.rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": gen.model,
    }
    completion_tokens = 0
    unfinished = gen.choices
    read = None  # the finishing event's SAE activations
    shapers = {i: structured.StreamShaper(plan) for i in range(gen.choices)} if chat else {}
    writers = logprobs.writers(gen, admitted, chat, as_ids)
    unsent: dict[int, list] = {i: [] for i in writers}  # reported tokens: they ride on the choice's next chunk

    def chunk(index: int, delta: dict | str | None, finish: str | None = None, stop: str | None = None, **extra):
        written = None
        if unsent.get(index):
            written, unsent[index] = writers[index](unsent[index]), []
        if chat:
            choice = {"index": index, "delta": delta or {}, "logprobs": written, "finish_reason": finish}
        else:
            choice = {"index": index, "text": delta or "", "logprobs": written, "finish_reason": finish}
        if finish:
            choice["stop_reason"] = stop
        return {**head, "choices": [choice], **extra, **usage(bool(finish) and unfinished == 0)}

    def usage(last: bool) -> dict:
        """With include_usage, OpenAI's rule: usage null on every chunk but the usage-only one
        (clients that add chunks up count it once); without, the spec's: on the request's last
        finishing chunk."""
        if include_usage:
            return {"usage": None}
        return {"usage": _usage(admitted, completion_tokens)} if last else {}

    def text_chunks(index: int, text: str, final: bool = False):
        if not chat:
            return [chunk(index, text)] if text else []
        deltas = shapers[index].feed(text) + (shapers[index].finish() if final else [])
        return [chunk(index, d) for d in deltas]

    if chat:
        for i in range(gen.choices):
            yield chunk(i, {"role": "assistant", "content": ""})
    async for first in events:
        pending: dict[int, list[str]] = {}
        for event in [first, *events.ready()]:  # what queued up while we wrote goes out as one chunk per choice
            if isinstance(event, Failed):
                for index, text in pending.items():
                    for c in text_chunks(index, "".join(text)):
                        yield c
                raise GreenroomError.from_wire(event.error)
            pending.setdefault(event.index, []).append(event.text)
            if writers:
                unsent[event.index] += event.logprobs or ()
            if event.finish_reason:
                for c in text_chunks(event.index, "".join(pending.pop(event.index)), final=True):
                    yield c
                if chat and plan.constraint is not None:  # the document streamed, checked once complete
                    structured.check(plan, shapers[event.index].message()["content"] or "", event.finish_reason)
                completion_tokens += event.completion_tokens
                unfinished -= 1
                read = read or event.sae_activations
                reason = event.finish_reason
                if chat and shapers[event.index].called and reason == "stop":
                    reason = "tool_calls"
                extra = {}
                if extras is not None and event.index == 0:  # the finish-reason chunk carries x_needle
                    extra["x_needle"] = _x_needle(shapers[0].message(), event, admitted, extras)
                yield chunk(event.index, None, reason, event.stop, **extra)
        for index, text in pending.items():
            for c in text_chunks(index, "".join(text)):
                yield c
    if include_usage:  # OpenAI's usage-only chunk
        yield {**head, "choices": [], "usage": _usage(admitted, completion_tokens)}
    if read is not None:  # the spec: one last chunk with no choices, before [DONE]
        yield {**head, "choices": [], "millm": sae_activations.millm(read), **usage(False)}


async def pieces(chunks: AsyncIterator[dict]) -> AsyncIterator[tuple]:
    """A one-choice chat stream (`_chunks`) as what the surfaces translated onto it write, in
    order: ("text", delta), ("call", call id, name), ("arguments", fragment); then ("end",
    finish_reason, usage, millm, the stop string that ended it). A failure is raised as `_chunks`
    raises it."""
    reason = usage = millm = stop = None
    async for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("content"):
                yield "text", delta["content"]
            for call in delta.get("tool_calls") or ():
                if "id" in call:
                    yield "call", call["id"], call["function"]["name"]
                elif call["function"]["arguments"]:
                    yield "arguments", call["function"]["arguments"]
            reason = choice["finish_reason"] or reason
            stop = choice.get("stop_reason", stop)
        usage, millm = chunk.get("usage") or usage, chunk.get("millm", millm)
    yield "end", reason, usage, millm, stop


async def _sse(chunks: AsyncIterator[dict], _: Admitted) -> AsyncIterator[bytes]:
    """Chat and text completion chunks as OpenAI frames them: a failure is an `error` event,
    and [DONE] ends every stream."""
    try:
        async for chunk in chunks:
            yield framing.sse(chunk)
    except GreenroomError as exc:
        yield framing.sse_error(exc.openai_body())
    yield framing.SSE_DONE


async def _as_it_is(completion: dict) -> dict:
    return completion


_AS_CHAT = Shaped(_sse, _as_it_is)


def _usage(admitted: Admitted, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": admitted.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": admitted.prompt_tokens + completion_tokens,
    }
