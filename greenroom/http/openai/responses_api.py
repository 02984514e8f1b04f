"""OpenAI's Responses API (/v1/responses), translated into the surface-neutral chat request.

A request becomes the ChatRequest it means (pipeline/request.py; `translate`, a pure function) — `instructions` a system message, `input` (a
string, or items: messages with text parts, function_call and function_call_output) the
conversation after the stored one `previous_response_id` names, function tools and
`tool_choice` chat's, `text.format` a response_format, `max_output_tokens` max_tokens — and runs
the one generation path (pipeline/generation.py: the same ledger, plan, steering and seeds). Its
answer, the one typed event stream (pipeline/events.py) or its fold, is written as the Response object or as
the events the SDKs read by openai/responses_format.py. With `store` (the default, as OpenAI's) the response, its
conversation and its input items are kept (store/responses.py) for GET, DELETE,
previous_response_id and GET …/input_items (OpenAI's list, paginated); a store that cannot be
written loses no answer: it is answered with `store: false` (and, whole, X-Greenroom-Not-Stored
saying why), and its id is then unknown to GET and previous_response_id.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import attrs
import trio
from quart import Quart, after_this_request, request

from greenroom.errors import GreenroomError
from greenroom.http.core import contracts, ledger, routes
from greenroom.http.core.contracts import AnyOf, Anything, Boolean, Choice, ListOf, MapOf, Named, Number, Shape, Text
from greenroom.http.core.headers import NOT_STORED_HEADER, STRICT_HEADER
from greenroom.http.core.schema_subset import SCHEMA
from greenroom.http.openai import openai_params, responses_format
from greenroom.http.pipeline import generation, paths, structured
from greenroom.http.pipeline.events import Completion, Event
from greenroom.http.pipeline.paths import FieldPaths
from greenroom.http.pipeline.request import ChatRequest
from greenroom.http.pipeline.structured import Output
from greenroom.protocol import Admitted
from greenroom.store.responses import ResponseStore
from greenroom.supervisor.tree import Tree

# --- the request (contracts.py) ---------------------------------------------------------------

RESPONSE_ID = Text(min_length=1, description="A stored response's id (resp_…)")

_ITEM_META = {"id": Anything(description="Not read (an output item sent back)"), "status": Anything()}
TEXT_PART = Named(
    name="ResponseTextPart",
    field=Shape(
        fields={
            "type": Choice(values=("input_text", "output_text")),
            "text": Text(),
            "annotations": Anything(description="Not read (an output_text sent back)"),
            "logprobs": Anything(description="Not read (an output_text sent back)"),
        },
        required=("type", "text"),
    ),
)
_ROLES = ("user", "assistant", "system", "developer")
MESSAGE_ITEM = Shape(
    fields={
        "type": Choice(values=("message",)),
        "role": Choice(values=_ROLES),
        "content": AnyOf(options=(Text(), ListOf(items=TEXT_PART))),
        **_ITEM_META,
    },
    required=("role", "content"),
    description="A message; its text parts are joined",
)
CALL_ITEM = Shape(
    fields={
        "type": Choice(values=("function_call",)),
        "call_id": Text(),
        "name": Text(),
        "arguments": Text(description="JSON text"),
        **_ITEM_META,
    },
    required=("type", "call_id", "name", "arguments"),
    description="An earlier call of the model's: the assistant turn before it calls it",
)
CALL_OUTPUT_ITEM = Shape(
    fields={
        "type": Choice(values=("function_call_output",)),
        "call_id": Text(description="The earlier function_call it answers (refused if none has this call_id)"),
        "output": AnyOf(options=(Text(), ListOf(items=TEXT_PART))),
        **_ITEM_META,
    },
    required=("type", "call_id", "output"),
    description="A call's result: a tool message",
)
INPUT_ITEM = Named(name="ResponseInputItem", field=AnyOf(options=(MESSAGE_ITEM, CALL_ITEM, CALL_OUTPUT_ITEM)))
_FUNCTION = structured.FUNCTION.field.fields
FUNCTION_TOOL = structured.flat_tool(
    "ResponseFunctionTool",
    "function",
    {
        "description": _FUNCTION["description"],
        "parameters": _FUNCTION["parameters"],
        "strict": Boolean(description="Accepted; calls are validated against the parameters either way"),
    },
    required=("type", "name"),
    extra=contracts.DATA,
    description="Function tools only: greenroom runs no tools of its own (built-in tools are refused)",
)
_FORMAT = Named(
    name="ResponseTextFormat",
    field=AnyOf(
        options=(
            *structured.RESPONSE_FORMAT.field.options[:2],  # text, json_object
            Shape(
                fields={
                    "type": Choice(values=("json_schema",)),
                    "name": structured.NAME,
                    "schema": attrs.evolve(SCHEMA, null=False),
                    "strict": Boolean(description="Accepted; the schema is enforced by decoding either way"),
                    "description": Anything(),
                },
                required=("type", "name"),
            ),
        ),
        description="response_format's rules (docs/openai.md#structured-output): json_object or json_schema "
        "(greenroom's subset) is decoded under the schema and validated once complete (streamed too); not with "
        "tools unless tool_choice is none",
    ),
)


_NO_TOOLS = {"properties": {"tools": {"anyOf": [{"type": "null"}, {"maxItems": 0}]}}}
_FORCED = contracts.at({"not": {"enum": ["none", "auto", None]}}, "tool_choice")
REQUEST = contracts.merge(
    Shape(
        fields={
            "model": openai_params.MODEL,
            "input": AnyOf(
                options=(Text(), ListOf(items=INPUT_ITEM, min_items=1)),
                description="A user message, or the conversation's items (after previous_response_id's)",
            ),
            "instructions": Text(description="A system message first (not carried over to a continuation)"),
            "max_output_tokens": openai_params.CHAT_MAX_TOKENS,
            "temperature": openai_params.TEMPERATURE,
            "top_p": openai_params.TOP_P,
            "stream": Boolean(default=False),
            "store": Boolean(default=True, description="Keep the response for GET and previous_response_id"),
            "previous_response_id": Text(min_length=1, description="A stored response: its conversation continues"),
            "metadata": MapOf(values=Text(max_length=512), keys=Text(max_length=64), description="Stored, echoed"),
            "text": Shape(
                fields={"format": _FORMAT}, rule=contracts.needs("response_format", {}, {"format": {"type": "text"}})
            ),
            "tools": ListOf(items=FUNCTION_TOOL, rule=contracts.needs("tools", [])),
            "tool_choice": AnyOf(
                options=(
                    Choice(values=("none", "auto", "required")),
                    Shape(
                        fields={"type": Choice(values=("function",)), "name": Text()},
                        required=("type", "name"),
                    ),
                ),
                description="As chat's: required or a named function is enforced by decoding",
                rule=contracts.needs("tools"),
            ),
            "parallel_tool_calls": Boolean(
                description="false: at most one call when tool_choice forces calls", rule=contracts.needs("tools")
            ),
            **dict.fromkeys(
                ("user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "service_tier"),
                contracts.reported(),
            ),
            "stream_options": contracts.reported(),  # include_obfuscation: no obfuscation is sent
            "reasoning": contracts.refused({}, why="this model does not reason"),
            "background": contracts.refused(
                False, why="a response is answered within its request: there is no background queue"
            ),
            "truncation": contracts.refused(
                "disabled", why="a prompt past the context window is refused (context_length_exceeded), never cut"
            ),
            "include": contracts.refused(
                [], why="no reasoning, search results or log-probabilities are produced to include"
            ),
            "top_logprobs": contracts.refused(0, why=openai_params.NOT_YET),
            "max_tool_calls": contracts.refused(why=openai_params.NOT_YET),
            "conversation": contracts.refused(why="continue a stored response with previous_response_id"),
            "prompt": contracts.refused(why="stored prompt templates are not served"),
            "context_management": contracts.refused(why=openai_params.NOT_YET),
        },
        required=("model", "input"),
    ),
    generation.MILLM,
    rules=(
        contracts.when(
            contracts.at({"enum": ["json_object", "json_schema"]}, "text", "format", "type"),
            {"anyOf": [_NO_TOOLS, contracts.at({"const": "none"}, "tool_choice")]},
            "text.format json cannot be combined with tools unless tool_choice is none",
        ),
        contracts.when(_FORCED, {"not": _NO_TOOLS}, "tool_choice required or a named function needs tools"),
        contracts.when(
            _FORCED,
            {"properties": {"tools": {"items": {"properties": {"parameters": SCHEMA}}}}},
            "calls enforced by decoding: the functions' parameters in greenroom's subset",
        ),
    ),
    ledger=True,
)

# where the chat request's fields come from, whatever the request holds
_PATHS = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "response_format.json_schema": "text.format",
    "tool_choice.function": "tool_choice",
}


# OpenAI's includables: none names anything greenroom's items hold (images, search results,
# reasoning), so each is accepted and changes nothing
INCLUDABLE = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
)
INPUT_ITEMS_QUERY = Shape(
    fields={
        "after": Text(description="An item id: the page starts after it (in `order`)"),
        "limit": Number(lo=1, hi=100, integer=True, default=20),
        "order": Choice(values=("asc", "desc"), default="desc", description="asc: the input's own order"),
        "include": ListOf(
            items=Choice(values=INCLUDABLE),
            description="OpenAI's includables (also as include[]): accepted; greenroom's items hold none of them",
        ),
    }
)


def _text(content, where: str, unread: list[str]) -> str:
    return openai_params.text_of(content, where, ("input_text", "output_text"), TEXT_PART.field.names, unread)


_ITEMS = {"message": MESSAGE_ITEM, "function_call": CALL_ITEM, "function_call_output": CALL_OUTPUT_ITEM}


def _item(item, i: int, messages: list[dict], earlier: list[dict], unread: list[str], offset: int) -> dict[str, str]:
    """One input item appended to the chat messages (a call to the assistant turn before it; a
    result paired with its call, among `earlier` (the stored conversation) and `messages`); returns
    the chat locations it made → its own (`offset`: the chat index of messages[0])."""
    where = f"input[{i}]"

    def last() -> str:
        return f"messages[{offset + len(messages) - 1}]"

    if not isinstance(item, dict):
        raise GreenroomError("invalid_parameter", f"'{where}' must be an object", where)
    kind = "message" if item.get("type") is None else item["type"]
    if kind not in _ITEMS:
        raise GreenroomError(
            "invalid_parameter",
            f"'{where}.type' {kind!r} is not served: message, function_call and function_call_output are",
            f"{where}.type",
        )
    for key in _ITEMS[kind].required:
        if item.get(key) is None:
            raise GreenroomError("missing_parameter", f"'{where}.{key}' is required", f"{where}.{key}")
    unread += [f"{where}.{k}" for k in item if k not in _ITEMS[kind].names]
    if kind == "message":
        if item["role"] not in _ROLES:
            raise GreenroomError(
                "invalid_parameter", f"'{where}.role' must be one of {', '.join(_ROLES)}", f"{where}.role"
            )
        messages.append({"role": item["role"], "content": _text(item["content"], f"{where}.content", unread)})
        return {last(): where}
    if kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item[key], str):
                raise GreenroomError("invalid_parameter", f"'{where}.{key}' must be a string", f"{where}.{key}")
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        if messages and messages[-1]["role"] == "assistant":
            messages[-1].setdefault("tool_calls", []).append(call)
            made = {}
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            made = {last(): where}
        at = f"{last()}.tool_calls[{len(messages[-1]['tool_calls']) - 1}]"
        return made | {at: where, f"{at}.id": f"{where}.call_id", f"{at}.function": where}
    call = openai_params.answered(item["call_id"], earlier + messages, f"{where}.call_id")
    messages.append({"role": "tool", "content": _text(item["output"], f"{where}.output", unread), "tool_call_id": call})
    at = last()
    return {at: where, f"{at}.content": f"{where}.output", f"{at}.tool_call_id": f"{where}.call_id"}


_FUNCTION_FIELDS = {k: k for k in ("name", "description", "parameters")}


def _tool_choice(choice):
    """Responses' {"type": "function", "name"} is chat's {"type": "function", "function": {"name"}}."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    raise GreenroomError(
        "invalid_parameter",
        '\'tool_choice\' must be none, auto, required or {"type": "function", "name": ...} (built-in tools are not served)',
        "tool_choice",
    )


