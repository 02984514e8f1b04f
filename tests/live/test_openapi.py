"""The live server against its own OpenAPI document (greenroom/http/core/openapi.py), both ways.

schemathesis generates requests from the document (its examples, a deterministic coverage
pass over every keyword's boundaries, valid and invalid — but on the routes whose body is a
whole generation request, BODIES_OF_A_GENERATION, where that pass is thousands of requests —
then random cases per operation, more of them on those routes) and checks every answer: no 5xx; the status, content type, headers and body (each SSE event
and NDJSON line too) as documented; a request the document allows is not refused with 400
(positive_data_acceptance) and one it forbids is refused (negative_data_rejection). Response
objects are closed, so a field the server sends and the document does not name fails too.
Derandomized with no example database, so a run is repeatable; about a minute and a half on
2 cores, plus the server's start. Every request goes to the fuzzer's own server on 127.0.0.1,
whose Hugging Face Hub is an empty one on loopback (tests/fake_hub.py)."""

from __future__ import annotations

import hashlib
import json
import re
import zlib

import httpx
import jsonschema_rs
import pytest
import schemathesis
from conftest import MODEL, Server
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from greenroom.engines.capabilities import capabilities_of
from greenroom.errors import TABLE
from greenroom.http.anthropic import messages_api
from greenroom.http.core import routes
from greenroom.http.core.contracts import INT64, Shape
from greenroom.http.core.openapi import document, status_on
from greenroom.http.core.routes import Surface
from greenroom.http.ollama import keep_alive, ollama_api, ollama_embed, ollama_models
from greenroom.http.openai import openai_api, openai_params, responses_api, tokenize_api

PATHS: dict[str, set[str]] = {}
for _route in routes.TABLE:
    PATHS.setdefault(_route.path, set()).add(_route.method.lower())

# What the server answers from what it holds, not from the request's shape: which SAEs are
# attached and how wide they are, what a model's files say (its window, its chat template), what
# an SAE source holds. A schema promises which requests are well formed, not what the server
# holds (schemathesis treats credentials so): a 400 with one of these codes is no disagreement.
STATE_CODES = frozenset(
    {
        "sae_not_attached",
        "invalid_feature_index",
        "invalid_sae",
        "steering_unsupported",
        "context_length_exceeded",
        "no_chat_template",
        "blob_not_found",  # /api/create's files: a blob uploaded (or not), a GGUF file (or not)
        "invalid_blob",
    }
)
STATE_PARAMS = {  # route: refused parameters that name what the server may or may not hold as asked
    "POST /api/saes/attach": {"sae", "sae_id"},  # a source that does not load, a block or a name taken
    "POST /api/circuits/import": {"slice_fallback"},  # a cluster of the model
    "PUT /api/monitoring": {"sae_id"},  # left out while several SAEs are attached
    "POST /v1/chat/completions": {"return_sae_activations.sae_id"},
    "POST /v1/completions": {"return_sae_activations.sae_id"},
    "POST /v1/messages": {"return_sae_activations.sae_id"},
    "POST /v1/responses": {"return_sae_activations.sae_id"},
}


def _error(response) -> tuple[str | None, str | None]:
    """The refusal's code and param, in either envelope (Ollama's has no param)."""
    try:
        body = response.json()
    except ValueError:
        return None, None
    if not isinstance(body, dict):
        return None, None
    error = body.get("error")
    return (error.get("code"), error.get("param")) if isinstance(error, dict) else (body.get("code"), None)


# What a JSON schema sent as data means is the constraint library's to say (llguidance compiles it):
# one in the subset may still be unsatisfiable (`false`, an enum outside its type).
UNCOMPILED = "the constraint cannot be compiled"


