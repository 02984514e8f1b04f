"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens), translated into the
surface-neutral chat request (pipeline/request.py) — what coding agents speak through ANTHROPIC_BASE_URL.

A request becomes the ChatRequest it means (`translate`, a pure function) — `system` (a string or text blocks) a system
message, each message's text blocks its content, an assistant's tool_use blocks its tool calls,
a user's tool_result blocks tool messages (paired with their calls by tool_use_id), tools (name, description, input_schema) chat's
function tools, tool_choice auto / any / tool / none chat's auto / required / named / none
(disable_parallel_tool_use: parallel_tool_calls false), stop_sequences stop,
output_config.format a json_schema response_format — and runs the one generation path
(pipeline/generation.py). Its answer, the one typed event stream (pipeline/events.py) or its fold, is written as
Anthropic's Message or its events by anthropic/messages_format.py. Errors use Anthropic's
envelope and statuses (errors.anthropic_body; app.py).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import attrs
from quart import Quart

from greenroom.errors import GreenroomError
from greenroom.http.anthropic import messages_format
from greenroom.http.core import contracts, ledger, routes
from greenroom.http.core.contracts import AnyOf, Boolean, Choice, Field, ListOf, Named, Shape, Text
from greenroom.http.core.schema_subset import SCHEMA
from greenroom.http.openai import openai_params, tokenize_api
from greenroom.http.pipeline import generation, paths, structured
from greenroom.http.pipeline.events import Completion, Event
from greenroom.http.pipeline.paths import FieldPaths
from greenroom.http.pipeline.request import ChatRequest
from greenroom.http.pipeline.structured import Output
from greenroom.protocol import Admitted, Tokenize
from greenroom.supervisor.tree import Tree

# --- the request (contracts.py) ---------------------------------------------------------------

_CACHE = {"cache_control": contracts.reported(description="Not read (no prompt cache): reported")}
TEXT_BLOCK = Shape(
    fields={"type": Choice(values=("text",)), "text": Text(), **_CACHE},
    required=("type", "text"),
)
TOOL_USE_BLOCK = Shape(
    fields={
        "type": Choice(values=("tool_use",)),
        "id": Text(),
        "name": Text(),
        "input": Shape(fields={}, extra=contracts.DATA, null=False),
        **_CACHE,
    },
    required=("type", "id", "name", "input"),
    description="An assistant's earlier call",
)
TEXT = AnyOf(options=(Text(), ListOf(items=Named(name="AnthropicTextBlock", field=TEXT_BLOCK))))
TOOL_RESULT_BLOCK = Shape(
    fields={
        "type": Choice(values=("tool_result",)),
        "tool_use_id": Text(description="The earlier tool_use block it answers (refused if none has this id)"),
        "content": TEXT,
        "is_error": contracts.reported(description="Not read: reported"),
        **_CACHE,
    },
    required=("type", "tool_use_id"),
    description="A call's result (a user's): a tool message",
)
MESSAGE = Named(
    name="AnthropicMessage",
    field=AnyOf(
        options=tuple(
            Shape(
                fields={
                    "role": Choice(values=(role,)),
                    "content": AnyOf(options=(Text(), ListOf(items=AnyOf(options=(TEXT_BLOCK, calls))))),
                },
                required=("role", "content"),
            )
            for role, calls in (("user", TOOL_RESULT_BLOCK), ("assistant", TOOL_USE_BLOCK))
        ),
        description="A user's text and tool_result blocks, or an assistant's text and tool_use blocks (text joined)",
    ),
)
TOOL = structured.flat_tool(
    "AnthropicTool",
    "custom",
    {
        "description": Text(),
        "input_schema": attrs.evolve(
            structured.FUNCTION.field.fields["parameters"],
            description="A JSON schema (calls are validated against it); with tool_choice any or tool, in "
            "greenroom's subset (JSONSchema: it is compiled into the grammar)",
        ),
        **_CACHE,
    },
    required=("name", "input_schema"),
    description="Client tools only: greenroom runs no tools of its own (server tools are refused)",
)
TOOL_CHOICE = AnyOf(
    options=(
        Shape(
            fields={"type": Choice(values=("auto", "any", "none")), "disable_parallel_tool_use": Boolean()},
            required=("type",),
        ),
        Shape(
            fields={"type": Choice(values=("tool",)), "name": Text(), "disable_parallel_tool_use": Boolean()},
            required=("type", "name"),
        ),
    ),
    description="auto (the default with tools), any (a call is enforced by decoding), tool (that one), none",
)


