"""Structured output: the llguidance constraints on the real demo model (no mocks), and the
JSON Schema subset the front end checks compiling there (tests/unit/test_schema_subset.py: its
refusals)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from transformers import DynamicCache

from greenroom.engines.base import EngineError, SamplingParams
from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model
from greenroom.engines.generation import Decoder
from greenroom.engines.text.constraints import INTEGER_MAX, ConstraintError, Constraints, GrammarError
from greenroom.engines.text.tool_calls import CallGuard, functions, load_json
from greenroom.engines.transformers.sampling import new_generator, sample
from greenroom.engines.transformers.transformers_engine import TransformersEngine
from greenroom.http.core.schema_subset import FORMATS, check_schema

SEEDS = range(20)

# enum, pattern, minItems, $ref, a nested object, integer bounds; strings and arrays bounded
# so that the random demo model finishes every document.
SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["humor", "not_humor", "unsure"]},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 3},
        "owner": {
            "type": "object",
            "properties": {
                "age": {"type": "integer", "minimum": 18, "maximum": 99},
                "name": {"type": "string", "minLength": 1, "maxLength": 8},
            },
            "required": ["age", "name"],
            "additionalProperties": False,
        },
    },
    "required": ["label", "code", "tags", "owner"],
    "additionalProperties": False,
    "$defs": {"tag": {"type": "string", "maxLength": 6}},
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "minLength": 1, "maxLength": 10},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/small"}, "b": {"$ref": "#/$defs/small"}},
                "required": ["a", "b"],
                "additionalProperties": False,
                "$defs": {"small": {"type": "integer", "minimum": -5, "maximum": 5}},
            },
        },
    },
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
BLOCK = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


@pytest.fixture(scope="module")
def engine(model_cache):
    return TransformersEngine("greenroom-demo", ensure_demo_model(default_cache_dir(), "tiny"))


@pytest.fixture(scope="module")
def constraints(engine):
    return Constraints(engine.tokenizer, engine.vocab_size, engine.eos_token_ids)


def run(engine, constraints, grammar, seed: int, max_tokens: int = 200, prompt: str = "Answer in JSON."):
    """The engine's decode loop with a constraint: forward, mask, sample, consume.
    Returns (text, finish) with finish "done" (grammar complete), "eos" or "length"."""
    matcher = constraints.matcher(grammar)
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed)
    gen = new_generator(seed, engine.device)
    cache = DynamicCache()
    ids = torch.tensor([engine.tokenize(prompt)])
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = engine.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{engine.cache_arg: cache}).logits[
                0, -1
            ]
            matcher.mask(logits)
            token = sample(logits, params, gen, torch.tensor(out, dtype=torch.long))
            matcher.consume(token)
            if token in engine.eos_token_ids:
                assert matcher.done()
                return engine.decode(out), "eos"
            out.append(token)
            if matcher.done():
                return engine.decode(out), "done"
            ids = torch.tensor([[token]])
    assert not matcher.done()
    return engine.decode(out), "length"


# -- JSON schema and JSON object -------------------------------------------------------------


def test_json_schema_documents_validate_on_20_seeds(engine, constraints):
    grammar = constraints.json_schema(SCHEMA)
    texts = set()
    for seed in SEEDS:
        text, finish = run(engine, constraints, grammar, seed)
        assert finish == "done", (seed, text)
        jsonschema.validate(json.loads(text), SCHEMA)
        texts.add(text)
    assert len(texts) > 10  # the seeds really sample different documents


def test_same_seed_same_document(engine, constraints):
    grammar = constraints.json_schema(SCHEMA)
    assert run(engine, constraints, grammar, 3) == run(engine, constraints, grammar, 3)


def test_json_object_is_one_object(engine, constraints):
    grammar = constraints.json_object()
    finished = 0
    for seed in range(6):
        text, finish = run(engine, constraints, grammar, seed, max_tokens=300)
        assert text.startswith("{")
        if finish != "length":
            finished += 1
            assert isinstance(json.loads(text), dict)
    assert finished >= 2


def test_eos_is_allowed_only_once_the_document_is_complete(engine, constraints):
    matcher = constraints.matcher(constraints.json_schema({"type": "integer", "minimum": 0, "maximum": 500}))
    eos = sorted(engine.eos_token_ids)

    def allowed() -> torch.Tensor:
        logits = torch.zeros(engine.vocab_size)
        matcher.mask(logits)
        return torch.isfinite(logits)

    assert not allowed()[eos].any() and not matcher.accepting()
    for token in engine.tokenize("12", add_special_tokens=False):
        matcher.consume(token)
    assert matcher.accepting() and not matcher.done()  # "120" could still follow
    assert allowed()[eos].all()
    matcher.consume(eos[0])
    assert matcher.done()


def test_ids_past_the_tokenizer_are_forbidden(engine):
    padded = Constraints(engine.tokenizer, engine.vocab_size + 40, engine.eos_token_ids)
    matcher = padded.matcher(padded.json_object())
    logits = torch.zeros(engine.vocab_size + 40)
    matcher.mask(logits)
    assert torch.isinf(logits[engine.vocab_size :]).all()
    assert torch.isfinite(logits[: engine.vocab_size]).sum() >= 1


def test_a_forbidden_token_is_refused(engine, constraints):
    matcher = constraints.matcher(constraints.json_object())
    with pytest.raises(ConstraintError):
        matcher.consume(engine.tokenize("x", add_special_tokens=False)[0])


def test_grammars_are_cached_by_schema_with_property_order_kept(constraints):
    a = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}
    b = {"type": "object", "properties": {"y": {"type": "integer"}, "x": {"type": "integer"}}}
    assert constraints.json_schema(a) is constraints.json_schema(json.loads(json.dumps(a)))
    assert constraints.json_schema(a) is not constraints.json_schema(b)  # llguidance keeps the order


def test_cache_is_bounded(engine):
    small = Constraints(engine.tokenizer, engine.vocab_size, engine.eos_token_ids, cache_size=2)
    first = small.json_schema({"const": 0})
    small.json_schema({"const": 1})
    small.json_schema({"const": 2})
    assert small.json_schema({"const": 0}) is not first


def test_unsatisfiable_schemas_fail_to_compile(constraints):
    with pytest.raises(GrammarError, match="minimum"):
        constraints.json_schema({"type": "integer", "minimum": 5, "maximum": 3})
    with pytest.raises(GrammarError):
        constraints.json_schema({"type": "string", "pattern": "["})


# -- numbers: only what every client holds ---------------------------------------------------


def accepts(engine, constraints, grammar, text: str) -> bool:
    """The grammar admits `text` as a complete document."""
    matcher = constraints.matcher(grammar)
    try:
        for token in engine.tokenize(text, add_special_tokens=False):
            matcher.consume(token)
    except ConstraintError:
        return False
    return matcher.accepting()


# a number where each kind of subschema puts one: a property, an array's items, an anyOf branch,
# a $defs entry, an additionalProperties schema, a typeless schema, `true`, and "any value"
PLACES = {
    "type": "object",
    "properties": {
        "n": {"type": "number"},
        "i": {"type": "integer"},
        "items": {"type": "array", "items": {"type": "number"}},
        "any_of": {"anyOf": [{"type": "string"}, {"type": "number"}]},
        "ref": {"$ref": "#/$defs/N"},
        "extra": {"type": "object", "additionalProperties": {"type": "number"}},
        "typeless": {"minimum": -1e15},
        "yes": True,
        "object": {"type": "object"},
        "nested": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/N"}]}},
    },
    "additionalProperties": False,
    "$defs": {"N": {"type": ["number", "null"]}},
}
DOCUMENTS = {  # as the property's value: where it is allowed to go
    "n": "{}",
    "i": "{}",
    "items": "[{}]",
    "any_of": "{}",
    "ref": "{}",
    "extra": '{{"k": {}}}',
    "typeless": "{}",
    "yes": "{}",
    "object": '{{"k": [{}]}}',
    "nested": "[{}]",
}
BAD_NUMBERS = ["1e5", "2E-3", "1234567890123456", "0.12345678901", "123456.123456789012", "9" * 40]
GOOD_NUMBERS = ["0", "-3", "12345.5", "0.1234567891", "999999999999999", "-99999999999999.9"]


def test_every_number_a_schema_admits_is_one_clients_hold(engine, constraints):
    grammar = constraints.json_schema(PLACES)
    for key, where in DOCUMENTS.items():
        for number in GOOD_NUMBERS:
            if key == "i" and "." in number:
                continue
            assert accepts(engine, constraints, grammar, f'{{"{key}": {where.format(number)}}}'), (key, number)
        for number in BAD_NUMBERS:
            assert not accepts(engine, constraints, grammar, f'{{"{key}": {where.format(number)}}}'), (key, number)
    obj = constraints.json_object()
    tool = constraints.tool_calls([{"type": "function", "function": {"name": "f", "parameters": PLACES}}])
    for number in GOOD_NUMBERS:
        assert accepts(engine, constraints, obj, f'{{"a": [{{"b": {number}}}]}}')
        assert accepts(
            engine, constraints, tool, f'<tool_call>\n{{"name": "f", "arguments": {{"n": {number}}}}}\n</tool_call>'
        )
    for number in BAD_NUMBERS:
        assert not accepts(engine, constraints, obj, f'{{"a": [{{"b": {number}}}]}}')
        assert not accepts(
            engine, constraints, tool, f'<tool_call>\n{{"name": "f", "arguments": {{"yes": {number}}}}}\n</tool_call>'
        )


def test_explicit_bounds_still_hold(engine, constraints):
    cases = [
        (
            {"type": "number", "minimum": -1.5, "maximum": 2},
            ["-1.5", "2", "0.25", "1.9999999999"],
            ["2.5", "-2", "-1.51", "1e0", "3"],
        ),
        ({"type": "integer", "minimum": 18, "maximum": 99}, ["18", "99", "42"], ["17", "100", "50.5"]),
        (
            {"type": "number", "minimum": 0, "maximum": 1e9},
            ["1000000000", "999999999.5", "0"],
            ["1000000000.5", "-1", "1e9"],
        ),
        (
            {"type": "integer", "minimum": 10**14, "maximum": 10**20},
            [str(INTEGER_MAX), str(10**14)],
            [str(INTEGER_MAX + 1), str(10**14 - 1)],
        ),
    ]
    for schema, good, bad in cases:
        grammar = constraints.json_schema(schema)
        for text in good:
            assert accepts(engine, constraints, grammar, text), (schema, text)
        for text in bad:
            assert not accepts(engine, constraints, grammar, text), (schema, text)
    for schema in ({"type": "number", "minimum": 1e20}, {"type": "integer", "maximum": -(10**16)}):
        with pytest.raises(GrammarError, match="15 digits"):
            constraints.json_schema(schema)


NUMBERS = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"], "additionalProperties": False}


def test_sampled_numbers_parse_to_values_clients_hold_on_16_seeds(engine, constraints):
    for grammar in (constraints.json_object(), constraints.json_schema(NUMBERS)):
        finished = 0
        for seed in range(16):
            text, finish = run(engine, constraints, grammar, seed, max_tokens=150)
            if finish != "length":
                finished += 1
                load_json(text)  # before the bound: 1789213e6850… (inf) or 40-digit integers
        assert finished >= 8


# -- the decoder's guard on a constrained tool-call answer -------------------------------------


def decode(engine, grammar, text: str, max_tokens: int = 500):
    """Feed `text`'s tokens to the decoder a constrained tool-call answer runs under."""
    decoder = Decoder(engine, SamplingParams(max_tokens=max_tokens), None, CallGuard(grammar.functions))
    deltas = []
    for token in engine.tokenize(text, add_special_tokens=False):
        deltas.append(decoder.feed(token, 0.0))
        if deltas[-1].finish_reason:
            break
    return deltas