def _message(response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    return (error.get("message") if isinstance(error, dict) else error) or ""


# Cases generated as valid that the document does not allow: schemathesis's generator approximates
# `not` (and so if/then), and the repairs below must not make a body invalid. No positive verdict.
OUTSIDE_THE_DOCUMENT: set[int] = set()


@schemathesis.check
def positive_data_accepted_by_shape(ctx, response, case):
    """positive_data_acceptance, less the refusals of what the server holds (STATE_CODES,
    STATE_PARAMS) and of what a sent JSON schema means (UNCOMPILED)."""
    if id(case) in OUTSIDE_THE_DOCUMENT:
        return None
    code, param = _error(response)
    if response.status_code == 400 and (
        code in STATE_CODES
        or param in STATE_PARAMS.get(f"{case.method.upper()} {case.operation.path}", ())
        or (code == "response_format_unsupported" and _message(response).startswith(UNCOMPILED))
    ):
        return None
    return positive_data_acceptance(ctx, response, case)


# Negative cases whose body the document allows after all: schemathesis mutates one branch of an
# `anyOf` (a function's description, JSONData: "was array, became number") and the value it
# writes can match another branch. No negative verdict on a request the document accepts.
INSIDE_THE_DOCUMENT: set[int] = set()


@schemathesis.check
def negative_data_rejected_by_document(ctx, response, case):
    """negative_data_rejection, less the cases whose only negative component is a body that
    validates against the document (Draft 2020-12)."""
    if id(case) in INSIDE_THE_DOCUMENT:
        return None
    return negative_data_rejection(ctx, response, case)


@schemathesis.deserializer("application/x-ndjson")
def _ndjson(_ctx, response):
    """An NDJSON stream as the array of its lines (how the document describes it)."""
    return [json.loads(line) for line in response.content.splitlines() if line.strip()]


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    positive_data_accepted_by_shape,
    negative_data_rejected_by_document,
]

# Bodies are bounded: the document lets max_tokens reach 2**31 - 1, n 16, and a request
# carry 16 prompts or conversations (the server's limits), and the server decodes what it
# is asked for, so one request could run for minutes. How long a generation is is not what
# this test is about: a value the server would accept is lowered to the cap; values past
# its limits (and non-integers) are left as they are, to exercise the refusals.
BOUNDS = {  # field: (cap, the largest value the server accepts)
    "max_tokens": (64, 2**31 - 1),
    "max_completion_tokens": (64, 2**31 - 1),
    "n": (2, 16),
}
OPTION_BOUNDS = {"num_predict": (16, 2**31 - 1)}  # Ollama's options
# A generation with no max_tokens runs to the server default (512 tokens; a constrained
# answer to the end of the context window; Ollama's 128): lowered to the cap too, by sending it.
GENERATING = {"/v1/chat/completions", "/v1/completions", "/v1/needle/extract", "/v1/needle/complete", "/v1/messages"}
# the Responses API's max_tokens
RESPONSE_BOUNDS = {"max_output_tokens": BOUNDS["max_tokens"]}
OLLAMA_GENERATING = {"/api/generate", "/api/chat"}
LIST_BOUNDS = {  # field: (cap, the longest list the server accepts) for a list of prompts or conversations
    "prompt": (2, 16),
    "extra_messages": (1, 15),
}
# the served model, as its files say: past these a request is refused
VOCABULARY = 1024  # its token ids (prompt and input token arrays, allowed_token_ids)

# Fields the served model's engine refuses unless they carry their "no change" value,
# read from the request declarations' ledger rules: dropped from the bodies aimed at the served model.
ENGINE = capabilities_of("transformers")  # the engine of the served model (configs/default.toml)


def _refused(shape: Shape) -> frozenset[str]:
    return frozenset(
        name
        for name, f in shape.fields.items()
        if f.rule.refuse and not (f.rule.needs and getattr(ENGINE, f.rule.needs))
    )