def _output_config(schema: Field, description: str) -> Shape:
    return Shape(
        rule=contracts.needs("response_format", {}),
        fields={
            "format": Shape(
                fields={"type": Choice(values=("json_schema",)), "schema": schema},
                required=("type", "schema"),
                description=description,
            ),
            "effort": Choice(values=(None,), description="Refused unless null: this model does not think"),
        },
    )


_FORMAT = _output_config(
    SCHEMA,
    "The answer decoded under the schema (greenroom's subset) and validated once complete (streamed too): "
    "not with stop_sequences, not with tools unless tool_choice is none",
)
_NO_SERVER_TOOLS = "greenroom runs no tools of its own: send function tools"
_COMMON = Shape(
    fields={
        "model": openai_params.MODEL,
        "messages": ListOf(items=MESSAGE, min_items=1),
        "system": attrs.evolve(TEXT, description="A system message first; text blocks joined"),
        "tools": ListOf(items=TOOL, rule=contracts.needs("tools", [])),
        "tool_choice": attrs.evolve(TOOL_CHOICE, rule=contracts.needs("tools")),
        "output_config": _FORMAT,
        "thinking": contracts.refused({"type": "disabled"}, why="this model does not think"),
        "mcp_servers": contracts.refused([], why=_NO_SERVER_TOOLS),
        "container": contracts.refused(why=_NO_SERVER_TOOLS),
        "context_management": contracts.refused(why=openai_params.NOT_YET),
    },
    required=("model", "messages"),
)
# a token count enforces nothing: no schema it carries is checked
_COUNTED = attrs.evolve(
    _COMMON,
    fields={
        **_COMMON.fields,
        "output_config": _output_config(
            attrs.evolve(structured.FUNCTION.field.fields["parameters"], description="A JSON schema"),
            "Counted, not enforced: its schema is not checked",
        ),
    },
)


_NO_TOOLS = {"properties": {"tools": {"anyOf": [{"type": "null"}, {"maxItems": 0}]}}}
_FORCED = contracts.at({"enum": ["any", "tool"]}, "tool_choice", "type")
_FORMATTED = contracts.at({"type": "object"}, "output_config", "format")
_UNTOOLED = {"anyOf": [_NO_TOOLS, contracts.at({"const": "none"}, "tool_choice", "type")]}
_RULES = (contracts.when(_FORCED, {"not": _NO_TOOLS}, "tool_choice any or tool needs tools"),)
# a generation's only: a token count enforces nothing
_ENFORCED = (
    contracts.when(
        _FORCED,
        {"properties": {"tools": {"items": {"properties": {"input_schema": SCHEMA}}}}},
        "calls enforced by decoding: the tools' input_schema in greenroom's subset",
    ),
    contracts.when(
        _FORMATTED, _UNTOOLED, "output_config.format cannot be combined with tools unless tool_choice is none"
    ),
)
COUNT_REQUEST = contracts.merge(_COUNTED, rules=_RULES, ledger=True)
REQUEST = contracts.merge(
    _COMMON,
    Shape(
        fields={
            "max_tokens": openai_params.CHAT_MAX_TOKENS,
            "stop_sequences": ListOf(items=Text()),
            "temperature": openai_params.TEMPERATURE,
            "top_p": openai_params.TOP_P,
            "top_k": openai_params.TOP_K,
            "stream": Boolean(default=False),
            "metadata": contracts.reported(),  # user_id
            "service_tier": contracts.reported(),
        },
        required=("max_tokens",),
    ),
    generation.MILLM,
    rules=(
        *_RULES,
        *_ENFORCED,
        contracts.when(
            _FORMATTED,
            {"properties": {"stop_sequences": {"anyOf": [{"type": "null"}, {"maxItems": 0}]}}},
            "output_config.format cannot be cut by stop_sequences",
        ),
    ),
    ledger=True,
)

# where the chat request's fields come from, whatever the request holds
_PATHS = {
    "response_format": "output_config.format",
    "response_format.json_schema": "output_config.format",
    "tool_choice.function": "tool_choice",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
}
_TOOL_FIELDS = {"name": "name", "description": "description", "input_schema": "parameters"}
# each role's message as MESSAGE declares it, and the blocks its content takes, by type
_ROLES = {option.fields["role"].values[0]: option for option in MESSAGE.field.options}
_KINDS = {
    role: {block.fields["type"].values[0]: block for block in message.fields["content"].options[1].items.options}
    for role, message in _ROLES.items()
}


def _texts(blocks, where: str, unread: list[str]) -> str:
    return openai_params.text_of(blocks, where, ("text",), TEXT_BLOCK.read, unread)