def _response_format(body: dict, unread: list[str]):
    text = openai_params.mapping(body, "text")
    if text is None:
        return None
    unread += [f"text.{k}" for k in text if k != "format"]
    fmt = text.get("format")
    unread += structured.unread_in_format(fmt, "text.format", _FORMAT.field.options)
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt  # text, json_object, or what the plan refuses by name
    return {
        "type": "json_schema",
        "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt},
    }


def translate(body: dict, history: list[dict]) -> tuple[ChatRequest, list[dict], list[str], FieldPaths]:
    """The chat request `body` means after the stored conversation `history`, the messages of
    its own input (what a stored response keeps), the nested keys not read, and where each of the
    request's locations came from (its refusals, here and later, are named by it)."""
    unread: list[str] = []
    source = body.get("input")
    if source is None:
        raise GreenroomError("missing_parameter", "'input' is a required property", "input")
    # the conversation: instructions (a system message), the stored turns, then the input
    shift = int(body.get("instructions") is not None)
    names = {**_PATHS, **(paths.message(0, "instructions") if shift else {})}
    for k in range(len(history)):
        names |= paths.message(shift + k, "previous_response_id")
    if isinstance(source, str):
        messages = [{"role": "user", "content": source}]
        names |= paths.message(shift + len(history), "input")
    elif isinstance(source, list) and source:
        messages = []
        for i, item in enumerate(source):
            names |= _item(item, i, messages, history, unread, shift + len(history))
    else:
        raise GreenroomError("invalid_parameter", "'input' must be a string or a non-empty array of items", "input")
    instructions = openai_params.string(body, "instructions")
    metadata = body.get("metadata")
    field = REQUEST.fields["metadata"]
    if metadata is not None and not (
        isinstance(metadata, dict)
        and all(field.keys.matches(k) and field.values.matches(v) for k, v in metadata.items())
    ):
        raise GreenroomError(
            "invalid_parameter",
            "'metadata' must map keys of at most 64 characters to strings of at most 512",
            "metadata",
        )
    system = [{"role": "system", "content": instructions}] if instructions is not None else []
    max_tokens = openai_params.integer(body, "max_output_tokens", openai_params.CHAT_MAX_TOKENS)
    tools = structured.translated_tools(
        body, ("function",), _FUNCTION_FIELDS, ("name",), FUNCTION_TOOL.field.names, unread
    )
    output = Output(
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice")),
        parallel_tool_calls=body.get("parallel_tool_calls"),
        response_format=_response_format(body, unread),
    )
    field_paths = FieldPaths(names | paths.tools(len(tools or ()), _FUNCTION_FIELDS))
    shared = {k: body.get(k) for k in ("temperature", "top_p", "stream", *generation.MILLM.names)}
    with field_paths.renaming():
        request = openai_params.translated(
            body["model"], system + history + messages, output, {**shared, "max_tokens": max_tokens}
        )
    return request, messages, unread, field_paths


