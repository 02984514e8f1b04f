"""The JSON Schema subset the front end checks before anything is compiled
(greenroom/http/core/schema_subset.py): each refusal typed, naming every offending keyword by its
pointer; names and data are not schemas; the size, depth and width limits
(tests/live/test_constraints.py: the accepted subset compiling on the demo model)."""

from __future__ import annotations

import pytest

from greenroom.errors import GreenroomError
from greenroom.http.core.schema_subset import MAX_DEPTH, MAX_PROPERTIES, MAX_SCHEMA_BYTES, check_schema


def refusal(schema) -> str:
    with pytest.raises(GreenroomError) as info:
        check_schema(schema)
    err = info.value
    assert err.code == "response_format_unsupported" and err.param == "response_format" and err.status == 400
    return err.message


UNSUPPORTED = [
    ("multipleOf", 2),
    ("not", {"type": "string"}),
    ("uniqueItems", True),
    ("allOf", [{"type": "string"}]),
    ("oneOf", [{"type": "string"}]),
    ("if", {"type": "string"}),
    ("then", {}),
    ("else", {}),
    ("patternProperties", {"^a": {}}),
    ("dependentRequired", {"a": ["b"]}),
    ("dependentSchemas", {"a": {}}),
    ("exclusiveMinimum", 0),
    ("exclusiveMaximum", 9),
    ("minProperties", 1),
    ("maxProperties", 3),
    ("prefixItems", [{}]),
    ("contains", {}),
    ("minContains", 1),
    ("propertyNames", {"maxLength": 3}),
    ("unevaluatedProperties", False),
    ("definitions", {}),
    ("$anchor", "a"),
    ("$dynamicRef", "#a"),
    ("nullable", True),
]


@pytest.mark.parametrize("keyword, value", UNSUPPORTED)
def test_each_unsupported_keyword_is_refused_with_its_pointer(keyword, value):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, keyword: value}}}
    assert f"/properties/tags/{keyword}" in refusal(schema)


def test_every_unsupported_keyword_is_named_in_one_message():
    message = refusal(
        {
            "$anchor": "root",
            "type": "object",
            "properties": {
                "tags": {"type": "array", "uniqueItems": True, "items": {"type": "string", "format": "binary"}},
                "a/b~c": {"type": "integer", "multipleOf": 3},
                "choice": {"oneOf": [{"type": "string"}, {"not": {"type": "null"}}]},
            },
            "$defs": {"D": {"type": "string", "minProperties": 1}},
        }
    )
    for ptr in [
        "/$anchor",
        "/properties/tags/uniqueItems",
        "/properties/tags/items/format",
        "/properties/a~1b~0c/multipleOf",
        "/properties/choice/oneOf",
        "/$defs/D/minProperties",
    ]:
        assert ptr in message, ptr
    assert "/properties/choice/oneOf/1/not" not in message  # not walked into an unsupported keyword


def test_refs_must_be_local_into_defs():
    assert "/properties/a/$ref" in refusal({"properties": {"a": {"$ref": "https://example.com/s.json"}}})
    assert "/properties/a/$ref" in refusal({"properties": {"a": {"$ref": "#/definitions/A"}}})
    assert "/properties/a/$ref" in refusal({"properties": {"a": {"$ref": "#/$defs/Missing"}}})
    assert "/properties/a/$defs" in refusal({"properties": {"a": {"$defs": {}}}})  # root only
    check_schema({"properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"type": "integer"}}})


def test_names_and_data_are_not_schemas():
    check_schema(
        {
            "type": "object",
            "title": "Names and data",
            "description": "keyword-looking names and values",
            "properties": {"format": {"type": "string"}, "not": {"type": "integer"}, "$ref": {"type": "null"}},
            "required": ["format", "not"],
            "additionalProperties": {"enum": [{"uniqueItems": True}, {"format": "x"}]},
            "$defs": {"oneOf": {"const": {"multipleOf": 2}}},
            "default": {"format": "email", "allOf": []},
            "examples": [{"not": 1}],
        }
    )


@pytest.mark.parametrize(
    "schema, where",
    [
        ({"format": "uri-reference"}, "/format"),
        ({"format": 3}, "/format"),
        ({"properties": {"a": {"$id": "https://example.com/a"}}}, "/properties/a/$id"),
        ({"deprecated": "yes"}, "/deprecated"),
        ({"$schema": 7}, "/$schema"),
        ({"type": "text"}, "/type"),
        ({"type": ["string", "string"]}, "/type"),
        ({"required": "a"}, "/required"),
        ({"minItems": -1}, "/minItems"),
        ({"maxLength": 2.5}, "/maxLength"),
        ({"minimum": True}, "/minimum"),
        ({"minimum": 5, "maximum": 1}, "/maximum"),
        ({"enum": []}, "/enum"),
        ({"anyOf": []}, "/anyOf"),
        ({"items": [{"type": "string"}]}, "/items"),
        ({"properties": {"a": 3}}, "/properties/a"),
        ({"pattern": "^(?=a)b"}, "/pattern"),
        ({"pattern": "(a)\\1"}, "/pattern"),
    ],
)
def test_malformed_values_are_refused_with_their_pointer(schema, where):
    assert f"{where}:" in refusal(schema)


def test_limits():
    big = {"type": "object", "properties": {"p": {"enum": ["x" * 100] * (MAX_SCHEMA_BYTES // 100)}}}
    assert "65,536" in refusal(big)
    deep: dict = {"type": "object"}
    node = deep
    for _ in range(MAX_DEPTH):
        node["properties"] = {"a": {"type": "object"}}
        node = node["properties"]["a"]
    assert f"deeper than {MAX_DEPTH}" in refusal(deep)
    ok: dict = {"type": "object"}
    node = ok
    for _ in range(MAX_DEPTH - 1):  # each schema under `properties` is one level deeper
        node["properties"] = {"a": {"type": "object"}}
        node = node["properties"]["a"]
    check_schema(ok)
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(MAX_PROPERTIES + 1)}}
    assert f"{MAX_PROPERTIES + 1} properties" in refusal(wide)
    check_schema({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(MAX_PROPERTIES)}})
    assert "JSON object" in refusal([{"type": "string"}])