def _message(message, i: int, out: list[dict], unread: list[str]) -> dict[str, str]:
    """One Anthropic message appended as chat messages: an assistant turn (text and calls), or a
    user's tool results (tool messages) and text, in order; returns the chat locations it made →
    its own."""
    where = f"messages[{i}]"
    made: dict[str, str] = {}
    if not isinstance(message, dict) or message.get("role") not in _ROLES:
        raise GreenroomError("invalid_parameter", f"'{where}' must be a user or assistant message", where)
    role, content = message["role"], message.get("content")
    unread += [f"{where}.{k}" for k in _ROLES[role].unread(message)]
    if content is None:
        raise GreenroomError("missing_parameter", f"'{where}.content' is required", f"{where}.content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(blocks, list):
        raise GreenroomError(
            "invalid_parameter", f"'{where}.content' must be a string or an array of blocks", f"{where}.content"
        )
    text: list[str] = []
    calls: list[dict] = []
    allowed = _KINDS[role]
    for j, block in enumerate(blocks):
        place = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        kind = kind if isinstance(kind, str) else None  # any JSON value may arrive as a type
        if ledger.is_media(kind):
            raise ledger.media_refused(place)
        if kind not in allowed:
            raise GreenroomError(
                "invalid_parameter",
                f"'{place}' must be a text block, a tool_use block (assistant) or a tool_result block (user): "
                "thinking is not supported",
                place,
            )
        for key in allowed[kind].required:
            if block.get(key) is None:
                raise GreenroomError("missing_parameter", f"'{place}.{key}' is required", f"{place}.{key}")
        unread += [f"{place}.{k}" for k in allowed[kind].unread(block)]
        if kind == "text":
            if not isinstance(block["text"], str):
                raise GreenroomError("invalid_parameter", f"'{place}.text' must be a string", f"{place}.text")
            text.append(block["text"])
        elif kind == "tool_use":
            if not (
                isinstance(block["id"], str) and isinstance(block["name"], str) and isinstance(block["input"], dict)
            ):
                raise GreenroomError(
                    "invalid_parameter", f"'{place}' must have a string id and name and an object input", place
                )
            at = f"messages[{len(out)}].tool_calls[{len(calls)}]"  # the assistant turn comes next
            made |= {at: place, f"{at}.function": place, f"{at}.function.arguments": f"{place}.input"}
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": block["name"], "arguments": block["input"]},
                }
            )
        else:
            call = openai_params.answered(block["tool_use_id"], out, f"{place}.tool_use_id")
            if text:  # a user's text before a result: its own turn
                made[f"messages[{len(out)}]"] = where
                out.append({"role": "user", "content": "".join(text)})
                text = []
            result = block.get("content")
            content = "" if result is None else _texts(result, f"{place}.content", unread)
            at = f"messages[{len(out)}]"
            made |= {at: place, f"{at}.content": f"{place}.content", f"{at}.tool_call_id": f"{place}.tool_use_id"}
            out.append({"role": "tool", "content": content, "tool_call_id": call})
    if role == "assistant":
        made[f"messages[{len(out)}]"] = where
        out.append({"role": "assistant", "content": "".join(text), **({"tool_calls": calls} if calls else {})})
    elif text or not out or out[-1]["role"] != "tool":
        made[f"messages[{len(out)}]"] = where
        out.append({"role": "user", "content": "".join(text)})
    return made


def _tool_choice(choice) -> tuple[object, bool | None]:
    """Anthropic's tool_choice as chat's tool_choice and parallel_tool_calls."""
    if choice is None:
        return None, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none") or (kind == "tool" and not isinstance(choice.get("name"), str)):
        raise GreenroomError(
            "invalid_parameter",
            'tool_choice must be {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": ...} or {"type": "none"}',
            "tool_choice",
        )
    single = choice.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise GreenroomError(
            "invalid_parameter",
            "'tool_choice.disable_parallel_tool_use' must be a boolean",
            "tool_choice.disable_parallel_tool_use",
        )
    chat = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or {
        "type": "function",
        "function": {"name": choice["name"]},
    }
    return chat, None if single is None else not single


