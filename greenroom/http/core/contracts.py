"""Request contracts: every request body, query and path parameter greenroom reads, declared
once as data.

A request's shape is a `Shape` of `Field`s: each field's JSON type, bounds, enum, pattern,
default and description. The parser that validates the request reads its limits from the
declaration (`lo`, `hi`, `values`, `matches`, `Shape.names`, `default`), and openapi.py
renders the same objects as JSON Schema, so a bound, an enum or a field list cannot differ
between the two; tests/live/test_openapi.py fuzzes the server both ways (requests the document
allows are accepted, requests it forbids are refused).

Why data and not msgspec or cattrs structs: a refusal's code, message and param are API
(clients and tests match on them, the spec words several), and the spec orders the checks
(the field ledger first, then each field as the route reads it); a decoding library refuses
in its own words and order. So the parsers keep their checks and read what they check
against from here.

Null: greenroom reads an optional field sent as null as one left out, so an optional field
renders nullable unless it says `null=False` (its parser refuses null). What one field says
about another (a scoring request's max_tokens is 1) is declared beside its check as a JSON
Schema `if`/`then` in `Shape.rules`.

A field's ledger rule (`Rule`: used, reported, refused, or honoured by an engine capability) is
part of its declaration: the field ledger (ledger.py) checks a request against its Shape's rules,
and the document renders each rule as the field's description (a refused field as the values it
lets through). Standard library, attrs and pure tables (capabilities, header names) only: no torch here.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from greenroom.engines.capabilities import WHY_NOT
from greenroom.http.core.headers import IGNORED_FIELDS_HEADER

NULL = {"type": "null"}


@attrs.frozen
class Rule:
    """What the field ledger does with a field of a request it checks (ledger.check)."""

    needs: str | None = None  # the capability that honours it; None with refuse=False: always used
    refuse: bool = False  # without `needs`, refused (unless no-op); with it, refused when the engine lacks it
    report: bool = False  # accepted, never read
    noop: tuple = ()  # values that mean "no change" (null always does)
    why: str = ""
    when: tuple = ()  # (key, value): read only in an object whose `key` holds `value`, elsewhere reported

    def reads(self, obj: dict) -> bool:
        """Whether the field is read in `obj` (the object holding it)."""
        return not self.report and (not self.when or obj.get(self.when[0]) == self.when[1])

    def describe(self) -> str:
        """The rule in the document's words ("" for a field that is read)."""
        noop = "null" + "".join(f" or {json.dumps(v)}" for v in self.noop)
        if self.when:
            return f"Read where {self.when[0]} is {json.dumps(self.when[1])}; elsewhere reported in {IGNORED_FIELDS_HEADER}"
        if self.needs is None:
            if self.refuse:
                return f"Refused with 400 field_not_honoured unless {noop}: {self.why}"
            if self.report:
                return f"Not read: reported in {IGNORED_FIELDS_HEADER}" + f" unless {noop}" * bool(self.noop)
            return ""
        if self.report:
            return f"Reported in {IGNORED_FIELDS_HEADER} by an engine without {self.needs}"
        return (
            f"Refused with 400 field_not_honoured unless {noop} by an engine without {self.needs} "
            f"({WHY_NOT[self.needs]})"
        )


USE = Rule()


def needs(capability: str, *noop) -> Rule:
    """Honoured by an engine with `capability`; refused by one without, unless null or one of `noop`."""
    return Rule(needs=capability, refuse=True, noop=noop, why=WHY_NOT[capability])


@attrs.frozen(kw_only=True)
class Field:
    description: str = ""
    default: Any = None  # what the parser uses when the field is left out (None: nothing)
    null: bool = True  # optional and sent as null: read as left out
    examples: tuple = ()
    rule: Rule = USE  # what the field ledger does with it, where a Shape the ledger checks holds it

    def render(self, components: dict) -> dict:
        """This field as JSON Schema; named shapes it reaches are added to `components`."""
        out = self._schema(components)
        if self._description():
            out["description"] = self._description()
        if self.default is not None:
            out["default"] = self.default
        if self.examples:
            out["examples"] = list(self.examples)
        return out

    def _schema(self, components: dict) -> dict:
        raise NotImplementedError

    def _description(self) -> str:
        return self.description


@attrs.frozen(kw_only=True)
class Anything(Field):
    """Any JSON value (the parser reads it as it comes, or another check judges it)."""

    def _schema(self, components: dict) -> dict:
        return {}


@attrs.frozen(kw_only=True)
class Boolean(Field):
    def _schema(self, components: dict) -> dict:
        return {"type": "boolean"}

    @staticmethod
    def holds(value) -> bool:
        return isinstance(value, bool)


