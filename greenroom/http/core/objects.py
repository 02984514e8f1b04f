"""Response objects: each object greenroom answers with, declared once as data.

An `Object` is a `contracts.Shape` read the other way round: openapi.py renders it into the
document (closed by default: `additionalProperties: false`), and the formatter that writes the
object calls its `build(**fields)`, which checks the keys it is given against the declaration — a
key the declaration lacks, or a required key missing, raises `Undeclared` there and then. So a
field the server starts sending is declared (and documented) first, or every test that builds
the object fails.

Unlike a request's field, an optional response field is not made nullable: a field is null only
where its declaration says so (`or_null`). Building checks keys, not values (it runs per streamed
chunk); the values are checked against the rendered schema by tests/unit/test_objects.py (a table
of built objects) and tests/live/test_openapi.py (the live server's answers).
"""

from __future__ import annotations

import attrs

from greenroom.http.core.contracts import NULL, AnyOf, Boolean, Choice, Field, Named, Number, Schema, Shape, Text

TEXT = Text()
INTEGER = Number(integer=True)
COUNT = Number(integer=True, lo=0)
FLOAT = Number()
BOOLEAN = Boolean()
NONE = Schema(schema=NULL)
AN_OBJECT = Schema(schema={"type": "object"})  # any JSON object


def const(value) -> Choice:
    return Choice(values=(value,))


def or_null(field: Field, description: str = "") -> AnyOf:
    """`field`, or null."""
    return AnyOf(options=(field, NONE), description=description)


class Undeclared(Exception):
    """A response object built with a key its declaration lacks, or without a required one: a
    programming error (the declaration and its builder drifted apart)."""


@attrs.frozen(kw_only=True)
class Object(Shape):
    """A response object: its fields (every one present unless named in `optional`), and
    whether other keys may appear (`closed`). `name` names it in the document's
    components.schemas (and in errors)."""

    name: str
    optional: tuple[str, ...] = ()
    closed: bool = True
    required: tuple[str, ...] = attrs.field(init=False)
    _keys: frozenset = attrs.field(init=False, eq=False, repr=False)
    _must: frozenset = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        assert set(self.optional) <= self.fields.keys(), f"{self.name}: {self.optional} not all declared"
        object.__setattr__(self, "required", tuple(n for n in self.fields if n not in self.optional))
        object.__setattr__(self, "_keys", frozenset(self.fields))
        object.__setattr__(self, "_must", frozenset(self.required))

    def build(self, **values) -> dict:
        """The object, its keys in the order given; Undeclared if a key is not declared (open
        objects too) or a required one is missing."""
        # an open object's other keys are the clients' to allow, not ours to send
        if values.keys() <= self._keys and self._must <= values.keys():  # no set built: it runs per chunk
            return values
        extra, missing = values.keys() - self._keys, self._must - values.keys()
        wrong = [f"{', '.join(sorted(extra))} not declared"] if extra else []
        wrong += [f"{', '.join(sorted(missing))} missing"] if missing else []
        raise Undeclared(f"{self.name}: {'; '.join(wrong)}")

    def ref(self, description: str = "") -> Named:
        """This object, held once in components.schemas and referred to by name."""
        return Named(name=self.name, field=self, description=description)

    def _property(self, name: str, field: Field, components: dict) -> dict:
        return field.render(components)


@attrs.frozen(kw_only=True)
class Events:
    """A stream of typed events: each SSE event named for its data's `type`, one Object per type
    (`kinds`: each type's own fields; `common`: the fields every event carries)."""

    name: str
    objects: dict[str, Object]

    @classmethod
    def of(cls, name: str, kinds: dict[str, dict[str, Field]], common: dict | None = None, optional=None) -> Events:
        """`optional`: a type -> its fields that may be left out."""
        return cls(
            name=name,
            objects={
                kind: Object(
                    name=kind,
                    fields={"type": const(kind), **(common or {}), **fields},
                    optional=(optional or {}).get(kind, ()),
                )
                for kind, fields in kinds.items()
            },
        )

    def build(self, kind: str, **fields) -> dict:
        """One event's data."""
        return self.objects[kind].build(type=kind, **fields)

    @property
    def data(self) -> Named:
        """Any one event's data, held once in components.schemas as `<name>Data`."""
        return Named(name=f"{self.name}Data", field=AnyOf(options=tuple(self.objects.values())))

    def ref(self, description: str = "") -> Named:
        """The stream's events (the SSE fields, `data` the JSON of one event), and `<name>Data`
        beside it: any one event's data."""
        data = self.data
        return Named(
            name=self.name,
            description=description,
            field=Schema(
                schema={
                    "type": "object",
                    "required": ["event", "data"],
                    "properties": {
                        "event": {"enum": list(self.objects)},
                        "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": data},
                        "id": {"type": "string"},
                        "retry": {"type": "integer"},
                    },
                }
            ),
        )