def test_a_repeated_call_ends_the_answer_unreleased(engine, constraints):
    grammar = constraints.tool_calls(TOOLS)
    one = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": -2}}\n</tool_call>'
    two = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": -2}}\n</tool_call>'
    deltas = decode(engine, grammar, "\n".join([one, two, one, two]))
    assert deltas[-1].finish_reason == "stop"
    assert "".join(d.text for d in deltas) == one + "\n" + two + "\n"  # parallel calls to one function stay
    assert all(d.text in ("", one, two) or not d.text.strip() for d in deltas)  # a call only once it closed
    cut = decode(
        engine,
        grammar,
        one + "\n" + two[:20],
        max_tokens=len(engine.tokenize(one + "\n" + two[:20], add_special_tokens=False)),
    )
    assert cut[-1].finish_reason == "length" and "".join(d.text for d in cut) == one + "\n" + two[:20]


def test_a_constrained_call_that_does_not_validate_fails_the_answer(engine, constraints):
    # the grammar would never write it; the decoder checks what it releases all the same
    grammar = constraints.tool_calls(TOOLS)
    with pytest.raises(EngineError) as info:
        decode(engine, grammar, '<tool_call>\n{"name": "add", "arguments": {"a": 9, "b": 0}}\n</tool_call>')
    assert info.value.code == "constrained_output_invalid" and "maximum" in info.value.message
    assert functions(TOOLS) == {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


# -- tool calls ------------------------------------------------------------------------------


def calls_of(text: str) -> list[dict]:
    """The calls in `text`, which must be nothing but "\\n"-separated <tool_call> blocks."""
    blocks = BLOCK.findall(text)
    assert text == "\n".join(f"<tool_call>\n{b}\n</tool_call>" for b in blocks), text
    calls = [json.loads(b) for b in blocks]
    for call in calls:
        assert list(call) == ["name", "arguments"]
        jsonschema.validate(call["arguments"], PARAMETERS[call["name"]])
    return calls


def test_tool_calls_with_two_tools_on_20_seeds(engine, constraints):
    grammar = constraints.tool_calls(TOOLS)
    names = set()
    counts = []
    for seed in SEEDS:
        text, finish = run(engine, constraints, grammar, seed, max_tokens=300)
        if finish == "length":  # the random model kept calling: the complete calls must still validate
            text = text[: text.rfind("</tool_call>") + len("</tool_call>")]
        else:
            assert finish == "eos"  # after a call, "\n" and another call may follow: the model ends it
        calls = calls_of(text)
        names |= {c["name"] for c in calls}
        counts.append((finish, len(calls)))
    assert names == {"get_weather", "add"}
    assert sum(finish == "eos" for finish, _ in counts) >= 5  # 7 of 20 with these seeds
    assert any(finish == "eos" and n >= 2 for finish, n in counts)  # parallel calls, ended by the model


def test_named_tool_choice_calls_only_that_function(engine, constraints):
    grammar = constraints.tool_calls(TOOLS, name="add", parallel=False)
    for seed in SEEDS:
        text, finish = run(engine, constraints, grammar, seed)
        assert finish == "done"
        assert [c["name"] for c in calls_of(text)] == ["add"]
    grammar = constraints.tool_calls(TOOLS, name="get_weather")
    for seed in range(3):
        text, finish = run(engine, constraints, grammar, seed, max_tokens=300)
        if finish != "length":
            assert {c["name"] for c in calls_of(text)} == {"get_weather"}


def test_tool_call_tags_as_one_token_or_spelled_out(engine, constraints):
    tool_call = engine.tokenizer.convert_tokens_to_ids("<tool_call>")
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": -2}}\n</tool_call>'
    as_tokens = engine.tokenize(text, add_special_tokens=False)
    assert as_tokens[0] == tool_call  # how a Hermes/Qwen model writes it
    spelled = [
        t
        for piece in ("<", "tool_call>", text[len("<tool_call>") :])
        for t in engine.tokenize(piece, add_special_tokens=False)
    ]
    assert tool_call not in spelled  # how the demo model (which never emits the tag token) writes it
    grammar = constraints.tool_calls(TOOLS, parallel=False)
    for ids in (as_tokens, spelled):
        matcher = constraints.matcher(grammar)
        for token in ids:
            matcher.consume(token)
        assert matcher.done()


def test_a_function_without_parameters_takes_empty_arguments(engine, constraints):
    tools = [{"type": "function", "function": {"name": "now"}}]
    text, finish = run(engine, constraints, constraints.tool_calls(tools, parallel=False), 0)
    assert finish == "done"
    assert text == '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'


@pytest.mark.parametrize(
    "tools, name",
    [
        ([], None),
        ([{"type": "function", "function": {"description": "no name"}}], None),
        ([{"type": "code_interpreter"}], None),
        (TOOLS, "missing"),
        (TOOLS + TOOLS[:1], None),
    ],
)
def test_bad_tool_lists_are_refused(constraints, tools, name):
    with pytest.raises(GrammarError):
        constraints.tool_calls(tools, name=name)


# -- the supported JSON Schema subset compiles (its refusals: tests/unit/test_schema_subset.py) --


def test_the_supported_subset_is_accepted_and_compiles(constraints):
    schema = {
        "title": "everything",
        "description": "d",
        "default": {},
        "examples": [{}],
        "type": "object",
        "properties": {
            "s": {"type": "string", "minLength": 1, "maxLength": 5, "pattern": "^[a-z]+$"},
            "n": {"type": ["number", "null"], "minimum": -1.5, "maximum": 2},
            "i": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"type": "boolean"},
            "z": {"type": "null"},
            "a": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 3},
            "e": {"enum": ["x", 1, None]},
            "c": {"const": "k"},
            "u": {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}]},
            "o": {"type": "object", "additionalProperties": {"type": "boolean"}},
            "t": True,
        },
        "required": ["s", "i"],
        "additionalProperties": False,
        "$defs": {"item": {"type": "string", "maxLength": 4}},
    }
    check_schema(schema)
    constraints.json_schema(schema)
    check_schema(SCHEMA)
    for tool in TOOLS:
        check_schema(tool["function"]["parameters"])