def _response_format(body: dict, unread: list[str]):
    config = openai_params.mapping(body, "output_config")
    if config is None:
        return None
    unread += [f"output_config.{k}" for k in config if k not in _FORMAT.names]
    if config.get("effort") is not None:
        raise GreenroomError(
            "field_not_honoured",
            "'output_config.effort' cannot be honoured: this model does not think",
            "output_config.effort",
        )
    fmt = config.get("format")
    if fmt is None:
        return None
    if isinstance(fmt, dict):
        unread += [f"output_config.format.{k}" for k in fmt if k not in ("type", "schema")]
    if not (isinstance(fmt, dict) and fmt.get("type") == "json_schema"):
        raise GreenroomError(
            "invalid_parameter",
            '\'output_config.format\' must be {"type": "json_schema", "schema": …}',
            "output_config.format",
        )
    if not isinstance(fmt.get("schema"), dict):  # a count checks no more of it than this, as its document says
        raise GreenroomError(
            "invalid_parameter",
            "'output_config.format.schema' must be a JSON schema (an object)",
            "output_config.format.schema",
        )
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def translate(body: dict, generating: bool = True) -> tuple[ChatRequest, list[str], FieldPaths]:
    """The chat request `body` means, the nested keys not read, and where each of the request's
    locations came from (its refusals, here and later, are named by it). `generating`: a Messages
    request (max_tokens and sampling), not a count_tokens one."""
    unread: list[str] = []
    messages = body.get("messages")
    if messages is None:
        raise GreenroomError("missing_parameter", "'messages' is a required property", "messages")
    if not isinstance(messages, list) or not messages:
        raise GreenroomError("invalid_parameter", "'messages' must be a non-empty array", "messages")
    system = body.get("system")
    out = [{"role": "system", "content": _texts(system, "system", unread)}] if system is not None else []
    names = {**_PATHS, **(paths.message(0, "system") if out else {})}
    for i, message in enumerate(messages):
        names |= _message(message, i, out, unread)
    choice, parallel = _tool_choice(body.get("tool_choice"))
    tools = structured.translated_tools(
        body, (None, "custom"), _TOOL_FIELDS, ("input_schema",), TOOL.field.read, unread
    )
    output = Output(
        tools=tools, tool_choice=choice, parallel_tool_calls=parallel, response_format=_response_format(body, unread)
    )
    shared = {}
    if generating:
        if body.get("max_tokens") is None:
            raise GreenroomError("missing_parameter", "'max_tokens' is a required property", "max_tokens")
        stop = body.get("stop_sequences")
        if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
            raise GreenroomError("invalid_parameter", "'stop_sequences' must be an array of strings", "stop_sequences")
        output = attrs.evolve(output, stop=bool(stop))
        shared = {"stop": stop or None} | {
            k: body.get(k) for k in ("max_tokens", "temperature", "top_p", "top_k", "stream", *generation.MILLM.names)
        }
    field_paths = FieldPaths(names | paths.tools(len(tools or ()), _TOOL_FIELDS))
    with field_paths.renaming():
        request = openai_params.translated(body["model"], out, output, shared)
    return request, unread, field_paths


# --- the answer ---------------------------------------------------------------------------------


@attrs.frozen
class _Answer:
    """One request's Message (messages_format writes it)."""

    model: str
    id: str = attrs.Factory(lambda: f"msg_{uuid.uuid4().hex}")

    def context(self, admitted: Admitted) -> messages_format.Context:
        return messages_format.Context(self.id, self.model, admitted.prompt_tokens)

    def stream(self, events: AsyncIterator[Event], admitted: Admitted) -> AsyncIterator[bytes]:
        return messages_format.stream(events, self.context(admitted))

    async def whole(self, completion: Completion, admitted: Admitted) -> dict:
        return messages_format.whole(completion, self.context(admitted))


def register(app: Quart, tree: Tree) -> None:
    @routes.view(app, "POST", "/v1/messages")
    async def create_message():
        req = await generation.prepare(tree, REQUEST, "on messages", translated=True, generates="chat")
        asked, unread, field_paths = translate(req.body)
        with field_paths.renaming():
            answer = _Answer(req.model)
            return await generation.chat(tree, req.asking(asked, unread, field_paths), lambda *_: answer)

    @routes.view(app, "POST", "/v1/messages/count_tokens")
    async def count_tokens():
        req = await generation.prepare(tree, COUNT_REQUEST, "on count_tokens", translated=True, generates="chat")
        asked, unread, field_paths = translate(req.body, generating=False)
        req = req.asking(asked, unread, field_paths)
        headers = req.headers()
        with field_paths.renaming():
            tools = structured.rendered_tools(asked.output)  # counted, not enforced: no schema is checked
        message = Tokenize(openai_params.new_rid("count"), req.model, conversation=asked.conversations[0], tools=tools)
        counted = await tokenize_api.tokenized(tree, message)
        return {"input_tokens": len(counted.tokens)}, 200, headers
