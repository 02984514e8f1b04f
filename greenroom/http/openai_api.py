"""The OpenAI /v1 surface: chat and text completions (streamed and not), embeddings,
models. Every request goes through the field ledger before anything is loaded."""

from __future__ import annotations

import base64
import contextlib
import time

import attrs
from quart import Quart, Response, request

from greenroom.engines.capabilities import capabilities_of
from greenroom.errors import GreenroomError
from greenroom.http import ledger, openai_params, scoring, sse
from greenroom.http.openai_params import Streaming
from greenroom.protocol import Admitted, Embedded, Failed, Generate, Score, Text
from greenroom.supervisor.tree import Tree


@attrs.frozen
class Prepared:
    body: dict
    model: str
    ignored: list[str]
    strict: bool

    def headers(self, also_ignored: tuple[str, ...] = ()) -> dict[str, str]:
        """Refuse under strict mode, else the report of every field not read."""
        header = ledger.settle(self.ignored + [f for f in also_ignored if self.body.get(f) is not None], self.strict)
        return {"X-miLLM-Ignored-Fields": header} if header else {}


async def prepare(tree: Tree, table: dict, where: str) -> Prepared:
    """Parse, find the model's engine, and run the ledger: refusals happen here, before
    any engine is asked for anything."""
    strict = ledger.strict_mode(request.headers.get("X-miLLM-Strict"))
    body = openai_params.parse_json(await request.get_data())
    model = openai_params.model_name(body)
    _, placement = tree.placement(model)
    engine = placement["engine"]
    ignored = ledger.check(table, body, capabilities_of(engine), f"{where} with the {engine} engine")
    return Prepared(body, model, ignored, strict)


class StreamBody:
    """A streamed response body that always releases its request: quart calls
    `aclose` when the client goes away, even before the first chunk."""

    def __init__(self, chunks, stack: contextlib.AsyncExitStack):
        self._chunks = chunks
        self._stack = stack

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()
        finally:
            await self._stack.aclose()


def register(app: Quart, tree: Tree) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions():
        req = await prepare(tree, ledger.CHAT, "on chat completions")
        stream = openai_params.streaming(req.body)
        if scoring.is_chat_scoring(req.body):
            return await _score(tree, scoring.chat_score(req.body, req.model, stream.on), req, scoring.chat_response)
        return await _complete(tree, openai_params.chat_request(req.body, req.model, stream), stream, req, chat=True)

    @app.post("/v1/completions")
    async def completions():
        req = await prepare(tree, ledger.COMPLETIONS, "on text completions")
        stream = openai_params.streaming(req.body)
        if scoring.is_completion_scoring(req.body):
            score = scoring.completion_score(req.body, req.model, stream.on)
            return await _score(tree, score, req, scoring.completion_response)
        gen = openai_params.completion_request(req.body, req.model, stream)
        return await _complete(tree, gen, stream, req, chat=False)

    @app.post("/v1/embeddings")
    async def embeddings():
        req = await prepare(tree, ledger.EMBEDDINGS, "on embeddings")
        embed, fmt = openai_params.embedding_request(req.body, req.model)
        headers = req.headers()
        client, _ = await tree.client_for(req.model)
        async with client.submit(embed) as events:
            async for event in events:
                if isinstance(event, Failed):
                    raise GreenroomError.from_wire(event.error)
        assert isinstance(event, Embedded)
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v).decode() if fmt == "base64" else _floats(v)}
                for i, v in enumerate(event.vectors)]
        usage = {"prompt_tokens": event.prompt_tokens, "total_tokens": event.prompt_tokens}
        return {"object": "list", "data": data, "model": req.model, "usage": usage}, 200, headers

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [_model_card(m["id"]) for m in tree.models()]}

    @app.get("/v1/models/<path:model_id>")
    async def get_model(model_id: str):
        if any(m["id"] == model_id for m in tree.models()):
            return _model_card(model_id)
        raise GreenroomError("model_not_found", f"The model '{model_id}' does not exist", "model")


_CREATED = int(time.time())


def _model_card(model_id: str) -> dict:
    return {"id": model_id, "object": "model", "created": _CREATED, "owned_by": "greenroom"}


def _floats(raw: bytes) -> list[float]:
    import array

    return array.array("f", raw).tolist()


def fingerprint(info: dict) -> str:
    """millm:<model>@<revision>:<dtype>/<quantization>:<engine>; unknown parts 'unrecorded'."""
    def part(key: str) -> str:
        return info.get(key) or "unrecorded"

    return f"millm:{info['id']}@{part('revision')}:{part('dtype')}/{part('quantization')}:{part('engine')}"


