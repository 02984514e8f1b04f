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
        """The object, its keys in the order given."""
        missing = self._must - values.keys()
        extra = values.keys() - self._keys if self.closed else ()
        if missing or extra:
            wrong = [f"{', '.join(sorted(extra))} not declared"] * bool(extra)
            raise Undeclared(
                f"{self.name}: " + "; ".join(wrong + [f"{', '.join(sorted(missing))} missing"] * bool(missing))
            )
        return values

    def ref(self, description: str = "") -> Named:
        """This object, held once in components.schemas and referred to by name."""
        return Named(name=self.name, field=self, description=description)

    def _property(self, name: str, field: Field, components: dict) -> dict:
        return field.render(components)