REFUSED_FIELDS = {
    "/v1/chat/completions": _refused(openai_api.CHAT),
    "/v1/completions": _refused(openai_api.COMPLETION),
    "/v1/embeddings": _refused(openai_params.EMBEDDING),
    "/api/generate": _refused(ollama_api.GENERATE_REQUEST),
    "/api/chat": _refused(ollama_api.CHAT_REQUEST),
    "/api/embed": _refused(ollama_embed.EMBED_REQUEST),
    "/api/embeddings": _refused(ollama_embed.EMBEDDINGS_REQUEST),
    "/api/show": _refused(ollama_api.SHOW_REQUEST),
    "/v1/responses": _refused(responses_api.REQUEST),
    "/v1/messages": _refused(messages_api.REQUEST),
    "/v1/messages/count_tokens": _refused(messages_api.COUNT_REQUEST),
    "/tokenize": _refused(tokenize_api.TOKENIZE),
}


def _capped(mapping: dict, bounds: dict) -> None:
    for name, (cap, limit) in bounds.items():
        value = mapping.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and cap < value <= limit:
            mapping[name] = cap


def _scoring(body: dict) -> bool:
    return body.get("logprobs") not in (None, False) or any(
        body.get(f) is not None for f in ("allowed_token_ids", "top_logprobs")
    )


def _bounded(path, body):
    if isinstance(body, dict):
        if (
            path in GENERATING
            and body.get("max_tokens") is None
            and body.get("max_completion_tokens") is None
            and not _scoring(body)
        ):  # a scoring request generates nothing
            body["max_tokens"] = BOUNDS["max_tokens"][0]
        _capped(body, BOUNDS)
        if path == "/v1/responses":
            body.setdefault("max_output_tokens", RESPONSE_BOUNDS["max_output_tokens"][0])
            _capped(body, RESPONSE_BOUNDS)
        for name, (cap, limit) in LIST_BOUNDS.items():
            value = body.get(name)
            if (
                isinstance(value, list) and cap < len(value) <= limit and all(isinstance(v, (str, list)) for v in value)
            ):  # not a token array
                body[name] = value[:cap]
        if path in OLLAMA_GENERATING:
            if body.get("options") is None:
                body["options"] = {}
            options = body["options"]
            if isinstance(options, dict):
                length = options.get("num_predict")
                if length is None or isinstance(length, int) and length < 0:  # -1, -2: the whole window
                    options["num_predict"] = OPTION_BOUNDS["num_predict"][0]
                _capped(options, OPTION_BOUNDS)
    return body


def _serve(body: dict, path: str) -> None:
    """The body names the served model, without the fields its engine refuses."""
    for field in REFUSED_FIELDS.get(path, frozenset()):
        body.pop(field, None)
    body["model"] = MODEL


def _aimed(case) -> None:
    """A random model name is always a 404: in about half the bodies (all the invalid ones
    whose fault is elsewhere), name the served model, so that validation and generation
    themselves (and their 200 answers, streamed or not) are exercised."""
    body = case.body
    if not (isinstance(body, dict) and "model" in body and case.meta is not None):
        return
    mutations = getattr(case.meta.phase.data, "mutations", ())
    if case.meta.generation.mode.is_negative:
        if mutations and all(m.path and m.path[0] not in ("model", "name") for m in mutations):
            body["model"] = MODEL
    elif zlib.crc32(json.dumps(body, sort_keys=True, default=str).encode()) % 2:
        _serve(body, case.path)


