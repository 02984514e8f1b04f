"""The JSON Schema subset greenroom enforces for `response_format` (and tool parameters).

The constraint library compiles more keywords than it enforces, and enforces some that a
client could not rely on everywhere, so the subset is greenroom's own list, checked
before anything is compiled or loaded. `check_schema` names every keyword outside it,
and every malformed value, with its JSON pointer (RFC 6901), in one 400
`response_format_unsupported` naming the field that holds the schema.

Annotations constrain nothing and are accepted wherever a schema is (what zod, pydantic and
the AI SDK write: `$schema`, `title`, `examples`, `x-…` …); `format` is enforced for the
formats the constraint library writes as patterns (FORMATS) and refused for any other.

Only schema positions are walked: the keys of `properties` and `$defs` are names (a
property called "format" is fine), and `enum`, `const`, `default` and `examples` hold
data, not schemas.

No torch and no jsonschema here: the front end checks the subset itself.
"""

from __future__ import annotations

import json
import math
import re

import attrs

from greenroom.errors import GreenroomError
from greenroom.http.core import contracts
from greenroom.http.core.contracts import AnyOf, Boolean, Choice, ListOf, MapOf, Named, Number, Schema, Shape, Text

MAX_SCHEMA_BYTES = 65_536  # of the schema as compact JSON (UTF-8)
MAX_DEPTH = 32  # schemas nested in schemas, the root being depth 1
MAX_PROPERTIES = 256  # per `properties` object

TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
SUPPORTED = (
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "anyOf",
    "$ref",
    "$defs",
    "format",
)
# Annotations: accepted and ignored (and every key beginning "x-"). `$id` at the root only: a
# nested one would change what the `$ref`s under it resolve against.
ANNOTATIONS = (
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
)
EXTENSION = re.compile(r"x-.*", re.DOTALL)  # a vendor's own keyword (x-guidance, x-order, …): an annotation
# The string formats llguidance enforces (its JSON compiler writes each as a pattern): OpenAI's
# structured-output formats, and uri.
FORMATS = ("date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri")

_DEFS_REF = re.compile(r"#/\$defs/([^/]+)")
# Lookarounds and backreferences: JSON Schema (ECMA-262) has them, the constraint library does not.
_UNSUPPORTED_PATTERN = re.compile(r"(?<!\\)(?:\\\\)*(?:\(\?<?[=!]|\\[1-9]|\\k<)")

_HINTS = {
    "definitions": "use $defs",
    "exclusiveMinimum": "use minimum",
    "exclusiveMaximum": "use maximum",
    "oneOf": "use anyOf",
    "prefixItems": "use items",
}


def check_schema(schema, param: str = "response_format") -> None:
    """Raise GreenroomError("response_format_unsupported") naming every keyword outside the
    subset and every malformed value, with its JSON pointer; or return None. `param`: the
    field that holds the schema (named in the refusal)."""
    try:
        size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode())
    except RecursionError:
        _refuse(f"the schema is nested too deeply (the limit is depth {MAX_DEPTH})", param)
    except (TypeError, ValueError) as e:
        _refuse(f"the schema is not JSON: {e}", param)
    if size > MAX_SCHEMA_BYTES:
        _refuse(f"the schema is {size:,} bytes as compact JSON; the limit is {MAX_SCHEMA_BYTES:,} (64 KB)", param)
    if not isinstance(schema, dict):
        _refuse("the schema must be a JSON object", param)
    walker = _Walker(schema)
    walker.schema(schema, "", 1)
    walker.invalid += [
        (ptr, "an integer past 64 bits (the schema travels to the engine as it came)") for ptr in _wide(schema, "")
    ]
    problems = []
    if walker.unsupported:
        listed = ", ".join(f"{ptr} ({_hint(ptr)})" if _hint(ptr) else ptr for ptr in walker.unsupported)
        problems.append(f"unsupported keywords: {listed}")
    if walker.invalid:
        problems.append("invalid values: " + "; ".join(f"{ptr}: {why}" for ptr, why in walker.invalid))
    if problems:
        _refuse(
            f"the JSON schema in '{param}' is outside greenroom's supported subset: "
            + "; ".join(problems + walker.limits)
            + ". Supported keywords: "
            + ", ".join(SUPPORTED)
            + " (format: "
            + ", ".join(FORMATS)
            + "); the annotations "
            + ", ".join(ANNOTATIONS)
            + " and x-… are accepted and ignored",
            param,
        )
    if walker.limits:
        _refuse(f"the JSON schema in '{param}' exceeds greenroom's limits: " + "; ".join(walker.limits), param)


