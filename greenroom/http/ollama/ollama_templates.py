"""Ollama's TEMPLATE — a Go text/template (go_template.py) — rendered as Ollama's template
package renders one (ollama/ollama template/template.go: Execute as at 0097ef5f, the FuncMap
of its newer revisions), on the values its server passes: /api/generate's `template` and the
TEMPLATE of a model made by /api/create (on /api/generate and /api/chat alike).

- A template that names `.Messages` (or `.Document`) runs once on `System` (every system
  message, joined by a blank line), `Messages` (consecutive messages of one role merged, by a
  blank line, but tool results), `Tools`, `Response` (""), `Think`, `ThinkLevel`,
  `IsThinkSet`, `Query`, `Document` and `Instruction` ("").
- Any other is Ollama's legacy form: it runs once per exchange on `System`, `Prompt` and
  `Response`, and a last time, cut after its `{{ .Response }}`, on the last one (a template
  without `.Response` gets one at its end, as Ollama appends it).

The values are Ollama's api types: a message's Role, Content, Thinking, Images, ToolCalls
(Function.Index, .Name, .Arguments — printed as JSON), ToolName and ToolCallID; a tool's Type
and Function (Name, Description, Parameters: Type, Required, Properties — each property's
Type, Description, Enum, Items, and its ToTypeScriptType), printed as JSON in the order the
client sent them (`{{ .Tools }}`, `{{ .Function }}`, `{{ json … }}`); ranged over, properties
and arguments go in key order, as Go ranges a map. The functions are Go's and Ollama's `json`,
`currentDate`, `yesterdayDate` and `toTypeScriptType`. A `developer` message counts as a system
message, as in Ollama's newest.

`render` refuses, naming it, what greenroom does not render, and a value Ollama does not pass
(`.Foo`, which Ollama prints as <no value>); `check` is /api/create's: `render` on sample
conversations (with tools), and the model's own template, as /api/show prints it, taken back.
"""

from __future__ import annotations

import datetime
import functools
import json

import attrs

from greenroom.errors import GreenroomError
from greenroom.http.ollama import go_template as go

# the values Ollama's Execute gives a template, in any of its forms
VALUES = ("System", "Prompt", "Response", "Messages", "Tools", "Suffix", "Think", "ThinkLevel", "IsThinkSet")
VALUES += ("Query", "Document", "Instruction")


_TS_TYPES = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean", "array": "any[]"}
_TS_TYPES |= {"object": "Record<string, any>", "null": "null"}


def _ts_type(p) -> str:
    """Ollama's ToolProperty.ToTypeScriptType (`toTypeScriptType` of anything else: any)."""
    if not isinstance(p, go.Struct) or p.type != "api.ToolProperty":
        return "any"
    if p.fields["AnyOf"]:
        return " | ".join(_ts_type(x) for x in p.fields["AnyOf"])
    kinds = p.fields["Type"]
    kinds = [kinds] if isinstance(kinds, str) and kinds else list(kinds)
    return " | ".join(_TS_TYPES.get(k, "any") for k in kinds) or "any"


def _date(days: int):
    return lambda *_: (datetime.date.today() + datetime.timedelta(days=days)).isoformat()


# Ollama's FuncMap
FUNCTIONS = {
    "json": (go.go_json, 1),
    "currentDate": (_date(0), None),  # a format argument is taken and ignored, as Ollama does
    "yesterdayDate": (_date(-1), None),
    "toTypeScriptType": (_ts_type, 1),
}