def _what_json_schema_cannot_say(case) -> None:
    """A valid request as the document describes it, made valid for what JSON Schema cannot
    describe (the document says each in prose): one field against another (a value equal to,
    below, or named in another), uniqueness by a member's field, a string holding JSON, a
    header changing what a body may hold, and what a JSON schema sent as data means."""
    if case.headers and str(case.headers.get("X-miLLM-Strict")).lower() in ("true", "1"):
        case.headers["X-miLLM-Strict"] = "false"  # strict mode refuses the fields the ledger would report
    case.body = body = _integral(case.body)
    if not isinstance(body, dict):
        return
    for field in ("prompt", "input", "allowed_token_ids", "tokens"):
        if field in body:
            body[field] = _in_vocabulary(body[field])
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        body["max_completion_tokens"] = body["max_tokens"]  # sent together: the same value
    _sound_tools(body)
    _answered(body)
    read = body.get("return_sae_activations")
    if isinstance(read, dict) and isinstance(read.get("positions"), dict):
        positions = read["positions"]  # half-open: start < end
        positions["start"], positions["end"] = sorted((positions["start"], positions["end"]))
        positions["end"] += positions["start"] == positions["end"]
    for doc in (body, *(body.get("layers") if isinstance(body.get("layers"), list) else ())):  # clusters, circuits
        if isinstance(doc, dict):
            if isinstance(doc.get("intensity_range"), list) and all(
                isinstance(v, (int, float)) for v in doc["intensity_range"]
            ):
                doc["intensity_range"].sort()  # low ≤ high
            _unique(doc, "members", "feature")
    _unique(body, "layers", "layer")
    profile = body.get("profile")
    if isinstance(profile, dict) and isinstance(profile.get("strengths"), dict):  # strengths of the listed SAEs
        listed = {sae.get("sae_id") for sae in body.get("saes") or ()}
        profile["strengths"] = {k: v for k, v in profile["strengths"].items() if k in listed}
    if isinstance(body.get("tools"), str):  # Needle's tools as JSON text
        try:
            json.loads(body["tools"])
        except ValueError:
            body["tools"] = "[]"
    alive = body.get("keep_alive")
    if isinstance(alive, str) and _duration_s(alive) > keep_alive.MAX_SECONDS:
        body["keep_alive"] = "5m"  # a Go duration's parts add up to at most ~292 years (said in prose)
    for schema in _sent_schemas(body):
        _sound_schema(schema, schema)


_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration_s(text: str) -> float:
    """What the parts of a Go duration the document's pattern admits add up to, in seconds (a bare
    number, which the pattern admits alone, is seconds)."""
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)?", text)
    return sum(float(n) * _GO_UNITS[unit or "s"] for n, unit in parts)


def _integral(value):
    """JSON Schema's integer is a number with no fraction (1.0 is one); greenroom's /v1 parsers
    read the JSON text's type (1.0 is not an integer there, as in Go's decoder): written as ints."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def _in_vocabulary(value):
    """Token ids (in a token array or an array of them) within the served model's vocabulary."""
    if isinstance(value, list):
        return [
            _in_vocabulary(v)
            if isinstance(v, list)
            else v % VOCABULARY
            if isinstance(v, int) and not isinstance(v, bool)
            else v
            for v in value
        ]
    return value


def _unique(document: dict, field: str, key: str) -> None:
    members = document.get(field)
    if isinstance(members, list):
        seen = set()
        document[field] = [
            m for m in members if not (isinstance(m, dict) and (m.get(key) in seen or seen.add(m.get(key))))
        ] or members[:1]


def _sound_tools(body: dict) -> None:
    """Tool names unique, and a named tool_choice or function_call one of them (either names a
    tool of `tools`, or of the deprecated `functions`: the server reads the one choice against
    whichever list came)."""
    for field in ("tools", "functions"):
        tools = body.get(field)
        if not isinstance(tools, list):
            continue
        functions = [t.get("function", t) if isinstance(t, dict) and field == "tools" else t for t in tools]
        for i, fn in enumerate(functions):
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                fn["name"] = f"{fn['name'][:60]}_{i}"
        names = [fn["name"] for fn in functions if isinstance(fn, dict) and isinstance(fn.get("name"), str)]
        for choice in ("tool_choice", "function_call"):
            named = body.get(choice)
            if isinstance(named, dict) and names:
                target = named.get("function") if isinstance(named.get("function"), dict) else named
                target["name"] = names[0]


