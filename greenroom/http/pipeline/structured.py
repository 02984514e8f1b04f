"""Structured output and tool calling on chat completions: from the request to the
constraint the engine decodes under, and from generated text back to OpenAI's message
(content, tool_calls, finish_reason), checked before it is sent.

Both are enforced by decoding, not hoped for: `response_format` compiles the schema
(greenroom's supported subset, schema_subset.py), and `tool_choice: "required"` or a
named function compiles the tool-call syntax with each function's parameters. A
constrained tool call that does not validate fails in the engine's decoder (it knows the
grammar's functions); calls in unconstrained answers (`auto`) are read by the same parser
(engines/text/tool_calls.py), which keeps only valid calls.
"""

from __future__ import annotations

import functools
import json
import uuid

import attrs
import jsonschema

from greenroom.engines.base import Constraint, JsonObjectConstraint, JsonSchemaConstraint, ToolCallsConstraint
from greenroom.engines.text.tool_calls import load_json
from greenroom.errors import GreenroomError
from greenroom.http.core.contracts import (
    DATA,
    NULL,
    AnyOf,
    Anything,
    Boolean,
    Choice,
    ListOf,
    Named,
    Schema,
    Shape,
    Text,
    needs,
    when,
)
from greenroom.http.core.headers import CONSTRAINED_HEADER
from greenroom.http.core.schema_subset import SCHEMA, check_schema

# --- the fields of a chat request this module reads (contracts.py) ---------------------------