ANNOTATIONS = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "$comment": "from zod",
    "title": "T",
    "description": "D",
    "default": None,
    "examples": [1],
    "deprecated": True,
    "readOnly": False,
    "writeOnly": False,
    "x-order": 1,
    "x-guidance": {"whitespace_flexible": True},
}


def test_annotations_are_accepted_wherever_a_schema_is_and_change_nothing(engine, constraints):
    # before: each was 400 response_format_unsupported ("unsupported keywords: /$schema", …)
    bare = {
        "type": "object",
        "properties": {"a": {"type": "string", "maxLength": 4}, "b": {"$ref": "#/$defs/B"}},
        "required": ["a", "b"],
        "additionalProperties": False,
        "$defs": {"B": {"enum": [1, 2]}},
    }
    annotated = json.loads(json.dumps(bare))
    for node in (annotated, annotated["properties"]["a"], annotated["$defs"]["B"]):
        node.update(ANNOTATIONS)
    annotated["$id"] = "https://example.com/weather.json"
    check_schema(annotated)
    tools = [{"type": "function", "function": {"name": "f", "parameters": annotated}}]
    bare_tools = [{"type": "function", "function": {"name": "f", "parameters": bare}}]
    for seed in range(3):  # the same documents and calls, seed for seed
        assert run(engine, constraints, constraints.json_schema(annotated), seed) == run(
            engine, constraints, constraints.json_schema(bare), seed
        )
        assert run(engine, constraints, constraints.tool_calls(tools), seed) == run(
            engine, constraints, constraints.tool_calls(bare_tools), seed
        )


def test_each_format_llguidance_writes_is_enforced_on_5_seeds(engine, constraints):
    """The random demo model writes each format's strings: what jsonschema's format checker
    (every format it checks here) accepts. A format outside FORMATS is refused (below)."""
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for fmt in FORMATS:
        schema = {"type": "string", "format": fmt, "maxLength": 48}
        check_schema(schema)
        for seed in range(5):
            text, finish = run(engine, constraints, constraints.json_schema(schema), seed, max_tokens=80)
            assert finish == "done", (fmt, seed, text)
            if fmt in checker.checkers:
                checker.check(json.loads(text), fmt)
            elif fmt == "duration":
                assert re.fullmatch(r'"P(\d+[YMWD]|T)[\dYMDTHS]*"', text), text