def pointer(*parts: str) -> str:
    """An RFC 6901 JSON pointer from unescaped reference tokens."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _hint(ptr: str) -> str | None:
    last = ptr.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~")
    return _HINTS.get(last)


def _refuse(message: str, param: str):
    raise GreenroomError("response_format_unsupported", message, param)


class _Walker:
    def __init__(self, root: dict):
        self.root = root
        self.defs = root.get("$defs") if isinstance(root.get("$defs"), dict) else {}
        self.unsupported: list[str] = []
        self.invalid: list[tuple[str, str]] = []
        self.limits: list[str] = []
        self._too_deep = False

    def schema(self, node, at: str, depth: int) -> None:
        if isinstance(node, bool):  # true / false are schemas too (anything / nothing)
            return
        if not isinstance(node, dict):
            self.invalid.append((at or "/", "a schema must be an object or a boolean"))
            return
        if depth > MAX_DEPTH:
            if not self._too_deep:
                self._too_deep = True
                self.limits.append(f"the schema nests deeper than {MAX_DEPTH} levels (at {at})")
            return
        for key, value in node.items():
            here = at + pointer(key)
            check = _KEYWORDS.get(key)
            if check is None and EXTENSION.fullmatch(key):
                continue
            if check is None:
                self.unsupported.append(here)
            else:
                check(self, node, value, here, depth)

    # -- keyword checks (self, the schema, the keyword's value, its pointer, depth) -------

    def _type(self, node, value, at, depth):
        names = value if isinstance(value, list) else [value]
        if (
            not names
            or any(not isinstance(n, str) or n not in TYPES for n in names)
            or len(set(map(str, names))) != len(names)
        ):
            self.invalid.append((at, "must be one of " + ", ".join(sorted(TYPES)) + ", or a list of distinct ones"))

    def _properties(self, node, value, at, depth):
        if not isinstance(value, dict):
            self.invalid.append((at, "must be an object of schemas"))
            return
        if len(value) > MAX_PROPERTIES:
            self.limits.append(f"{at} has {len(value)} properties; the limit is {MAX_PROPERTIES} per object")
        for name, sub in value.items():
            self.schema(sub, at + pointer(name), depth + 1)

    def _defs(self, node, value, at, depth):
        if node is not self.root:
            self.invalid.append((at, "$defs is supported at the root of the schema only"))
            return
        if not isinstance(value, dict):
            self.invalid.append((at, "must be an object of schemas"))
            return
        for name, sub in value.items():
            self.schema(sub, at + pointer(name), depth + 1)

    def _subschema(self, node, value, at, depth):
        self.schema(value, at, depth + 1)

    def _items(self, node, value, at, depth):
        if isinstance(value, list):
            self.invalid.append((at, "must be one schema (a list of schemas is tuple validation, not supported)"))
            return
        self.schema(value, at, depth + 1)

    def _any_of(self, node, value, at, depth):
        if not isinstance(value, list) or not value:
            self.invalid.append((at, "must be a non-empty list of schemas"))
            return
        for i, sub in enumerate(value):
            self.schema(sub, at + pointer(str(i)), depth + 1)

    def _ref(self, node, value, at, depth):
        match = _DEFS_REF.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            self.invalid.append((at, f"only local references into $defs (#/$defs/Name) are supported, not {value!r}"))
            return
        name = match.group(1).replace("~1", "/").replace("~0", "~")
        if name not in self.defs:
            self.invalid.append((at, f"{value!r} names no entry of the root $defs"))

    def _required(self, node, value, at, depth):
        if not isinstance(value, list) or any(not isinstance(n, str) for n in value) or len(set(value)) != len(value):
            self.invalid.append((at, "must be a list of distinct property names"))

    def _enum(self, node, value, at, depth):
        if not isinstance(value, list) or not value:
            self.invalid.append((at, "must be a non-empty list"))

    def _count(self, node, value, at, depth):
        if not _is_int(value) or value < 0:
            self.invalid.append((at, "must be a non-negative integer"))
        else:
            low, high = ("minItems", "maxItems") if at.endswith("Items") else ("minLength", "maxLength")
            self._ordered(node, low, high, at)

    def _bound(self, node, value, at, depth):
        if not _is_number(value):
            self.invalid.append((at, "must be a number"))
        else:
            self._ordered(node, "minimum", "maximum", at)

    def _ordered(self, node, low, high, at):
        if at.endswith("/" + high) and _is_number(node.get(low)) and node[low] > node[high]:
            self.invalid.append((at, f"is below {low} ({node[low]}): nothing could match"))

    def _pattern(self, node, value, at, depth):
        if not isinstance(value, str):
            self.invalid.append((at, "must be a string"))
            return
        if _UNSUPPORTED_PATTERN.search(value):
            self.invalid.append((at, "lookarounds and backreferences are not supported in patterns"))
        # Other syntax is left to the constraint library's compiler: Python's `re` is neither
        # ECMA-262 nor Rust's regex, and would refuse valid patterns such as (?<name>...).

    def _text(self, node, value, at, depth):
        if not isinstance(value, str):
            self.invalid.append((at, "must be a string"))

    def _id(self, node, value, at, depth):
        if node is not self.root:
            self.invalid.append((at, "$id is accepted at the root of the schema only"))
        else:
            self._text(node, value, at, depth)

    def _flag(self, node, value, at, depth):
        if not isinstance(value, bool):
            self.invalid.append((at, "must be a boolean"))

    def _format(self, node, value, at, depth):
        if value not in FORMATS:
            self.invalid.append(
                (at, f"{json.dumps(value)[:40]} is not a format greenroom enforces (one of {', '.join(FORMATS)})")
            )

    def _examples(self, node, value, at, depth):
        if not isinstance(value, list):
            self.invalid.append((at, "must be a list"))

    def _data(self, node, value, at, depth):
        pass  # const, default: any JSON value


def _wide(value, at: str):
    """The pointers of the integers past 64 bits anywhere in `value`, keywords and data alike."""
    if _is_int(value) and not contracts.INT64[0] <= value <= contracts.INT64[1]:
        yield at
    elif isinstance(value, dict):
        for key, sub in value.items():
            yield from _wide(sub, at + pointer(key))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from _wide(sub, at + pointer(str(i)))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


_KEYWORDS = {
    "type": _Walker._type,
    "properties": _Walker._properties,
    "required": _Walker._required,
    "additionalProperties": _Walker._subschema,
    "items": _Walker._items,
    "minItems": _Walker._count,
    "maxItems": _Walker._count,
    "enum": _Walker._enum,
    "const": _Walker._data,
    "minimum": _Walker._bound,
    "maximum": _Walker._bound,
    "minLength": _Walker._count,
    "maxLength": _Walker._count,
    "pattern": _Walker._pattern,
    "anyOf": _Walker._any_of,
    "$ref": _Walker._ref,
    "$defs": _Walker._defs,
    "format": _Walker._format,
    "title": _Walker._text,
    "description": _Walker._text,
    "default": _Walker._data,
    "examples": _Walker._examples,
    "$schema": _Walker._text,
    "$id": _Walker._id,
    "$comment": _Walker._text,
    "deprecated": _Walker._flag,
    "readOnly": _Walker._flag,
    "writeOnly": _Walker._flag,
}
assert set(_KEYWORDS) == set(SUPPORTED) | set(ANNOTATIONS)


def _keywords(sub) -> dict:
    """The keywords the walker takes, each with the values its check accepts (`sub`: a nested
    schema); what JSON Schema cannot say is in SCHEMA's description."""
    count = Number(lo=0, hi=contracts.INT64[1], integer=True)
    keywords = {
        "type": AnyOf(
            options=(
                Choice(values=tuple(sorted(TYPES))),
                Schema(schema={"type": "array", "items": {"enum": sorted(TYPES)}, "minItems": 1, "uniqueItems": True}),
            )
        ),
        "properties": MapOf(values=sub),
        "required": Schema(schema={"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
        "additionalProperties": sub,
        "items": sub,
        "minItems": count,
        "maxItems": count,
        "enum": ListOf(items=contracts.DATA, min_items=1),
        "const": contracts.DATA,
        "minimum": contracts.NUMBER,
        "maximum": contracts.NUMBER,
        "minLength": count,
        "maxLength": count,
        "pattern": Text(),
        "anyOf": ListOf(items=sub, min_items=1),
        "$ref": Text(pattern=_DEFS_REF.pattern),
        "$defs": MapOf(values=sub),
        "format": Choice(values=FORMATS),
        "title": Text(),
        "description": Text(),
        "default": contracts.DATA,
        "examples": ListOf(items=contracts.DATA),
        "$schema": Text(),
        "$id": Text(),
        "$comment": Text(),
        "deprecated": Boolean(),
        "readOnly": Boolean(),
        "writeOnly": Boolean(),
    }
    assert set(keywords) == set(_KEYWORDS)
    return {k: attrs.evolve(f, null=False) for k, f in keywords.items()}  # null is a value here, not "absent"


_ROOT_ONLY = ("$defs", "$id")
_EXTENSIONS = {"^x-": contracts.DATA}  # patternProperties: the x-… annotations


def _nested(keywords: dict) -> Shape:
    return Shape(fields={k: f for k, f in keywords.items() if k not in _ROOT_ONLY}, closed=True, patterns=_EXTENSIONS)


SUBSCHEMA = Named(
    name="JSONSubschema",
    field=_nested(_keywords(AnyOf(options=(Boolean(), Schema(schema={"$ref": "#/components/schemas/JSONSubschema"}))))),
)
# What openapi.py documents wherever a JSON schema is sent (the walker above is what checks it).
SCHEMA = Named(
    name="JSONSchema",
    field=Shape(
        fields=_keywords(AnyOf(options=(Boolean(), SUBSCHEMA))),
        closed=True,
        patterns=_EXTENSIONS,
        description=(
            "A JSON schema in greenroom's supported subset (the keywords "
            + ", ".join(SUPPORTED)
            + ", format one of "
            + ", ".join(FORMATS)
            + "; the annotations "
            + ", ".join(ANNOTATIONS)
            + f" and x-… are ignored); at most {MAX_SCHEMA_BYTES:,} bytes as compact JSON, {MAX_DEPTH} "
            f"schemas deep and {MAX_PROPERTIES} properties per object; $defs and $id at the root only, a $ref naming one of its "
            "entries, minimum ≤ maximum (and the counts alike), no lookaround or backreference in a pattern; anything "
            "else is a 400 response_format_unsupported"
        ),
    ),
)