@attrs.frozen(kw_only=True)
class Number(Field):
    lo: float | None = None  # inclusive
    hi: float | None = None
    above: float | None = None  # exclusive lower bound
    integer: bool = False
    nonzero: bool = False

    def _schema(self, components: dict) -> dict:
        out: dict = {"type": "integer" if self.integer else "number"}
        if self.lo is not None:
            out["minimum"] = self.lo
        if self.above is not None:
            out["exclusiveMinimum"] = self.above
        if self.hi is not None:
            out["maximum"] = self.hi
        if self.nonzero:
            out["not"] = {"const": 0}
        return out

    def typed(self, value) -> bool:
        """A JSON number of this kind (an integer field takes no fraction and no float)."""
        if isinstance(value, bool):
            return False
        return isinstance(value, int) if self.integer else isinstance(value, (int, float))

    def within(self, value) -> bool:
        return (
            (self.lo is None or value >= self.lo)
            and (self.hi is None or value <= self.hi)
            and (self.above is None or value > self.above)
            and not (self.nonzero and value == 0)
        )

    def holds(self, value) -> bool:
        return self.typed(value) and self.within(value)


@attrs.frozen(kw_only=True)
class Text(Field):
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None  # matched against the whole string

    def _schema(self, components: dict) -> dict:
        out: dict = {"type": "string"}
        if self.min_length is not None:
            out["minLength"] = self.min_length
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        if self.pattern is not None:
            out["pattern"] = f"^(?:{self.pattern})$"
        return out

    def matches(self, value) -> bool:
        return (
            isinstance(value, str)
            and (self.min_length is None or len(value) >= self.min_length)
            and (self.max_length is None or len(value) <= self.max_length)
            and (self.pattern is None or re.fullmatch(self.pattern, value) is not None)
        )


@attrs.frozen(kw_only=True)
class Choice(Field):
    """One of these JSON values."""

    values: tuple

    def _schema(self, components: dict) -> dict:
        return {"const": self.values[0]} if len(self.values) == 1 else {"enum": list(self.values)}


@attrs.frozen(kw_only=True)
class ListOf(Field):
    items: Field
    min_items: int | None = None
    max_items: int | None = None

    def _schema(self, components: dict) -> dict:
        out: dict = {"type": "array", "items": self.items.render(components)}
        if self.min_items is not None:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        return out


@attrs.frozen(kw_only=True)
class MapOf(Field):
    """An object of any keys (those matching `keys`, when given), each value a `values`."""

    values: Field
    keys: Text | None = None

    def _schema(self, components: dict) -> dict:
        out: dict = {"type": "object", "additionalProperties": self.values.render(components)}
        if self.keys is not None:
            out["propertyNames"] = self.keys.render(components)
        return out


@attrs.frozen(kw_only=True)
class AnyOf(Field):
    options: tuple[Field, ...]

    def _schema(self, components: dict) -> dict:
        return {"anyOf": [o.render(components) for o in self.options]}


@attrs.frozen(kw_only=True)
class Shape(Field):
    """A JSON object. Open (the default): other fields are accepted (the ledger reports them);
    closed: any other field is refused, but for those whose names match one of `patterns`."""

    fields: dict[str, Field]
    required: tuple[str, ...] = ()
    closed: bool = False
    patterns: dict[str, Field] = attrs.field(factory=dict)  # a name's regular expression -> what it holds
    extra: Field | None = None  # what an open shape's other fields may hold (None: anything)
    rules: tuple = ()  # JSON Schema over several fields (Fields inside rendered), each beside the check it mirrors
    # a request the field ledger checks, or an object inside one it walks: its fields' rules hold,
    # other fields are reported (with their location, e.g. messages[2].name)
    ledger: bool = False

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.fields)

    @property
    def read(self) -> frozenset[str]:
        """The fields its parser reads: those declared, but for the ones it reports."""
        return frozenset(name for name, f in self.fields.items() if not f.rule.report)

    def unread(self, value: dict) -> list[str]:
        """The keys of `value` not read: not declared, declared as reported, or read only
        elsewhere (`Rule.when`)."""
        return [key for key in value if key not in self.fields or not self.fields[key].rule.reads(value)]

    def _description(self) -> str:
        return _joined(self.description, UNKNOWN * self.ledger)

    def _schema(self, components: dict) -> dict:
        out: dict = {
            "type": "object",
            "properties": {name: self._property(name, f, components) for name, f in self.fields.items()},
        }
        if self.required:
            out["required"] = list(self.required)
        if self.patterns:
            out["patternProperties"] = {k: f.render(components) for k, f in self.patterns.items()}
        if self.closed:
            out["additionalProperties"] = False
        elif self.extra is not None:
            out["additionalProperties"] = self.extra.render(components)
        if self.rules:
            out["allOf"] = resolve(list(self.rules), components)
        return out

    def described(self, name: str) -> str:
        """Field `name`'s description, and in a Shape the ledger checks its rule: what the document
        (and docs/openai.md's parameter table) says of it."""
        field = self.fields[name]
        rule = field.rule.describe() if self.ledger else ""
        inner = field.field.description if isinstance(field, Named) else ""  # a named shape's own
        return _joined(field.description or inner, rule, sep=". ")

    def _property(self, name: str, field: Field, components: dict) -> dict:
        if self.ledger and field.rule != USE:
            field = attrs.evolve(field, description=self.described(name))
        out = field.render(components)
        return out if name in self.required or not field.null else nullable(out)


UNKNOWN = f"Unknown fields are accepted and named in the {IGNORED_FIELDS_HEADER} response header"