def _any(v):
    """A JSON value as Go's json.Unmarshal makes an `any` of it: every number a float64."""
    if isinstance(v, dict):
        return {k: _any(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_any(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool):
        try:
            return float(v)
        except OverflowError:  # Go's decoding fails on it too
            raise GreenroomError("invalid_parameter", "a number is past a float64's range") from None
    return v


def _slice(items, string=None) -> go.Slice:
    return go.Slice(items or (), nil=not items, string=string)


def _property(p: dict) -> go.Struct:
    kind = p.get("type")
    if isinstance(kind, list):  # PropertyType: one type prints as itself, several as Go's []string
        kind = kind[0] if len(kind) == 1 else go.Slice(kind, string=lambda s: "[" + " ".join(s) + "]")
    return go.Struct(
        "api.ToolProperty",
        {
            "AnyOf": _slice([_property(x) for x in p.get("anyOf") or () if isinstance(x, dict)]),
            "Type": kind or "",
            "Items": _any(p.get("items")),
            "Description": p.get("description") or "",
            "Enum": _slice(_any(p.get("enum") or [])),
            "Properties": _properties(p.get("properties")),
        },
        (
            ("AnyOf", "anyOf", True),
            ("Type", "type", True),
            ("Items", "items", True),
            ("Description", "description", True),
            ("Enum", "enum", True),
            ("Properties", "properties", True),
        ),
        methods={"ToTypeScriptType": _ts_type},
    )


def _properties(props) -> go.Map | None:
    if not isinstance(props, dict):
        return None
    return go.Map({k: _property(v) for k, v in props.items() if isinstance(v, dict)}, string=go.go_json)


def _tool(t: dict) -> go.Struct:
    """An Ollama (or OpenAI) tool object as Ollama's api.Tool."""
    f = t.get("function") or {}
    params = f.get("parameters") or {}
    parameters = go.Struct(
        "api.ToolFunctionParameters",
        {
            "Type": params.get("type") or "",
            "Defs": _any(params.get("$defs")),
            "Items": _any(params.get("items")),
            "Required": _slice(params.get("required")),
            "Properties": _properties(params.get("properties")),
        },
        (
            ("Type", "type", False),
            ("Defs", "$defs", True),
            ("Items", "items", True),
            ("Required", "required", True),
            ("Properties", "properties", False),
        ),
        string=go.go_json,
    )
    function = go.Struct(
        "api.ToolFunction",
        {"Name": f.get("name") or "", "Description": f.get("description") or "", "Parameters": parameters},
        (("Name", "name", False), ("Description", "description", True), ("Parameters", "parameters", False)),
        string=go.go_json,
    )
    return go.Struct(
        "api.Tool",
        {"Type": t.get("type") or "", "Items": _any(t.get("items")), "Function": function},
        (("Type", "type", False), ("Items", "items", True), ("Function", "function", False)),
        string=go.go_json,
    )


def _typed(value, kind, what: str, at: str):
    """`value` if it is of `kind` (None: the type's zero), else the 400 Ollama's JSON decoding
    of api.Message would answer."""
    if value is None:
        return kind()
    if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
        raise GreenroomError("invalid_parameter", f"'{at}' must be {what}", at)
    return value


def _tool_call(c: dict, at: str) -> go.Struct:
    f = c.get("function") or {}
    arguments = f.get("arguments")
    if isinstance(arguments, str):  # OpenAI's form: JSON text
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise GreenroomError(
                "invalid_parameter", f"'{at}.function.arguments' is not JSON", f"{at}.function.arguments"
            ) from None
    arguments = _typed(arguments, dict, "an object", f"{at}.function.arguments")
    function = go.Struct(
        "api.ToolCallFunction",
        {
            "Index": _typed(f.get("index"), int, "an integer", f"{at}.function.index"),
            "Name": f.get("name") or "",
            "Arguments": go.Map({k: _any(v) for k, v in arguments.items()}, string=go.go_json),
        },
        (("Index", "index", False), ("Name", "name", False), ("Arguments", "arguments", False)),
    )
    return go.Struct(
        "api.ToolCall",
        {"ID": _typed(c.get("id"), str, "a string", f"{at}.id"), "Function": function},
        (("ID", "id", True), ("Function", "function", False)),
    )


def _content(content) -> str:
    if isinstance(content, list):  # text parts (validated before)
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return content or ""


def _message(m: dict, at: str) -> go.Struct:
    """An Ollama (or OpenAI) message (its role, content and calls validated before) as
    Ollama's api.Message."""
    role = str(m.get("role") or "").lower()
    calls = m.get("tool_calls") or ()
    return go.Struct(
        "api.Message",
        {
            "Role": "system" if role == "developer" else role,
            "Content": _content(m.get("content")),
            "Thinking": _typed(m.get("thinking"), str, "a string", f"{at}.thinking"),
            "Images": _slice(m.get("images")),
            "ToolCalls": _slice([_tool_call(c, f"{at}.tool_calls[{j}]") for j, c in enumerate(calls)]),
            "ToolName": _typed(m.get("tool_name"), str, "a string", f"{at}.tool_name"),
            "ToolCallID": _typed(m.get("tool_call_id"), str, "a string", f"{at}.tool_call_id"),
        },
        (
            ("Role", "role", False),
            ("Content", "content", False),
            ("Thinking", "thinking", True),
            ("Images", "images", True),
            ("ToolCalls", "tool_calls", True),
            ("ToolName", "tool_name", True),
            ("ToolCallID", "tool_call_id", True),
        ),
    )


# --- Ollama's Parse and Execute ------------------------------------------------------------


def _identifiers(node) -> list[str]:
    """Ollama's Identifiers: the names of the fields and variables a template reads (not those
    after a parenthesised pipeline)."""
    if isinstance(node, tuple):
        return [name for n in node for name in _identifiers(n)]
    if isinstance(node, go.Action):
        return _identifiers(node.pipe)
    if isinstance(node, go.Branch):
        return _identifiers(node.pipe) + _identifiers(node.body) + _identifiers(node.orelse or ())
    if isinstance(node, go.Pipe):
        return [name for cmd in node.cmds for a in cmd.args for name in _identifiers(a)]
    if isinstance(node, go.Field):
        return list(node.idents)
    if isinstance(node, go.Variable):
        return [node.name, *node.idents]
    return []


_RESPONSE = go.Action(go.Pipe((), False, (go.Command((go.Field(("Response",)),)),), 0))


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> tuple[go.Template, frozenset[str]]:
    """The template and the names it reads (lower case); without `.Messages` or `.Response`,
    `{{ .Response }}` appended, as Ollama's Parse appends it."""
    template = go.parse(text, FUNCTIONS)
    names = frozenset(n.lower() for n in _identifiers(template.nodes))
    if "messages" not in names and "response" not in names:
        template = template.with_nodes(template.nodes + (_RESPONSE,))
    return template, names


def _cut(nodes: tuple) -> tuple:
    """Ollama's deleteNode: the template without what follows its first `.Response` field —
    every later node, and the rest of the command that names it (a branch's condition is not
    read). A branch's else part that the cut reaches is dropped (Ollama's would panic)."""
    cut = False

    def gone(n) -> bool:
        nonlocal cut
        if isinstance(n, go.Field) and "Response" in n.idents:
            cut = True
            return False
        return cut

    def walk(n):
        if gone(n):
            return None
        if isinstance(n, tuple):
            return tuple(w for c in n if (w := walk(c)) is not None)
        if isinstance(n, go.Branch):
            body = walk(n.body) or ()
            return attrs.evolve(n, body=body, orelse=None if n.orelse is None else walk(n.orelse))
        if isinstance(n, go.Action):
            pipe = walk(n.pipe)
            return None if pipe is None else go.Action(pipe)
        if isinstance(n, go.Pipe):
            cmds = []
            for cmd in n.cmds:
                args = tuple(w for a in cmd.args if (w := walk(a)) is not None)
                if not args:
                    return None
                cmds.append(go.Command(args))
            return attrs.evolve(n, cmds=tuple(cmds))
        return n

    return walk(nodes)


def _collate(messages: list[go.Struct]) -> tuple[str, list[go.Struct]]:
    system, out = [], []
    for m in messages:
        role, content = m.fields["Role"], m.fields["Content"]
        if role == "system":
            system.append(content)
        if out and out[-1].fields["Role"] == role and role != "tool":
            out[-1] = out[-1].replace(Content=out[-1].fields["Content"] + "\n\n" + content)
        else:
            out.append(m)
    return "\n\n".join(system), out


def execute(text: str, messages: list[dict], tools: list | None = None, think=None) -> str:
    """The prompt Ollama renders from template `text` for `messages` (Ollama's message
    objects), `tools` and `think` (None: not sent). go_template.TemplateError if it fails."""
    template, names = _parsed(text)
    system, collated = _collate([_message(m, f"messages[{i}]") for i, m in enumerate(messages)])
    level = think if isinstance(think, str) else ""  # "high", "medium" or "low"
    flags = {"Think": think not in (None, False), "ThinkLevel": level, "IsThinkSet": think is not None}
    if "messages" in names or "document" in names:
        values = {"System": system, "Messages": collated, "Tools": _slice([_tool(t) for t in tools or ()], go.go_json)}
        return template.execute({**values, "Response": "", **flags, "Query": "", "Document": "", "Instruction": ""})
    out, turn = [], {"System": "", "Prompt": "", "Response": ""}
    for m in collated:  # legacy: one run per exchange
        role, content = m.fields["Role"], m.fields["Content"]
        if (role == "system" and (turn["Prompt"] or turn["Response"])) or (role == "user" and turn["Response"]):
            out.append(template.execute({**turn, **flags}))
            turn = {"System": "", "Prompt": "", "Response": ""}
        key = {"system": "System", "user": "Prompt", "assistant": "Response"}.get(role)
        if key:
            turn[key] = content
    out.append(template.with_nodes(_cut(template.nodes)).execute({**turn, **flags}))
    return "".join(out)


def _refusal(exc: go.TemplateError) -> GreenroomError:
    if exc.construct is not None:
        return GreenroomError(
            "field_not_honoured",
            f"'template' cannot be honoured: {exc}. greenroom renders the Go template constructs "
            "Ollama's templates use (docs/ollama.md)",
            "template",
        )
    return GreenroomError("invalid_parameter", f"'template' is not a template Ollama would run: {exc}", "template")


def render(text: str, messages: list[dict], tools: list | None = None, think=None) -> str:
    """`execute`, its failures a typed 400 naming the template's fault; a template that reads
    a value Ollama does not give (which Ollama would print as <no value>) is refused too, and
    so are `tools` for a template that does not read them (Ollama's "does not support tools")."""
    try:
        template, names = _parsed(text)
        unknown = sorted(set(_root_fields(template.nodes)) - set(VALUES))
        if unknown:
            raise GreenroomError(
                "field_not_honoured",
                f"'template' cannot be honoured: .{unknown[0]} is none of the values Ollama gives a "
                f"template ({', '.join(VALUES)}): it would print <no value>",
                "template",
            )
        if tools and "tools" not in names:
            raise GreenroomError(
                "field_not_honoured",
                "'tools' cannot be honoured: the model's template does not read .Tools "
                "(Ollama answers that the model does not support tools)",
                "tools",
            )
        return execute(text, messages, tools, think)
    except go.TemplateError as exc:
        raise _refusal(exc) from None
    except RecursionError:  # a tool's or a call's JSON nested past Python's stack
        raise GreenroomError("invalid_parameter", "a value the template prints nests too deeply", "template") from None


def _root_fields(nodes, rooted: bool = True) -> list[str]:
    """The names of the values a template reads from the data Ollama passes: `$.X` anywhere,
    `.X` where dot is still the data (outside range and with)."""
    out = []
    for node in nodes:
        if isinstance(node, go.Action):
            out += _pipe_fields(node.pipe, rooted)
        elif isinstance(node, go.Branch):
            out += _pipe_fields(node.pipe, rooted)
            out += _root_fields(node.body, rooted and node.kind == "if")
            out += _root_fields(node.orelse or (), rooted)
    return out


def _pipe_fields(pipe: go.Pipe, rooted: bool) -> list[str]:
    out = []
    for cmd in pipe.cmds:
        for a in cmd.args:
            if isinstance(a, go.Field) and rooted:
                out.append(a.idents[0])
            elif isinstance(a, go.Variable) and a.name == "$" and a.idents:
                out.append(a.idents[0])
            elif isinstance(a, go.Pipe):
                out += _pipe_fields(a, rooted)
            elif isinstance(a, go.Chain) and isinstance(a.node, go.Pipe):
                out += _pipe_fields(a.node, rooted)
    return out


_SAMPLE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather",
        "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}},
    },
}
_SAMPLES = (
    (
        [
            {"role": "system", "content": "You are brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ],
        None,
    ),
    (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}],
            },
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        ],
        [_SAMPLE_TOOL],
    ),
)


def check(text: str, own: str) -> str:
    """/api/create's `template`: what to keep — "" for none or for `own`, the base model's own
    template as /api/show prints it (whatever its language) — or a typed 400 naming what
    greenroom does not render or what Ollama would fail on."""
    if not text or text.strip() == own.strip():  # as a Modelfile may have carried it
        return ""
    chat, (calls, tools) = _SAMPLES
    render(text, *chat)  # what Go would not parse is refused here, typed
    render(text, calls, tools if "tools" in _parsed(text)[1] else None)
    return text