def _seed_header(body: dict, scope: str = "request") -> dict[str, str]:
    """X-miLLM-Seed echoes a sent seed with the scope of its promise; absent without one."""
    seed = body.get("seed")
    return {"X-miLLM-Seed": f'{seed};scope="{scope}"'} if seed is not None else {}


async def _score(tree: Tree, score: Score, req: Prepared, shape) -> tuple:
    headers = {**req.headers(scoring.NOT_APPLICABLE), **_seed_header(
        req.body, "batch-shape" if req.body.get("extra_messages") else "request")}
    openai_params.sampling(req.body)  # the seed and the rest are still validated
    client, info = await tree.client_for(score.model)
    async with client.submit(score) as events:
        async for event in events:
            if isinstance(event, Failed):
                raise GreenroomError.from_wire(event.error)
    return shape(score, event, req.body, fingerprint(info)), 200, headers


async def _complete(tree: Tree, gen: Generate, stream: Streaming, req: Prepared, chat: bool):
    headers = {**req.headers(scoring.SCORING_ONLY), **_seed_header(
        req.body, "batch-shape" if gen.conversations and len(gen.conversations) > 1 else "request")}
    client, info = await tree.client_for(gen.model)
    stack = contextlib.AsyncExitStack()
    try:
        events = await stack.enter_async_context(client.submit(gen))
        first = await events.__anext__()  # Admitted or Failed: refusals come before any byte is sent
        if isinstance(first, Failed):
            raise GreenroomError.from_wire(first.error)
        if stream.on:
            body = StreamBody(_stream_chunks(gen, events, first, chat, stream.include_usage), stack)
            response = Response(body, content_type="text/event-stream", headers=headers)
            response.headers["Cache-Control"] = "no-cache"
            response.timeout = None
            return response
        async with stack:
            return await _collect(gen, events, first, chat, fingerprint(info)), 200, headers
    except BaseException:
        await stack.aclose()
        raise


async def _collect(gen: Generate, events, admitted: Admitted, chat: bool, system_fingerprint: str) -> dict:
    texts: dict[int, list[str]] = {i: [] for i in range(gen.choices)}
    finished: dict[int, Text] = {}
    async for event in events:
        if isinstance(event, Failed):
            raise GreenroomError.from_wire(event.error)
        texts[event.index].append(event.text)
        if event.finish_reason:
            finished[event.index] = event
    choices = []
    for i in range(gen.choices):
        text, reason = "".join(texts[i]), finished[i].finish_reason
        choices.append({"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None,
                        "finish_reason": reason} if chat else
                       {"index": i, "text": text, "logprobs": None, "finish_reason": reason})
    return {
        "id": gen.rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
        "model": gen.model, "system_fingerprint": system_fingerprint, "choices": choices,
        "usage": _usage(admitted, sum(t.completion_tokens for t in finished.values())),
    }


async def _stream_chunks(gen: Generate, events, admitted: Admitted, chat: bool, include_usage: bool):
    head = {"id": gen.rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": gen.model}
    completion_tokens = 0
    unfinished = gen.choices

    def chunk(index: int, text: str | None, finish: str | None, role: bool = False) -> bytes:
        if chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
        body = {**head, "choices": [choice]}
        if finish and unfinished == 0:  # the request's last chunk carries its usage
            body["usage"] = _usage(admitted, completion_tokens)
        return sse.frame(body)

    if chat:
        yield chunk(0, None, None, role=True)
    async for first in events:
        pending: dict[int, list[str]] = {}
        for event in [first, *events.ready()]:  # what queued up while we wrote goes out as one chunk per choice
            if isinstance(event, Failed):
                for index, text in pending.items():
                    yield chunk(index, "".join(text), None)
                yield sse.error_frame(GreenroomError.from_wire(event.error).openai_body())
                yield sse.DONE
                return
            pending.setdefault(event.index, []).append(event.text)
            if event.finish_reason:
                text = "".join(pending.pop(event.index))
                if text:
                    yield chunk(event.index, text, None)
                completion_tokens += event.completion_tokens
                unfinished -= 1
                yield chunk(event.index, None, event.finish_reason)
        for index, text in pending.items():
            if any(text):
                yield chunk(index, "".join(text), None)
    if include_usage:  # OpenAI's usage-only chunk
        yield sse.frame({**head, "choices": [], "usage": _usage(admitted, completion_tokens)})
    yield sse.DONE


def _usage(admitted: Admitted, completion_tokens: int) -> dict:
    return {"prompt_tokens": admitted.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": admitted.prompt_tokens + completion_tokens}