def _joined(*parts: str, sep: str = " ") -> str:
    return sep.join(p for p in parts if p)


def refused(*noop, why: str) -> Choice:
    """A field no parser reads, refused with 400 field_not_honoured unless null or one of `noop`:
    it takes the values that change nothing."""
    return Choice(values=(None, *noop), rule=Rule(refuse=True, noop=noop, why=why))


def reported(*noop, description: str = "") -> Anything:
    """A field accepted and never read: reported in X-miLLM-Ignored-Fields unless null or one of `noop`."""
    return Anything(rule=Rule(report=True, noop=noop), description=description)


@attrs.frozen(kw_only=True)
class Named(Field):
    """A shape that the document holds once, in components.schemas, and refers to by name."""

    name: str
    field: Field

    def _schema(self, components: dict) -> dict:
        if self.name not in components:
            components[self.name] = {}  # a recursive shape refers to itself while it renders
            components[self.name] = self.field.render(components)
        return {"$ref": f"#/components/schemas/{self.name}"}


@attrs.frozen(kw_only=True)
class Schema(Field):
    """JSON Schema written out (Fields inside rendered), for what the types above do not say."""

    schema: dict

    def _schema(self, components: dict) -> dict:
        return resolve(self.schema, components)


def element(field: Field | None) -> Field | None:
    """What a list `field` holds (through a name, a Schema's `items`, or a list option of AnyOf)."""
    if isinstance(field, Named):
        return element(field.field)
    if isinstance(field, ListOf):
        return field.items
    if isinstance(field, Schema) and isinstance(field.schema.get("items"), Field):
        return field.schema["items"]
    if isinstance(field, AnyOf):
        return next((e for e in map(element, field.options) if e is not None), None)
    return None


def shape(field: Field | None) -> Shape | None:
    """The object `field` declares (through a name), if it declares one."""
    if isinstance(field, Named):
        return shape(field.field)
    return field if isinstance(field, Shape) else None


def resolve(value, components: dict):
    """JSON with the Fields anywhere inside it rendered."""
    if isinstance(value, Field):
        return value.render(components)
    if isinstance(value, dict):
        return {k: resolve(v, components) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [resolve(v, components) for v in value]
    return value


def merge(*shapes: Shape, rules: tuple = (), **annotations) -> Shape:
    """One request's shape from the parts the modules that check it declare (each field in one)."""
    fields: dict[str, Field] = {}
    for shape in shapes:
        assert not fields.keys() & shape.fields.keys(), f"declared twice: {fields.keys() & shape.fields.keys()}"
        fields |= shape.fields
    return Shape(
        fields=fields,
        required=tuple(r for s in shapes for r in s.required),
        closed=any(s.closed for s in shapes),
        rules=tuple(r for s in shapes for r in s.rules) + rules,
        **annotations,
    )


INT64 = (-(2**63), 2**64 - 1)  # what msgpack carries: signed or unsigned 64 bits
# A number, or any JSON value, whose integers fit in 64 bits: what travels to an engine or the
# steering coordinator (msgpack) as it came; a longer integer is a 400.
NUMBER = Schema(
    schema={
        "type": "number",
        "not": {"type": "integer", "anyOf": [{"minimum": INT64[1] + 1}, {"maximum": INT64[0] - 1}]},
    }
)
DATA = Named(
    name="JSONData",
    field=Schema(
        schema={
            "anyOf": [
                {"type": ["null", "boolean", "string"]},
                NUMBER,
                {"type": "array", "items": {"$ref": "#/components/schemas/JSONData"}},
                {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/JSONData"}},
            ]
        },
        description="Any JSON value whose integers fit in 64 bits",
    ),
)

_ANNOTATIONS = ("description", "default", "examples")


def nullable(schema: dict) -> dict:
    """`schema`, or null (its annotations kept outside)."""
    notes = {k: schema[k] for k in _ANNOTATIONS if k in schema}
    core = {k: v for k, v in schema.items() if k not in _ANNOTATIONS}
    if not core:  # anything: null included
        return schema
    if "enum" in core and len(core) == 1:
        return {"enum": core["enum"] + ([None] if None not in core["enum"] else []), **notes}
    if "const" in core and len(core) == 1:
        return {"enum": [core["const"], None], **notes}
    if isinstance(core.get("type"), str) and not {"$ref", "anyOf", "allOf", "const", "enum"} & core.keys():
        return {**core, "type": [core["type"], "null"], **notes}
    return {"anyOf": [core, NULL], **notes}


def when(condition: dict, then: dict, description: str) -> dict:
    """A rule over several fields: where `condition` holds, `then` must."""
    return {"if": condition, "then": then, "description": description}


def at(leaf: dict, *path: str) -> dict:
    """JSON Schema: the value at `path` (objects all the way down: a null on the way is not
    one) is there and holds `leaf`."""
    for name in reversed(path):
        leaf = {"type": "object", "properties": {name: leaf}, "required": [name]}
    return leaf


def sent(*names: str) -> dict:
    """JSON Schema: each of these fields is present and not null."""
    return {"required": list(names), "properties": {n: {"not": NULL} for n in names}}