_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def input_items(body: dict) -> list[dict]:
    """A request's input (translate() checked it) as OpenAI lists it: each item with an id (the
    one sent, else a new one) and status completed; a message's text as input_text parts, an
    assistant's as output_text."""
    source = body["input"]
    return [_listed(item) for item in ([{"role": "user", "content": source}] if isinstance(source, str) else source)]


def _listed(item: dict) -> dict:
    kind = item.get("type") or "message"
    sent_id = item.get("id")
    out = {
        "id": sent_id if isinstance(sent_id, str) and sent_id else responses_format.item_id(_ID_PREFIXES[kind]),
        "type": kind,
        "status": "completed",
    }
    if kind == "function_call":
        return {**out, **{k: item[k] for k in ("call_id", "name", "arguments")}}
    content = item["content" if kind == "message" else "output"]
    texts = [content] if isinstance(content, str) else [part["text"] for part in content]
    if kind == "function_call_output":
        output = content if isinstance(content, str) else [{"type": "input_text", "text": t} for t in texts]
        return {**out, "call_id": item["call_id"], "output": output}
    if item["role"] == "assistant":
        parts = [{"type": "output_text", "text": t, "annotations": [], "logprobs": []} for t in texts]
    else:
        parts = [{"type": "input_text", "text": t} for t in texts]
    return {**out, "role": item["role"], "content": parts}