def _answered(body: dict) -> None:
    """Each tool result names a call made before it in the conversation (chat's tool_call_id,
    Anthropic's tool_use_id, Responses' call_id): one that does not is left without an id (chat)
    or becomes text."""
    calls: set = set()
    items = body.get("messages") if isinstance(body.get("messages"), list) else body.get("input")
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if not isinstance(item, dict):
            continue
        calls |= {c.get("id") for c in item.get("tool_calls") or () if isinstance(c, dict)}
        if item.get("type") == "function_call":
            calls.add(item.get("call_id"))
        if item.get("type") == "function_call_output" and item.get("call_id") not in calls:
            items[i] = {"role": "user", "content": "x"}
        if item.get("role") == "tool" and item.get("tool_call_id") not in calls:
            item.pop("tool_call_id", None)
        for j, block in enumerate(item.get("content") if isinstance(item.get("content"), list) else ()):
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.add(block.get("id"))
            if isinstance(block, dict) and block.get("type") == "tool_result" and block.get("tool_use_id") not in calls:
                item["content"][j] = {"type": "text", "text": "x"}


def _sent_schemas(body: dict) -> list:
    """The JSON schemas a body sends as data."""
    out = [body.get("schema"), body.get("format")]
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict):
        out.append(fmt["json_schema"].get("schema"))
    for config in (body.get("text"), body.get("output_config")):  # the Responses and Messages APIs' formats
        if isinstance(config, dict) and isinstance(config.get("format"), dict):
            out.append(config["format"].get("schema"))
    for tool in body.get("tools") if isinstance(body.get("tools"), list) else ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict):
            out += [fn.get("parameters"), fn.get("input_schema")]
    return [s for s in out if isinstance(s, dict)]


def _sound_schema(node, root: dict) -> None:
    """A $ref names an entry of the root's $defs; each lower bound is at most its upper one."""
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.removeprefix("#/$defs/") not in (root.get("$defs") or {}):
        del node["$ref"]
    for low, high in (("minimum", "maximum"), ("minItems", "maxItems"), ("minLength", "maxLength")):
        if (
            isinstance(node.get(low), (int, float))
            and isinstance(node.get(high), (int, float))
            and node[low] > node[high]
        ):
            node[low], node[high] = node[high], node[low]
    for key in ("properties", "$defs"):
        for sub in (node.get(key) or {}).values() if isinstance(node.get(key), dict) else ():
            _sound_schema(sub, root)
    for key in ("items", "additionalProperties"):
        _sound_schema(node.get(key), root)
    for sub in node.get("anyOf") if isinstance(node.get("anyOf"), list) else ():
        _sound_schema(sub, root)


# the fuzzer's own server: generated requests attach SAEs, write steering state and profiles,
# copy, create and delete models, pull from the Hub — state the session's servers must not inherit.
# The document comes from the module, not from GET /openapi.json: schemathesis parametrizes
# at collection time, before the `server` fixture exists, and its lazy loader
# (schemathesis.pytest.from_fixture, 4.32) fails on pytest 9 (it sets Function._nodeid).
# test_openapi_json_serves_the_document checks that the served document is this one.
# the monitoring stream lasts until the client goes: no whole body to check (test_monitoring.py reads it)
_FUZZED = schemathesis.openapi.from_dict(document()).exclude(path="/api/monitoring/stream")
# an upload's body is a file's bytes, named by their digest: fuzzed by a test of its own (its config shared)
schema = _FUZZED.exclude(operation_id="ollamaCreateBlob")
uploads = _FUZZED.include(operation_id="ollamaCreateBlob")
schema.config.update(request_timeout=60)
schema.config.generation.update(max_examples=15)
# The coverage phase spells every boundary of every field, valid and not: for a body that is a
# whole generation request that is 8,000–13,000 requests (chat completions, /api/generate), about
# two minutes each and a quarter of an hour for these routes — most of the suite's budget. They are
# fuzzed by the examples and fuzzing phases (more cases each: FUZZED_EXAMPLES), half of them
# negative; their refusals come from the same parsers as the other routes', whose boundaries are
# all sent.
BODIES_OF_A_GENERATION = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/needle/extract",
    "/v1/needle/complete",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/api/generate",
    "/api/chat",
)
FUZZED_EXAMPLES = 50
schema.config.operations = schemathesis.config.OperationsConfig(
    operations=[
        schemathesis.config.OperationConfig.from_dict(
            {
                "include-path": list(BODIES_OF_A_GENERATION),
                "phases": {"coverage": {"enabled": False}},
                "generation": {"max-examples": FUZZED_EXAMPLES},
            }
        )
    ]
)
schema.config.output.sanitization.update(enabled=False)  # it masks every field named *token*
# Ollama's embedding limits refuse with 413 (the spec's table): a refusal, as a 400 is
_rejection = schema.config.checks.negative_data_rejection
_rejection.expected_statuses = [*_rejection.expected_statuses, "413"]


