"""The OpenAI /v1 surface: chat and text completions (streamed and not), models."""

from __future__ import annotations

import contextlib
import time

from quart import Quart, Response, request

from greenroom.errors import GreenroomError
from greenroom.http import openai_params, sse
from greenroom.protocol import Admitted, Failed, Generate, Text
from greenroom.supervisor.tree import Tree


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
        gen, stream = openai_params.chat_request(openai_params.parse_json(await request.get_data()))
        return await _complete(tree, gen, stream, chat=True)

    @app.post("/v1/completions")
    async def completions():
        gen, stream = openai_params.completion_request(openai_params.parse_json(await request.get_data()))
        return await _complete(tree, gen, stream, chat=False)

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [_model_card(m) for m in tree.models()]}

    @app.get("/v1/models/<path:model_id>")
    async def get_model(model_id: str):
        for m in tree.models():
            if m["id"] == model_id:
                return _model_card(m)
        raise GreenroomError("model_not_found", f"The model '{model_id}' does not exist", "model")


_CREATED = int(time.time())


def _model_card(m: dict) -> dict:
    return {"id": m["id"], "object": "model", "created": _CREATED, "owned_by": "greenroom"}


async def _complete(tree: Tree, gen: Generate, stream: bool, chat: bool):
    client = await tree.client_for(gen.model)
    stack = contextlib.AsyncExitStack()
    try:
        events = await stack.enter_async_context(client.submit(gen))
        first = await events.__anext__()  # Admitted or Failed: refusals come before any byte is sent
        if isinstance(first, Failed):
            raise GreenroomError.from_wire(first.error)
        if stream:
            body = StreamBody(_stream_chunks(gen, events, first, chat), stack)
            response = Response(body, content_type="text/event-stream")
            response.headers["Cache-Control"] = "no-cache"
            response.timeout = None
            return response
        async with stack:
            return await _collect(gen, events, first, chat)
    except BaseException:
        await stack.aclose()
        raise


async def _collect(gen: Generate, events, admitted: Admitted, chat: bool) -> dict:
    parts: list[str] = []
    last: Text | None = None
    async for event in events:
        if isinstance(event, Failed):
            raise GreenroomError.from_wire(event.error)
        parts.append(event.text)
        last = event
    text = "".join(parts)
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
               "finish_reason": last.finish_reason} if chat else
              {"index": 0, "text": text, "logprobs": None, "finish_reason": last.finish_reason})
    return {
        "id": gen.rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
        "model": gen.model, "choices": [choice], "usage": _usage(admitted, last.completion_tokens),
    }


async def _stream_chunks(gen: Generate, events, admitted: Admitted, chat: bool):
    created = int(time.time())
    head = {"id": gen.rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created, "model": gen.model}

    def chunk(text: str | None, finish: str | None, role: bool = False) -> dict:
        if chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice]}

    if chat:
        yield sse.frame(chunk(None, None, role=True))
    async for event in events:
        text = []
        for event in [event, *events.ready()]:  # what queued up while we wrote goes out as one chunk
            if isinstance(event, Failed):
                if text:
                    yield sse.frame(chunk("".join(text), None))
                yield sse.error_frame(GreenroomError.from_wire(event.error).openai_body())
                break
            text.append(event.text)
            if event.finish_reason:
                if any(text):
                    yield sse.frame(chunk("".join(text), None))
                yield sse.frame({**chunk(None, event.finish_reason),
                                 "usage": _usage(admitted, event.completion_tokens)})
                text = []
        if any(text):
            yield sse.frame(chunk("".join(text), None))
    yield sse.DONE


def _usage(admitted: Admitted, completion_tokens: int) -> dict:
    return {"prompt_tokens": admitted.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": admitted.prompt_tokens + completion_tokens}