def _query(args) -> tuple[str, int, str | None]:
    """The order, limit and `after` of an input-items query, checked (include too)."""
    for value in args.getlist("include") + args.getlist("include[]"):  # the SDK sends include[]
        if value not in INCLUDABLE:
            raise GreenroomError(
                "invalid_parameter", f"'include' {value!r} is not one of {', '.join(INCLUDABLE)}", "include"
            )
    order = args.get("order", INPUT_ITEMS_QUERY.fields["order"].default)
    if order not in INPUT_ITEMS_QUERY.fields["order"].values:
        raise GreenroomError("invalid_parameter", "'order' must be asc or desc", "order")
    field = INPUT_ITEMS_QUERY.fields["limit"]
    limit = args.get("limit", str(field.default))
    if not (limit.isascii() and limit.isdigit() and field.within(int(limit))):
        raise GreenroomError("invalid_parameter", f"'limit' must be an integer from {field.lo} to {field.hi}", "limit")
    return order, int(limit), args.get("after")


def _page(items: list[dict], order: str, limit: int, after: str | None) -> dict:
    """OpenAI's list of `items` (in the input's order): `limit` of them in `order`, after the
    item `after` names."""
    items = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise GreenroomError(
                "invalid_parameter", f"'after' {after!r} is not an item of this response's input", "after"
            )
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,  # OpenAI's schema has no empty page to name
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > len(page),
    }