_DOCUMENT = document()
_BODIES = {  # jsonschema_rs: python-jsonschema took a quarter of the fuzz's time
    ref: jsonschema_rs.Draft202012Validator(
        {"$ref": ref, "components": _DOCUMENT["components"]}, validate_formats=False
    )
    for ref in {f"#/components/schemas/{r.request}" for r in routes.TABLE if r.request}
}


def _valid(validator, body) -> bool:
    """Whether a generated body is a JSON value the document's schema accepts (a missing body,
    schemathesis's NotSet, is none), its numbers read as greenroom reads them (`_as_read`)."""
    try:
        return validator.is_valid(_as_read(body))
    except ValueError:
        return False


def _as_read(value):
    """`value` with each whole-valued float past 64 bits (1e300) as a fraction: JSON Schema's
    integer is any number without one, so the document's "integers fit in 64 bits" (JSONData)
    bars it, but greenroom reads the JSON text's type, and carries a float as a float."""
    if isinstance(value, float) and value.is_integer() and not INT64[0] <= value <= INT64[1]:
        return 0.5
    if isinstance(value, list):
        return [_as_read(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_read(v) for k, v in value.items()}
    return value


@schema.hook("before_generate_path_parameters")
def _served_model_id_often(context, strategy):
    from hypothesis import strategies as st

    if context.operation.path != "/v1/models/{id}":  # a profile's name is not a model's id
        return strategy
    return st.one_of(st.just({"id": MODEL}), strategy)


@pytest.fixture(scope="module")
def server(tmp_path_factory, cache):
    from fake_hub import FakeHub

    tmp = tmp_path_factory.mktemp("openapi")
    with FakeHub({}) as hub:
        srv = Server(tmp, cache, extra_env={"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf-home")})
        yield srv
        srv.stop()