NAME = Text(pattern="[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function and response-format names
FUNCTION = Named(
    name="FunctionDefinition",
    field=Shape(
        fields={
            "name": NAME,
            "description": attrs.evolve(DATA, description="Rendered by the chat template"),
            "parameters": Schema(
                schema={"type": "object", "additionalProperties": DATA},
                null=False,
                description=(
                    "A JSON schema jsonschema can use (calls are validated against it); with tool_choice required or naming "
                    "this function, in greenroom's subset (JSONSchema: it is compiled into the grammar)"
                ),
            ),
        },
        required=("name",),
        extra=DATA,
    ),
)


def flat_tool(component: str, kind: str, fields: dict, **shape) -> Named:
    """A function tool as Responses and Anthropic write it, flat: its `type` (`kind`), chat's
    function name, then `fields` (its description and parameters under the surface's names, and
    the surface's own); `shape`: the rest of its Shape (required, extra, description)."""
    return Named(name=component, field=Shape(fields={"type": Choice(values=(kind,)), "name": NAME, **fields}, **shape))


TOOL = Named(
    name="Tool",
    field=Shape(
        fields={"type": Choice(values=("function",)), "function": FUNCTION}, required=("type", "function"), extra=DATA
    ),
)
_CALLS = ("none", "auto", "required")
TOOL_CHOICE = Named(
    name="ToolChoice",
    field=AnyOf(
        options=(
            Choice(values=_CALLS),
            Shape(
                fields={
                    "type": Choice(values=("function",)),
                    "function": Shape(fields={"name": Text()}, required=("name",)),
                },
                required=("type", "function"),
            ),
            Shape(
                fields={"name": Text()},
                required=("name",),
                rules=({"not": {"properties": {"type": {"const": "function"}}, "required": ["type"]}},),
            ),
        ),
        description="auto (the default with tools): the model may call; required or a named function (one of the "
        "tools): calls are enforced by decoding, with the functions' parameters",
    ),
)
RESPONSE_FORMAT = Named(
    name="ResponseFormat",
    field=AnyOf(
        options=(
            Shape(fields={"type": Choice(values=("text",))}, required=("type",)),
            Shape(fields={"type": Choice(values=("json_object",))}, required=("type",)),
            Shape(
                fields={
                    "type": Choice(values=("json_schema",)),
                    "json_schema": Shape(
                        fields={
                            "name": attrs.evolve(
                                NAME, description=f"Echoed in the {CONSTRAINED_HEADER} response header"
                            ),
                            "schema": attrs.evolve(SCHEMA, null=False),
                            "strict": Boolean(description="Accepted; the schema is enforced by decoding either way"),
                            "description": Anything(),
                        },
                        required=("name",),
                    ),
                },
                required=("type", "json_schema"),
            ),
        ),
        description="json_object or json_schema: the answer is decoded under the schema and validated once "
        "complete (streamed: the text as it is decoded, a failed validation the stream's error event; keys of its "
        "own the type does not read are reported, like every unread field); refused (400 "
        'response_format_unsupported) with stop, with tools unless tool_choice is "none", and while the server '
        "runs continuous batching. Chat only: see [Structured output](openai.md#structured-output)",
    ),
)


def _present(field: str, schema: dict) -> dict:
    return {"properties": {field: schema}, "required": [field]}


_CONSTRAINED = _present(
    "response_format", {"properties": {"type": {"enum": ["json_object", "json_schema"]}}, "required": ["type"]}
)
_NO_TOOLS = {
    "properties": {"tools": {"anyOf": [NULL, {"maxItems": 0}]}, "functions": {"anyOf": [NULL, {"maxItems": 0}]}}
}
_FORCED = {"not": {"enum": ["none", "auto", None]}}
_FUNCTION_CALL = AnyOf(options=(Choice(values=("none", "auto")), Shape(fields={"name": Text()}, required=("name",))))
_PARALLEL = Boolean(description="false: at most one call when tool_choice forces calls")
CHAT = Shape(
    fields={
        "response_format": attrs.evolve(RESPONSE_FORMAT, rule=needs("response_format", {"type": "text"})),
        "tools": ListOf(
            items=TOOL,
            description="Rendered by the chat template; calls in the answer are parsed into message.tool_calls; "
            "`required` and named choices are enforced by decoding (OpenAI-compatible servers such as miLLM refuse "
            "tools). Chat only: see [Tool calling](openai.md#tool-calling)",
            rule=needs("tools", []),
        ),
        "functions": ListOf(items=FUNCTION, description="Deprecated form of tools (not both)", rule=needs("tools", [])),
        # read by a generation only (their shapes are GENERATION's): a scoring request reports them
        "tool_choice": Anything(description="A ToolChoice; " + TOOL_CHOICE.field.description, rule=needs("tools")),
        "function_call": Anything(
            description="Deprecated form of tool_choice: none, auto or {name}", rule=needs("tools")
        ),
        "parallel_tool_calls": Anything(description="A boolean; " + _PARALLEL.description, rule=needs("tools")),
    },
    rules=(
        {
            "not": {
                "properties": {"tools": {"minItems": 1}, "functions": {"minItems": 1}},
                "required": ["tools", "functions"],
            },
            "description": "tools or the deprecated functions, not both",
        },
    ),
)
# what `plan` checks of a generation (scoring.py applies them to every chat request that is not scoring)
GENERATION = (
    Shape(fields={"tool_choice": TOOL_CHOICE, "function_call": _FUNCTION_CALL, "parallel_tool_calls": _PARALLEL}),
    when(
        _CONSTRAINED,
        {
            "properties": {"stop": NULL},
            "anyOf": [
                _NO_TOOLS,
                _present("tool_choice", {"const": "none"}),
                {**_present("function_call", {"const": "none"}), "not": {"required": ["tool_choice"]}},
            ],
        },
        "response_format cannot be cut by stop, or combined with tools unless tool_choice is none",
    ),
    when(
        {
            "anyOf": [
                _present("tool_choice", _FORCED),
                {**_present("function_call", _FORCED), "not": {"required": ["tool_choice"]}},
            ]
        },
        {"not": _NO_TOOLS},
        "tool_choice required or a named function needs tools",
    ),
    when(
        {
            "anyOf": [
                _present("tool_choice", {"enum": ["required"]}),
                _present("tool_choice", {"type": "object"}),
                {**_present("function_call", {"type": "object"}), "not": {"required": ["tool_choice"]}},
            ]
        },
        {
            "properties": {
                "tools": {"items": {"properties": {"function": {"properties": {"parameters": SCHEMA}}}}},
                "functions": {"items": {"properties": {"parameters": SCHEMA}}},
            }
        },
        "calls enforced by decoding: the functions' parameters in greenroom's subset",
    ),
)


def _unsupported(message: str) -> GreenroomError:
    return GreenroomError("response_format_unsupported", message, "response_format")


@attrs.frozen
class Plan:
    """What a chat request asks of its output."""

    constraint: Constraint | None = None  # for the engine
    tools: list[dict] | None = None  # rendered by the template
    tool_mode: str = "none"  # none | auto | required | named
    schema: dict | None = None  # json_schema to validate a finished document against
    json_object: bool = False
    header: str | None = None  # X-miLLM-Constrained
    lenient: bool = False  # an invalid document is returned, not a 500 (/v1/needle/extract decides itself)

    @property
    def parses_tools(self) -> bool:
        return self.tools is not None and self.tool_mode != "none"


@attrs.frozen
class Output:
    """What a chat request asks of its output's form, as `plan` reads it: tools as function tools
    ({"type": "function", "function": {...}}), the values as sent (`plan` checks them)."""

    tools: object = None
    functions: object = None  # the deprecated form of tools
    tool_choice: object = None
    function_call: object = None  # the deprecated form of tool_choice
    parallel_tool_calls: object = None
    response_format: object = None
    stop: bool = False  # a stop was sent (a format refuses it)

    @classmethod
    def of(cls, body: dict) -> Output:
        """A chat completions body's (or one of its fields')."""
        names = [a.name for a in attrs.fields(cls) if a.name != "stop"]
        return cls(**{k: body.get(k) for k in names}, stop=body.get("stop") is not None)


def plan(output: Output, batching: bool = False) -> Plan:
    """`batching`: the server runs continuous batching, under which the spec refuses
    response_format (a /v1 chat request's; Needle's and Ollama's formats are served serially)."""
    tools, mode, name, parallel = _tools(output)
    fmt = output.response_format
    if fmt is None or isinstance(fmt, dict) and fmt.get("type") == "text":  # its other keys: unread_in_format
        if mode in ("required", "named"):
            return Plan(ToolCallsConstraint(tools, name, parallel), tools, mode)
        return Plan(None, tools, mode)
    if batching:
        raise _unsupported("response_format is refused while continuous batching is enabled on this server")
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema", "text"):
        raise _unsupported("'response_format.type' must be text, json_object or json_schema")
    if output.stop:
        raise _unsupported(
            "response_format cannot be combined with stop: a stop string could cut a document and report it complete"
        )
    if tools is not None and mode != "none":
        raise _unsupported('response_format cannot be combined with tools unless tool_choice is "none"')
    if fmt["type"] == "json_object":
        return Plan(JsonObjectConstraint(), tools, mode, json_object=True, header="json_object")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not NAME.matches(spec.get("name")):
        raise _unsupported(
            "'response_format.json_schema' must be an object whose 'name' is 1–64 letters, digits, '_' or '-'"
        )
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise _unsupported("'response_format.json_schema.schema' must be an object")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise _unsupported("'response_format.json_schema.strict' must be a boolean")
    check_schema(schema)
    header = f'json_schema;name="{spec["name"]}"'  # the name's characters need no escaping
    return Plan(JsonSchemaConstraint(schema), tools, mode, schema=schema, header=header)


def rendered_tools(output: Output) -> list[dict] | None:
    """The tools a request's prompt renders, as `plan` reads them, their parameters not checked:
    nothing is enforced (a token count)."""
    return _tools(output, enforced=False)[0]


def unread_in_format(fmt, where: str, options: tuple[Shape, ...] = RESPONSE_FORMAT.field.options) -> list[str]:
    """The locations (under `where`) of a response format's keys that its type does not read:
    keys outside the shape of its type (one of `options`), nested shapes walked."""
    for shape in options:
        if isinstance(fmt, dict) and fmt.get("type") in shape.fields["type"].values:
            return _unread(shape, fmt, where)
    return []  # not a format: plan refuses it by name


def _unread(shape: Shape, value: dict, where: str) -> list[str]:
    out = []
    for key, item in value.items():
        field = shape.fields.get(key)
        if field is None:
            out.append(f"{where}.{key}")
        elif isinstance(field, Shape) and isinstance(item, dict):
            out += _unread(field, item, f"{where}.{key}")
    return out


def translated_tools(
    body: dict, kinds: tuple, fields: dict[str, str], required: tuple[str, ...], read: frozenset[str], unread: list[str]
) -> list[dict] | None:
    """A translated surface's tools (Responses, Messages) as chat's function tools: each of a
    `kinds` type (None: type left out) — any other type is the provider's own tool, refused —
    with its `fields` renamed (its name → the function's) and its `required` ones sent; keys
    outside `read` added to `unread`. `plan` checks the values as it checks chat's."""
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise GreenroomError("invalid_parameter", "'tools' must be an array", "tools")
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or kind not in kinds:
            if isinstance(kind, str):
                raise GreenroomError(
                    "field_not_honoured",
                    f"'tools[{i}]' ({kind}) cannot be honoured: greenroom runs no tools of its own; send your own tools",
                    f"tools[{i}]",
                )
            raise GreenroomError(
                "invalid_parameter", f"'tools[{i}]' must be an object with a valid type", f"tools[{i}]"
            )
        for key in required:
            if tool.get(key) is None:
                raise GreenroomError("missing_parameter", f"'tools[{i}].{key}' is required", f"tools[{i}].{key}")
        unread += [f"tools[{i}].{k}" for k in tool if k not in read]
        out.append({"type": "function", "function": {fields[k]: tool[k] for k in fields if tool.get(k) is not None}})
    return out


def _tools(output: Output, enforced: bool = True) -> tuple[list[dict] | None, str, str | None, bool]:
    """The tools, the call mode, the named function and parallel_tool_calls; `enforced`: the
    parameters are checked for what the mode does with them (compiled into a grammar, or
    validated against) — a request that generates nothing checks none."""
    tools, functions = output.tools, output.functions
    for field, value in (("tools", tools), ("functions", functions)):
        if value is not None and not isinstance(value, list):
            raise GreenroomError("invalid_parameter", f"'{field}' must be an array", field)
    parallel = output.parallel_tool_calls
    if parallel is not None and not isinstance(parallel, bool):
        raise GreenroomError("invalid_parameter", "'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if tools and functions:
        raise GreenroomError("invalid_parameter", "send tools or the deprecated functions, not both", "functions")
    if functions:
        tools = [{"type": "function", "function": f} for f in functions]
        where = "functions[{}]"
    else:
        where = "tools[{}].function"
    choice = output.tool_choice if output.tool_choice is not None else output.function_call
    if not tools:
        if choice not in (None, "none", "auto"):
            raise GreenroomError("invalid_parameter", "'tool_choice' needs tools", "tool_choice")
        return None, "none", None, True
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict):
            raise GreenroomError(
                "invalid_parameter", f'tools[{i}] must be {{"type": "function", "function": {{...}}}}', f"tools[{i}]"
            )
        name = fn.get("name")
        if not NAME.matches(name):
            raise GreenroomError(
                "invalid_parameter",
                f"{where.format(i)}.name must be 1–64 letters, digits, '_' or '-'",
                where.format(i) + ".name",
            )
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise GreenroomError(
                "invalid_parameter",
                f"{where.format(i)}.parameters must be a JSON schema object",
                where.format(i) + ".parameters",
            )
        names.append(name)
    if len(set(names)) != len(names):
        raise GreenroomError("invalid_parameter", "tool names must be unique", "tools")
    mode, name = _choice(choice, names)
    if enforced:
        _check_parameters(tools, mode, name, where)
    return tools, mode, name, parallel is not False


def _check_parameters(tools: list[dict], mode: str, name: str | None, where: str) -> None:
    """Each function's parameters as its mode uses them: compiled into the grammar (required,
    named), or calls validated against them (auto)."""
    for i, tool in enumerate(tools):
        params = tool["function"].get("parameters", {})
        if mode == "required" or mode == "named" and tool["function"]["name"] == name:
            check_schema(params, where.format(i) + ".parameters")  # the subset applies
        elif mode == "auto":  # they must be schemas jsonschema can use
            error = _schema_error(json.dumps(params, sort_keys=True))
            if error is not None:
                raise GreenroomError(
                    "invalid_parameter",
                    f"{where.format(i)}.parameters is not a valid JSON schema: {error}",
                    where.format(i) + ".parameters",
                )


@functools.lru_cache(maxsize=256)
def _schema_error(params: str) -> str | None:
    """Why jsonschema cannot use these parameters (None: it can); ~1 ms a schema, so cached:
    agents send the same tools with every turn."""
    try:
        jsonschema.Draft202012Validator.check_schema(json.loads(params))
    except jsonschema.SchemaError as exc:
        return exc.message
    return None


def _choice(choice, names: list[str]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if choice in _CALLS:
        return choice, None
    name = None
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else choice  # function_call: {"name"}
        name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise GreenroomError(
            "invalid_parameter",
            '\'tool_choice\' must be none, auto, required or {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if name not in names:
        raise GreenroomError(
            "invalid_parameter", f"'tool_choice' names {name!r}, which is not among the tools", "tool_choice"
        )
    return "named", name


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def check(p: Plan, text: str, finish: str) -> None:
    """A complete constrained document that does not validate fails its answer: a 500, never a
    200, or a stream's error event after its text (a document max_tokens cut is not judged)."""
    documents = isinstance(p.constraint, (JsonSchemaConstraint, JsonObjectConstraint))
    if documents and finish == "stop" and not p.lenient:
        if document(p, text) is INVALID:
            raise GreenroomError(
                "constrained_output_invalid",
                f"the constrained output is complete but does not validate: {_why(p, text)[:300]}",
            )


INVALID = object()


def document(p: Plan, text: str):
    """The finished document, parsed, if it is what the plan asked for; else INVALID."""
    return INVALID if _why(p, text) else load_json(text)


def _why(p: Plan, text: str) -> str:
    """Why the document does not validate ("" when it does): its numbers must be ones
    every client holds (tool_calls.load_json), as the constraint writes them."""
    try:
        doc = load_json(text)
        if p.json_object and not isinstance(doc, dict):
            return "not a JSON object"
        if p.schema is not None:
            jsonschema.validate(doc, p.schema, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as exc:
        return exc.message
    except ValueError as exc:
        return str(exc)
    return ""