# --- the answer ---------------------------------------------------------------------------------


class _Answer:
    """One request's Response (responses_format writes it), stored once done."""

    def __init__(self, store: ResponseStore, body: dict, model: str, conversation: list[dict]):
        keep = openai_params.boolean(body, "store", True)
        self.ctx = responses_format.Context(responses_format.item_id("resp"), int(time.time()), model, body, keep)
        self.store = store
        self.conversation = conversation  # what a continuation starts from, less this answer
        self.input_items = input_items(body)
        self.not_stored: GreenroomError | None = None  # why a response asked to be stored was not

    async def kept(self, response: dict) -> dict:
        """The finished Response, stored unless store: false (said false where it could not be)."""
        if self.ctx.store:
            output = response["output"]
            text = "".join(p["text"] for item in output if item["type"] == "message" for p in item["content"])
            calls = [
                {"id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in output
                if c["type"] == "function_call"
            ]
            turn = {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}
            try:
                await trio.to_thread.run_sync(self.store.put, response, self.conversation + [turn], self.input_items)
            except GreenroomError as exc:  # storage_unavailable: the answer stands, said unstored
                response["store"] = False
                self.not_stored = exc
        return response

    async def whole(self, completion: Completion, _: Admitted) -> dict:
        response = await self.kept(responses_format.whole(completion, self.ctx))
        if self.not_stored is not None:
            reason = f"{self.not_stored.code}: {self.not_stored.message}".encode("ascii", "backslashreplace").decode()

            @after_this_request
            async def say_not_stored(answered):
                answered.headers[NOT_STORED_HEADER] = reason
                return answered

        return response

    def stream(self, events: AsyncIterator[Event], _: Admitted) -> AsyncIterator[bytes]:
        return responses_format.stream(events, self.ctx, self.kept)


def register(app: Quart, tree: Tree) -> None:
    store = ResponseStore(tree.config.cache_dir)

    async def stored(response_id: str, param: str | None = None):
        found = await trio.to_thread.run_sync(store.get, response_id)
        if found is None:
            raise GreenroomError("response_not_found", f"No response with id {response_id!r} is stored", param)
        return found

    @routes.view(app, "POST", "/v1/responses")
    async def create_response():
        req = await generation.prepare(tree, REQUEST, "on responses", translated=True, generates="chat")
        previous = openai_params.string(req.body, "previous_response_id")
        history = (await stored(previous, "previous_response_id")).conversation if previous is not None else []
        asked, messages, unread, field_paths = translate(req.body, history)
        answer = _Answer(store, req.body, req.model, history + messages)
        with field_paths.renaming():
            return await generation.chat(tree, req.asking(asked, unread, field_paths), lambda *_: answer)

    @routes.view(app, "GET", "/v1/responses/{response_id}")
    async def get_response(response_id: str):
        return (await stored(response_id)).response

    @routes.view(app, "GET", "/v1/responses/{response_id}/input_items")
    async def list_input_items(response_id: str):
        args = request.args
        strict = ledger.strict_mode(request.headers.get(STRICT_HEADER))
        headers = ledger.report_headers([k for k in args if k not in INPUT_ITEMS_QUERY.names | {"include[]"}], strict)
        query = _query(args)
        items = (await stored(response_id)).input_items
        if items is None:
            raise GreenroomError(
                "response_not_found",
                f"Response {response_id!r} was stored before greenroom kept input items: it has none to list",
            )
        return _page(items, *query), 200, headers

    @routes.view(app, "DELETE", "/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        if not await trio.to_thread.run_sync(store.delete, response_id):
            raise GreenroomError("response_not_found", f"No response with id {response_id!r} is stored")
        return {"id": response_id, "object": "response", "deleted": True}