@schema.parametrize()
@settings(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
def test_server_conforms_to_its_openapi_document(case, server):
    _aimed(case)
    _bounded(case.path, case.body)
    OUTSIDE_THE_DOCUMENT.clear()
    INSIDE_THE_DOCUMENT.clear()
    request = case.operation.definition.raw.get("requestBody")
    body = None if request is None else _BODIES[request["content"]["application/json"]["schema"]["$ref"]]
    if case.meta is not None and case.meta.generation.mode.is_positive:
        _what_json_schema_cannot_say(case)
        _bounded(case.path, case.body)  # again: max_tokens 11230.0 was left as it was, then written 11230
        if body is not None and not _valid(body, case.body):
            OUTSIDE_THE_DOCUMENT.add(id(case))
    elif (
        case.meta is not None
        and body is not None
        and _valid(body, case.body)
        and all(info.mode.is_positive for where, info in case.meta.components.items() if where != "body")
    ):
        INSIDE_THE_DOCUMENT.add(id(case))
    case.call_and_validate(base_url=server.url, checks=CHECKS)


@uploads.parametrize()
@settings(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
def test_an_upload_conforms_to_the_document(case, server):
    """POST /api/blobs/{digest}: a valid upload is named by its bytes' sha256 (what the document
    says in prose); a negative case keeps the digest it was drawn with."""
    if case.meta is not None and case.meta.generation.mode.is_positive:
        sent = getattr(case.body, "data", case.body)  # schemathesis's Binary holds the bytes it sends
        sent = sent if isinstance(sent, bytes) else sent.encode() if isinstance(sent, str) else b""
        case.path_parameters["digest"] = "sha256:" + hashlib.sha256(sent).hexdigest()
    case.call_and_validate(base_url=server.url, checks=CHECKS)


def test_openapi_json_serves_the_document(server):
    response = httpx.get(server.url + "/openapi.json", timeout=10)
    assert response.status_code == 200
    served = response.json()
    assert served["openapi"].startswith("3.1")
    assert {path: set(ops) for path, ops in served["paths"].items()} == PATHS
    assert served == document()


def test_the_index_lists_the_route_table(server):
    index = httpx.get(server.url + "/", timeout=10).json()["endpoints"]
    assert [(e["method"], e["path"], e["description"]) for e in index] == [
        (r.method, r.path, r.description) for r in routes.TABLE
    ]


def test_document_is_valid_openapi_3_1_and_lists_every_route():
    schemathesis.openapi.from_dict(document()).validate()  # against the OpenAPI 3.1 meta-schema
    assert {path: set(ops) for path, ops in document()["paths"].items()} == PATHS


def _resolve(doc: dict, node: dict) -> dict:
    while "$ref" in node:
        _, _, kind, name = node["$ref"].split("/")
        node = doc["components"][kind][name]
    return node


def test_every_error_code_is_allowed_on_every_route():
    """Each code of the error table, under its status on the route's surface, in every operation's
    error response, in the envelope of that surface (the Ollama surface's own codes on its routes
    only)."""
    doc = document()
    for route in routes.TABLE:
        operation = doc["paths"][route.path][route.method.lower()]
        for code, kind in TABLE.items():
            if kind.ollama_only and route.surface is not Surface.OLLAMA:
                continue
            response = _resolve(doc, operation["responses"][str(status_on(code, route.surface))])
            envelope = _resolve(doc, response["content"]["application/json"]["schema"])
            pinned = (
                envelope["properties"]["code"]
                if route.surface is Surface.OLLAMA
                else envelope["properties"]["error"]["properties"]["code"]
            )
            assert code in pinned["enum"], (route.endpoint, code)


@pytest.mark.parametrize(
    "path,shape",
    [
        ("/v1/chat/completions", openai_api.CHAT),
        ("/v1/completions", openai_api.COMPLETION),
        ("/v1/embeddings", openai_params.EMBEDDING),
        ("/api/generate", ollama_api.GENERATE_REQUEST),
        ("/api/chat", ollama_api.CHAT_REQUEST),
        ("/api/show", ollama_api.SHOW_REQUEST),
        ("/api/embed", ollama_embed.EMBED_REQUEST),
        ("/api/embeddings", ollama_embed.EMBEDDINGS_REQUEST),
        ("/api/pull", ollama_models.PULL_REQUEST),
        ("/api/delete", ollama_models.DELETE_REQUEST),
        ("/api/copy", ollama_models.COPY_REQUEST),
        ("/api/create", ollama_models.CREATE_REQUEST),
        ("/v1/responses", responses_api.REQUEST),
        ("/v1/messages", messages_api.REQUEST),
        ("/v1/messages/count_tokens", messages_api.COUNT_REQUEST),
        ("/tokenize", tokenize_api.TOKENIZE),
        ("/detokenize", tokenize_api.DETOKENIZE),
    ],
)
def test_every_field_the_ledger_knows_is_documented(path, shape):
    doc = document()
    operation = next(iter(doc["paths"][path].values()))
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert set(_resolve(doc, body)["properties"]) == set(shape.fields)
